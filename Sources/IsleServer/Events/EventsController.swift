import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
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
        v1.patch("webhooks/:webhook", use: changeWebhook)
        v1.post("webhooks/:webhook/rotate-secret", use: rotateSecret)
        v1.post("webhooks/:webhook/replay", use: replay)
        v1.post("webhooks/:webhook/redeliver", use: redeliver)
        v1.get("webhooks/:webhook/attempts", use: attempts)
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
                return JSONResponse.make(API.EventPage(events: page.map(API.Event.init), next: String(next)))
            }
            // Woken by this process's events at once; another instance's are found within a second.
            await services.events.wait(since: generation, timeout: min(left, .seconds(1)))
        }
    }

    /// `POST /v1/webhooks` `{"url": "https://…"}`: a new endpoint, receiving the events committed
    /// from now on. Its signing secret is in this answer only.
    @Sendable func createWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let body = try await Body.read(API.WebhookCreation.self, request)
        let (hook, secret) = try await create(bundleID: caller.bundleID, url: body.url.text, keyID: caller.keyID, eventTypes: try Self.eventTypes(body.eventTypes))
        // API-made webhooks are in the audit log too, under the key that made them.
        try await store.appendAudit(AuditEntry(bundleID: caller.bundleID, keyID: caller.keyID, action: "webhook.create", target: hook.id, detail: hook.url, at: services.clock.now))
        var view = try await Self.view(hook, store: store)
        view.secret = secret
        return JSONResponse.make(view, status: .created)
    }

    /// A new webhook of the app and its secret (the API's and the console's one way to make one).
    /// `keyID`: the API key making it (nil: the console), whose revocation stops it.
    func create(bundleID: String, url text: String, keyID: String?, eventTypes: [EventType]? = nil) async throws -> (WebhookRecord, String) {
        let url = try await checkedEndpoint(text)
        let existing = try await store.webhooks(bundleID: bundleID)
        guard existing.count < Self.maximumWebhooks else {
            throw APIError(.conflict, "tooManyWebhooks", "an app has at most \(Self.maximumWebhooks) webhooks; delete one first")
        }
        let secret = "whsec_" + Self.random(32)
        let stored = services.configuration.masterKey?.seal(secret, bundleID: bundleID) ?? secret
        var hook = WebhookRecord(id: "wh_" + Self.random(12), bundleID: bundleID, url: url, secret: stored, createdAt: services.clock.now,
                                 cursor: try await store.lastEventSeq(bundleID: bundleID), keyID: keyID)
        hook.eventTypes = eventTypes
        try await store.insertWebhook(hook)
        services.events.ring()
        return (hook, secret)
    }

    @Sendable func listWebhooks(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        var views: [API.Webhook] = []
        for hook in try await store.webhooks(bundleID: caller.bundleID) { views.append(try await Self.view(hook, store: store)) }
        return JSONResponse.make(API.WebhookList(webhooks: views))
    }

    @Sendable func showWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let hook = try await own(context)
        return JSONResponse.make(try await Self.view(hook, store: store))
    }

    @Sendable func deleteWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let hook = try await own(context)
        _ = try await store.deleteWebhook(id: hook.id)
        try await audit(context, "webhook.delete", hook, hook.url)
        return JSONResponse.make(API.WebhookDeletion(id: hook.id))
    }

    /// `PATCH /v1/webhooks/{id}` `{url?, eventTypes?, enabled?}`: change where it goes, which
    /// types it receives (null: every type), or disable and enable it. Enabling clears its failure
    /// and sends what is waiting at once.
    @Sendable func changeWebhook(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let object = try await Body.object(request)
        guard !object.isEmpty else { throw APIError.invalid("body", "give at least one of url, eventTypes, enabled") }
        let body = try Body.decode(API.WebhookChange.self, object)
        var url: String?
        if let text = body.url?.text { url = try await checkedEndpoint(text) }
        let types: [EventType]?? = switch body.eventTypes {
        case nil: nil
        case .clear?: .some(nil)
        case .set(let list)?: .some(try Self.eventTypes(list))
        }
        let enabled = body.enabled
        let changed = try await change(context) { hook, now in
            if let url { hook.url = url }
            if let types { hook.eventTypes = types }
            guard let enabled else { return (nil, false, []) }
            let (reset, events) = Self.setEnabled(enabled, &hook, at: now, source: "api", by: "through the API (key \(caller.keyID))")
            return (nil, reset, events)
        }
        var detail: [String] = []
        if let url { detail.append("url \(url)") }
        if let types { detail.append("eventTypes \(types.map { $0.map(\.rawValue).joined(separator: ",") } ?? "every type")") }
        if let enabled { detail.append(enabled ? "enabled" : "disabled") }
        try await audit(context, "webhook.update", changed, detail.joined(separator: "; "))
        return JSONResponse.make(try await Self.view(changed, store: store))
    }

    /// `POST /v1/webhooks/{id}/rotate-secret` `{overlapSeconds?}`: a new signing secret (in this
    /// answer only). For `overlapSeconds` (default a day, at most 7 days) requests carry a
    /// signature with the old secret too, so receivers can switch at their own pace.
    @Sendable func rotateSecret(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let body = try await Body.read(API.WebhookRotation.self, request)
        let overlap = TimeInterval(body.overlapSeconds?.seconds ?? 86_400)
        let secret = "whsec_" + Self.random(32)
        var until: Date?
        let changed = try await change(context) { hook, now in
            let sealed = self.services.configuration.masterKey?.seal(secret, bundleID: hook.bundleID) ?? secret
            // During an earlier rotation's overlap the secret receivers still hold is that one's
            // old secret, not the one in between (whose answer may have been lost, and retried):
            // it stays the previous secret.
            let inOverlap = hook.previousSecret != nil && (hook.previousSecretUntil ?? .distantPast) > now
            hook.previousSecret = overlap > 0 ? (inOverlap ? hook.previousSecret : hook.secret) : nil
            hook.previousSecretUntil = overlap > 0 ? now.addingTimeInterval(overlap) : nil
            until = hook.previousSecretUntil
            hook.secret = sealed
            return (nil, false, [])
        }
        try await audit(context, "webhook.rotate", changed, "overlap \(Int(overlap)) s")
        var view = try await Self.view(changed, store: store)
        view.secret = secret
        view.previousSecretValidUntil = until
        return JSONResponse.make(view)
    }

    /// `POST /v1/webhooks/{id}/replay` `{after}`: send the events after this cursor again (a
    /// `next` of `GET /v1/events`, or an event's number), in order, from now on.
    @Sendable func replay(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let after = try await Body.read(API.WebhookReplay.self, request).after.sequence
        let last = try await store.lastEventSeq(bundleID: caller.bundleID)
        guard after <= last else {
            throw APIError(.unprocessableContent, "cursorAhead", "after (\(after)) is past the app's newest event (\(last))", field: "after")
        }
        let changed = try await change(context) { _, _ in (after, false, []) }
        services.events.ring()
        try await audit(context, "webhook.replay", changed, "after \(after)")
        return JSONResponse.make(try await Self.view(changed, store: store))
    }

    /// `POST /v1/webhooks/{id}/redeliver` `{eventID}`: send that one event to the endpoint now,
    /// whatever its filter or cursor; answers what the endpoint answered (kept in its attempts).
    @Sendable func redeliver(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let hook = try await own(context)
        let id = try await Body.read(API.WebhookRedelivery.self, request).eventID
        let text = id.text
        let seq = id.sequence
        guard let event = try await store.events(bundleID: caller.bundleID, after: seq - 1, limit: 1).first, event.seq == seq else {
            throw APIError.notFound("event \(text) (kept \(services.configuration.retention.events / 86_400) days)")
        }
        let sender = WebhookDispatcher(store: store, bell: services.events, clock: services.clock, settings: services.configuration.webhooks,
                                       masterKey: services.configuration.masterKey, logger: services.logger)
        // A stopped webhook sends nothing (its key was revoked); a disabled one may be tried by hand.
        if try await sender.keyRevoked(hook) {
            throw APIError(.conflict, "webhookStopped", "webhook \(hook.id) is stopped: the API key that made it was revoked; delete it and make a new one with a current key")
        }
        let attempt = try await sender.redeliver(event, to: hook)
        try await audit(context, "webhook.redeliver", hook, "\(text): \(attempt.status)")
        return JSONResponse.make(API.WebhookRedeliveryResult(eventID: text, status: Int64(attempt.status), latencyMS: attempt.latencyMS, delivered: attempt.error == nil,
                                                             error: attempt.error))
    }

    /// `GET /v1/webhooks/{id}/attempts?limit=`: its newest requests first (the last 100 are kept).
    @Sendable func attempts(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let hook = try await own(context)
        let limit = try Limits.pageSize(request, "limit", fallback: 20)
        let list = try await store.webhookAttempts(webhookID: hook.id, limit: min(limit, WebhookAttempt.kept))
        return JSONResponse.make(API.WebhookAttemptList(attempts: list.map(Self.view)))
    }

    static func view(_ a: WebhookAttempt) -> API.WebhookAttempt {
        var o = API.WebhookAttempt(at: a.at, kind: API.WebhookAttempt.Kind(rawValue: a.kind) ?? .delivery, status: Int64(a.status), latencyMS: (a.latencyMS * 10).rounded() / 10,
                                   events: Int64(a.events))
        o.firstEventID = a.firstEvent.map { "evt_\($0)" }
        o.lastEventID = a.lastEvent.map { "evt_\($0)" }
        o.error = a.error
        return o
    }

    /// Changes the caller's webhook with `edit` (given the record as it is and the time), once its
    /// revision held; `edit` answers a cursor to replay from, whether to clear its failure, and
    /// events to write with it. Retried when a sender changed it meanwhile.
    func change(_ context: IsleRequestContext, _ edit: (inout WebhookRecord, Date) throws -> (Int64?, Bool, [NewEvent])) async throws -> WebhookRecord {
        let hook = try await own(context)
        return try await change(id: hook.id, bundleID: hook.bundleID, edit)
    }

    /// The same for the app's webhook `id` (the console's actions): 404 when it is not the app's.
    func change(id: String, bundleID: String, _ edit: (inout WebhookRecord, Date) throws -> (Int64?, Bool, [NewEvent])) async throws -> WebhookRecord {
        for _ in 0..<5 {
            guard var hook = try await store.webhook(id: id), hook.bundleID == bundleID else { throw APIError.notFound("webhook \(id)") }
            let (replay, reset, events) = try edit(&hook, services.clock.now)
            if try await store.changeWebhook(hook, replayFrom: replay, resetFailure: reset, events: events) {
                if !events.isEmpty || reset || replay != nil { services.events.ring() }
                guard let changed = try await store.webhook(id: id) else { throw APIError.notFound("webhook \(id)") }
                return changed
            }
        }
        throw APIError(.conflict, "webhookBusy", "webhook \(id) kept changing while this request tried to change it; try again", retryAfter: 1)
    }

    /// Disables (with its `webhook.disabled` event, from `source`) or enables (its failure
    /// cleared) `hook`; nothing when it is so already. Answers whether to clear the failure, and
    /// the events to write with the change. The API and the console both use it.
    static func setEnabled(_ enabled: Bool, _ hook: inout WebhookRecord, at now: Date, source: String, by who: String) -> (reset: Bool, events: [NewEvent]) {
        switch (enabled, hook.disabledAt == nil) {
        case (false, true):
            hook.disabledAt = now
            hook.disabledReason = "disabled \(who)"
            return (false, [disabledEvent(hook, source: source, at: now)])
        case (true, false):
            hook.disabledAt = nil
            hook.disabledReason = nil
            return (true, [])
        default: return (false, [])
        }
    }

    /// A webhook disabled by hand: the app's stream says so (docs/events.md).
    static func disabledEvent(_ hook: WebhookRecord, source: String, at now: Date) -> NewEvent {
        NewEvent(bundleID: hook.bundleID, type: .webhookDisabled, data: ["webhookID": .string(hook.id), "url": .string(hook.url), "source": .string(source),
                                                                         "reason": .string(hook.disabledReason ?? "disabled")], at: now)
    }

    func audit(_ context: IsleRequestContext, _ action: String, _ hook: WebhookRecord, _ detail: String) async throws {
        let caller = try context.caller(.backend)
        try await store.appendAudit(AuditEntry(bundleID: caller.bundleID, keyID: caller.keyID, action: action, target: hook.id, detail: detail, at: services.clock.now))
    }

    /// `eventTypes`: null or absent (every type), or a non-empty list of known types (each once).
    static func eventTypes(_ list: [EventType]?) throws -> [EventType]? {
        guard let list else { return nil }
        guard !list.isEmpty else {
            throw APIError.invalid("eventTypes", "eventTypes must name at least one type (null: every type): \(EventType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        var types: [EventType] = []
        for type in list where !types.contains(type) { types.append(type) }
        return types
    }

    /// A URL a webhook may point at: well formed, and allowed by this server's rules now (a name
    /// that does not resolve yet is taken; it is checked again before each round).
    func checkedEndpoint(_ text: String) async throws -> String {
        let url = try Self.endpoint(text)
        if case .failure(let refusal) = await WebhookTarget.check(url: url, settings: services.configuration.webhooks), refusal.code != "webhookHostUnresolvable" {
            throw APIError(.unprocessableContent, refusal.code, refusal.message, field: "url")
        }
        return url
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
    static func view(_ w: WebhookRecord, store: any EventRepository & APIKeyRepository) async throws -> API.Webhook {
        let waiting = try await store.events(bundleID: w.bundleID, after: w.cursor, limit: 1001).count
        var stopped = false
        if let id = w.keyID {
            let key = try await store.apiKeys(bundleID: w.bundleID).first { $0.id == id }
            stopped = key == nil || key?.revokedAt != nil
        }
        var o = API.Webhook(id: w.id, url: w.url, createdAt: w.createdAt, status: stopped ? .stopped : w.failingSince != nil ? .failing : .ok, cursor: String(w.cursor),
                            delivered: w.delivered, waiting: Int64(min(waiting, 1000)), waitingMore: waiting > 1000, eventTypes: w.eventTypes, enabled: w.disabledAt == nil)
        o.keyID = w.keyID
        if let at = w.disabledAt {
            o.status = .disabled
            o.disabledAt = at
            o.disabledReason = w.disabledReason
        }
        if let until = w.previousSecretUntil, w.previousSecret != nil { o.previousSecretValidUntil = until }
        if stopped { o.stoppedBecause = "the API key that made it was revoked; nothing is sent to it — delete it and make a new one with a current key" }
        o.lastSuccessAt = w.lastSuccessAt
        if let since = w.failingSince {
            var f = API.WebhookFailure(since: since, attempts: Int64(w.attempts))
            f.status = w.lastStatus.map(Int64.init)
            f.error = w.lastError
            f.nextAttemptAt = w.nextAttemptAt
            o.failure = f
        }
        return o
    }
}
