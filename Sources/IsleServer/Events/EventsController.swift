import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery

/// An app's events for its backend (docs/events.md): `GET /v1/events` (paged, long poll) and the
/// webhooks that receive them (`/v1/webhooks`). Backend key.
struct EventsController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any EventRepository & APIKeyRepository & AuditRepository
    /// Webhook endpoints per app, at most.
    static let maximumWebhooks = 10

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.get("events", use: events)
        v1.post("webhooks", use: createWebhook)
        v1.get("webhooks", use: listWebhooks)
        v1.get("webhooks/:webhook", use: showWebhook)
        v1.delete("webhooks/:webhook", use: deleteWebhook)
    }

    /// `GET /v1/events?after=<cursor>&limit=<n>&wait=<seconds>`: the app's events after the cursor
    /// (from the oldest kept without one; `after=latest` starts from now), oldest first; with
    /// `wait`, the answer waits up to that many seconds for the first event.
    @Sendable func events(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let query = request.uri.queryParameters
        var after: Int64 = 0
        if let text = query["after"].map(String.init) {
            if text == "latest" {
                after = try await store.lastEventSeq(bundleID: caller.bundleID)
            } else {
                guard let n = Int64(text), n >= 0 else { throw APIError.invalid("after", "after must be a cursor from an earlier answer's next (a whole number), or latest") }
                after = n
            }
        }
        let limit = try Limits.pageSize(request, "limit")
        var wait = 0.0
        if let text = query["wait"] {
            guard let n = Double(String(text)), n.isFinite, (0...30).contains(n) else { throw APIError.invalid("wait", "wait must be a number of seconds from 0 to 30") }
            wait = n
        }
        let deadline = ContinuousClock.now + .milliseconds(Int64(min(wait, services.configuration.webhooks.maximumPollWait) * 1000))
        while true {
            let generation = services.events.generation
            let page = try await store.events(bundleID: caller.bundleID, after: after, limit: limit)
            // A key revoked while this request waited gets nothing written after its revocation.
            // (Read afresh when the answer would carry events; else from the one-second cache.)
            guard try await services.apiKeys.isCurrent(id: caller.keyID, bundleID: caller.bundleID, fresh: !page.isEmpty && wait > 0) else {
                throw APIError(.unauthorized, "unauthenticated", "the API key is unknown or revoked")
            }
            let left = deadline - ContinuousClock.now
            if !page.isEmpty || left <= .zero || Task.isCancelled {
                let next = page.last?.seq ?? after
                return JSONResponse.make(["events": .array(page.map(\.json)), "next": .string(String(next))])
            }
            // Woken by this process's events at once; another instance's are found within a second.
            await services.events.wait(since: generation, timeout: min(left, .seconds(1)))
        }
    }

    /// `POST /v1/webhooks` `{"url": "https://…"}`: a new endpoint, receiving the events committed
    /// from now on. Its signing secret is in this answer only.
    @Sendable func createWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let body = try await Body.read(request)
        try body.only(WireContract.webhookCreation)
        let (hook, secret) = try await create(bundleID: caller.bundleID, url: try body.bounded("url", 2000, required: true) ?? "", keyID: caller.keyID)
        // API-made webhooks are in the audit log too, under the key that made them.
        try await store.appendAudit(AuditEntry(bundleID: caller.bundleID, keyID: caller.keyID, action: "webhook.create", target: hook.id, detail: hook.url, at: services.clock.now))
        var view = try await Self.view(hook, store: store).objectValue ?? [:]
        view["secret"] = .string(secret)
        return JSONResponse.make(.object(view), status: .created)
    }

    /// A new webhook of the app and its secret (the API's and the console's one way to make one).
    /// `keyID`: the API key making it (nil: the console), whose revocation stops it.
    func create(bundleID: String, url text: String, keyID: String?) async throws -> (WebhookRecord, String) {
        let url = try Self.endpoint(text)
        // Checked now, so the backend hears at once; and again before every round of sending.
        // A name that does not resolve yet is taken (it is checked again before each round).
        if case .failure(let refusal) = await WebhookTarget.check(url: url, settings: services.configuration.webhooks), refusal.code != "webhookHostUnresolvable" {
            throw APIError(.unprocessableContent, refusal.code, refusal.message, field: "url")
        }
        let existing = try await store.webhooks(bundleID: bundleID)
        guard existing.count < Self.maximumWebhooks else {
            throw APIError(.conflict, "tooManyWebhooks", "an app has at most \(Self.maximumWebhooks) webhooks; delete one first")
        }
        let secret = "whsec_" + Self.random(32)
        let stored = services.configuration.masterKey?.seal(secret, bundleID: bundleID) ?? secret
        let hook = WebhookRecord(id: "wh_" + Self.random(12), bundleID: bundleID, url: url, secret: stored, createdAt: services.clock.now,
                                 cursor: try await store.lastEventSeq(bundleID: bundleID), keyID: keyID)
        try await store.insertWebhook(hook)
        services.events.ring()
        return (hook, secret)
    }

    @Sendable func listWebhooks(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        var views: [JSONValue] = []
        for hook in try await store.webhooks(bundleID: caller.bundleID) { views.append(try await Self.view(hook, store: store)) }
        return JSONResponse.make(["webhooks": .array(views)])
    }

    @Sendable func showWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let hook = try await own(context)
        return JSONResponse.make(try await Self.view(hook, store: store))
    }

    @Sendable func deleteWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let hook = try await own(context)
        _ = try await store.deleteWebhook(id: hook.id)
        return JSONResponse.make(["id": .string(hook.id), "deleted": .bool(true)])
    }

    func own(_ context: IsleRequestContext) async throws -> WebhookRecord {
        let caller = try context.caller(.backend)
        let id = try context.parameters.decoded("webhook")
        guard let hook = try await store.webhook(id: id), hook.bundleID == caller.bundleID else { throw APIError.notFound("webhook \(id)") }
        return hook
    }

    /// An endpoint Isle can POST to: http or https, a host, no fragment.
    static func endpoint(_ text: String) throws -> String {
        guard text.utf8.count <= 2000 else { throw APIError.invalid("url", "url must be at most 2000 bytes") }
        guard let url = URLComponents(string: text), let scheme = url.scheme?.lowercased(), scheme == "https" || scheme == "http",
              let host = url.host, !host.isEmpty, url.fragment == nil, url.user == nil, url.password == nil,
              !text.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7f }) else {
            throw APIError.invalid("url", "url must be an absolute http:// or https:// URL with a host, no user or password, no fragment and no control characters, e.g. https://backend.example.com/isle-events")
        }
        return text
    }

    static func random(_ bytes: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        return Hex.encode((0..<bytes).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// An endpoint as the API shows it: where it stands, and its failures (never its secret).
    static func view(_ w: WebhookRecord, store: any EventRepository & APIKeyRepository) async throws -> JSONValue {
        let waiting = try await store.events(bundleID: w.bundleID, after: w.cursor, limit: 1001).count
        var stopped = false
        if let id = w.keyID {
            let key = try await store.apiKeys(bundleID: w.bundleID).first { $0.id == id }
            stopped = key == nil || key?.revokedAt != nil
        }
        var o: JSONObject = [
            "id": .string(w.id), "url": .string(w.url), "createdAt": .int(Int64(w.createdAt.timeIntervalSince1970)),
            "status": .string(stopped ? "stopped" : w.failingSince != nil ? "failing" : "ok"), "cursor": .string(String(w.cursor)), "delivered": .int(w.delivered),
            "waiting": .int(Int64(min(waiting, 1000))), "waitingMore": .bool(waiting > 1000),
        ]
        if let id = w.keyID { o["keyID"] = .string(id) }
        if stopped { o["stoppedBecause"] = .string("the API key that made it was revoked; nothing is sent to it — delete it and make a new one with a current key") }
        if let t = w.lastSuccessAt { o["lastSuccessAt"] = .int(Int64(t.timeIntervalSince1970)) }
        if let since = w.failingSince {
            var f: JSONObject = ["since": .int(Int64(since.timeIntervalSince1970)), "attempts": .int(Int64(w.attempts))]
            if let s = w.lastStatus { f["status"] = .int(Int64(s)) }
            if let e = w.lastError { f["error"] = .string(e) }
            if let n = w.nextAttemptAt { f["nextAttemptAt"] = .int(Int64(n.timeIntervalSince1970)) }
            o["failure"] = .object(f)
        }
        return .object(o)
    }
}
