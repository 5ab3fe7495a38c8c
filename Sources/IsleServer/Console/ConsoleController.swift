import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import NIOCore
import Synchronization

/// The operator console (`/console`): the app and its status, live queue depth and delivery
/// rates, activities found by key, state or topic with each one's delivery timeline, and a form
/// that validates an update or end with IsleCore's validator before it is queued.
///
/// Never open: a key of the `admin` scope signs in (`isle key create --scope admin`), backend and
/// device keys are refused. The session is a random token in an HttpOnly, SameSite=Strict cookie
/// (the key itself is not stored in the browser); `Authorization: Bearer <admin key>` works too.
/// Every page is server-rendered and escapes what it prints.
struct ConsoleController: Sendable {
    let services: APIServices
    let sessions = ConsoleSessions()

    func addRoutes(to router: Router<IsleRequestContext>) {
        router.get("console") { request, context in
            guard let admin = try await admin(request, context) else { return page("Sign in", ConsolePages.login(error: nil), status: .ok) }
            return page(admin.bundleID, try await dashboard(admin, notice: request.uri.queryParameters["done"].map(String.init)))
        }
        router.get("console/console.js") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/javascript; charset=utf-8", .cacheControl: "no-cache"],
                     body: .init(byteBuffer: .init(string: ConsolePages.liveStats)))
        }
        router.post("console/login") { request, context in
            try checkOrigin(request)
            // Failed sign-ins are throttled per client address (one token per failure): a key
            // cannot be guessed from one address faster than the configured rate.
            let address = context.remoteAddress ?? "unknown"
            if services.authFailures.isExhausted(address) {
                return page("Sign in", ConsolePages.login(error: "Too many failed sign-ins from this address; wait a minute and try again."), status: .tooManyRequests)
            }
            let form = try await Self.form(request)
            let secret = form["key"] ?? ""
            let hash = APIKeys.hash(secret)
            guard !secret.isEmpty, let key = try await services.apiKeys.current(hash: hash), key.scope.isConsole else {
                _ = services.authFailures.take(address)
                return page("Sign in", ConsolePages.login(error: ConsolePages.refusedKey), status: .forbidden)
            }
            let token = sessions.open(bundleID: key.bundleID, keyHash: hash, now: services.clock.now)
            try await audit(Admin(bundleID: key.bundleID, keyID: key.id, serverWide: key.scope == .serverAdmin), "signIn", target: nil, detail: "from \(address)")
            var r = Response(status: .seeOther, headers: [.location: "/console"])
            r.headers[.setCookie] = "\(ConsoleSessions.cookie)=\(token); Path=/console; HttpOnly; SameSite=Strict\(secure); Max-Age=\(Int(ConsoleSessions.lifetime))"
            return r
        }
        router.post("console/logout") { request, _ in
            try checkOrigin(request)
            if let token = Self.cookie(request) { sessions.close(token) }
            var r = Response(status: .seeOther, headers: [.location: "/console"])
            r.headers[.setCookie] = "\(ConsoleSessions.cookie)=; Path=/console; HttpOnly; SameSite=Strict\(secure); Max-Age=0"
            return r
        }
        router.get("console/stats") { request, context in
            let admin = try await required(request, context)
            return JSONResponse.make(try await stats(admin))
        }
        router.get("console/activities") { request, context in
            let admin = try await required(request, context)
            let q = request.uri.queryParameters
            func field(_ name: String) throws -> String {
                let value = q[Substring(name)].map(String.init) ?? ""
                // Nothing a store cannot keep (U+0000) and nothing longer than any stored value.
                guard !value.unicodeScalars.contains("\u{0}") else { throw APIError(.badRequest, "invalidValue", "\(name) holds U+0000, which no key, state or topic holds", field: name) }
                guard value.utf8.count <= 256 else { throw APIError(.badRequest, "invalidValue", "\(name) is over 256 bytes, longer than any key, state or topic", field: name) }
                return value
            }
            let query = ConsolePages.Query(key: try field("key"), state: try field("state"), topic: try field("topic"), installation: try field("installation"), user: try field("user"))
            return page("Activities", ConsolePages.search(query, results: try await search(admin, query)))
        }
        router.get("console/activities/:activity") { request, context in
            let admin = try await required(request, context)
            let a = try await activity(admin, try context.parameters.require("activity"))
            return try await activityPage(admin, a, compose: .init(), notice: request.uri.queryParameters["done"].map(String.init))
        }
        router.post("console/activities/:activity/compose") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let a = try await activity(admin, try context.parameters.require("activity"))
            let form = try await Self.form(request)
            var compose = ConsolePages.Compose(event: form["event"] == "end" ? "end" : "update", body: form["body"] ?? "")
            compose.confirmed = form["confirm"] == "on"
            do {
                let outcome = try await enqueue(admin, a, compose)
                switch outcome {
                case .queued(let text): compose.result = text
                case .needsConfirmation(let warnings): compose.warnings = warnings
                }
            } catch let e as APIError {
                compose.error = e
            }
            let status: HTTPResponse.Status = compose.error != nil || !compose.warnings.isEmpty ? .unprocessableContent : .ok
            return try await activityPage(admin, a, compose: compose, status: status)
        }
        // Operator actions: each is a form post from the console's pages, written to the audit log.
        router.post("console/activities/:activity/end") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let a = try await activity(admin, try context.parameters.require("activity"))
            var compose = ConsolePages.Compose(event: "end", body: "{}")
            compose.confirmed = true
            do {
                if case .queued(let text) = try await enqueue(admin, a, compose) { compose.result = text }
            } catch let e as APIError {
                compose.error = e
            }
            return try await activityPage(admin, a, compose: compose, status: compose.error == nil ? .ok : .unprocessableContent)
        }
        router.post("console/jobs/:job/cancel") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let id = try Self.jobID(context)
            let back = try await Self.form(request)["back"] ?? "/console"
            guard let job = try await services.store.cancelJob(id: id, bundleID: admin.bundleID, reason: "cancelled by an operator (key \(admin.keyID))") else {
                return redirect(back, notice: "Job \(id) was not cancelled: it is in flight, finished, or not this app's.")
            }
            services.engine.wake()
            try await audit(admin, "job.cancel", target: "job \(id)", detail: "\(job.kind.rawValue)\(job.activityID.map { " to activity \($0)" } ?? ""), \(job.state.rawValue)")
            return redirect(back, notice: "Job \(id) cancelled.")
        }
        router.post("console/jobs/:job/retry") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let id = try Self.jobID(context)
            let back = try await Self.form(request)["back"] ?? "/console"
            guard try await services.store.retryJobNow(id: id, bundleID: admin.bundleID, now: services.clock.now) else {
                return redirect(back, notice: "Job \(id) was not retried: only a queued job can be sent now.")
            }
            services.engine.wake()
            try await audit(admin, "job.retry", target: "job \(id)", detail: nil)
            return redirect(back, notice: "Job \(id) goes now.")
        }
        router.post("console/switch") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            guard admin.serverWide else { throw APIError(.forbidden, "wrongScope", "switching apps needs a server-admin key (isle key create --scope server-admin)") }
            let app = try await Self.form(request)["app"] ?? ""
            guard !app.unicodeScalars.contains("\u{0}"), app.utf8.count <= 256 else { throw APIError.invalid("app", "app must be a bundle id of this server") }
            guard try await services.store.app(app) != nil else { return redirect("/console", notice: "No app \(app) on this server.") }
            guard let token = Self.cookie(request), sessions.switchApp(token, to: app) else { return redirect("/console", notice: "Switching needs a signed-in session.") }
            try await audit(Admin(bundleID: app, keyID: admin.keyID, serverWide: true), "app.switch", target: app, detail: "from \(admin.bundleID)")
            return redirect("/console", notice: "Now looking at \(app).")
        }
        router.post("console/app/pause") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let reason = (try await Self.form(request)["reason"] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
            guard !reason.unicodeScalars.contains("\u{0}") else { throw APIError.invalid("reason", "reason holds U+0000; write the reason as text") }
            guard !reason.isEmpty, reason.count <= 500 else { return redirect("/console", notice: "Not paused: say why (up to 500 characters), for the audit log and the other operators.") }
            let paused = try await AppControl(services: services).pause(bundleID: admin.bundleID, keyID: admin.keyID, reason: reason)
            try await audit(admin, "app.pause", target: admin.bundleID, detail: reason)
            return redirect("/console", notice: paused ? "Paused: nothing is sent for the app until it is resumed." : "Was paused already; the reason is updated.")
        }
        router.post("console/app/resume") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let lifted = try await AppControl(services: services).resume(bundleID: admin.bundleID, keyID: admin.keyID)
            try await audit(admin, "app.resume", target: admin.bundleID, detail: lifted ? "an operator's pause lifted" : "a probe now")
            return redirect("/console", notice: lifted ? "Resumed: the app's pushes go again." : "Not paused by an operator; a paused or backing-off app is probed now.")
        }
        router.get("console/history") { request, context in
            let admin = try await required(request, context)
            let name = request.uri.queryParameters["range"].map(String.init)
            guard let range = HistoryPage.Range.named(name) else { throw APIError.invalid("range", "range must be 1h, 24h or 7d") }
            let now = services.clock.now
            let points = try await services.store.history(bundleID: admin.bundleID, from: now.addingTimeInterval(-range.span - range.bucket), to: now.addingTimeInterval(range.bucket), bucket: range.bucket)
            let budget = try await services.store.highPrioritySends(bundleID: admin.bundleID, since: now.addingTimeInterval(-3600), limit: 20)
            let app = try await services.app(admin.bundleID)
            let limit = app.frequentUpdatesDeclared ? services.configuration.frequentHourlyHighPriorityBudget : services.configuration.hourlyHighPriorityBudget
            return page("History", HistoryPage.render(points, range: range, now: now, budget: budget, budgetLimit: limit))
        }
        router.get("console/audit") { request, context in
            let admin = try await required(request, context)
            var before: Int64?
            if let text = request.uri.queryParameters["before"] {
                guard let n = Int64(String(text)), n > 0 else { throw APIError.invalid("before", "before must be an entry id (a positive whole number)") }
                before = n
            }
            let entries = try await services.store.auditLog(bundleID: admin.bundleID, before: before, limit: 101)
            return page("Audit log", ConsolePages.audit(Array(entries.prefix(100)), more: entries.count > 100 ? entries[99].id : nil))
        }
        router.get("console/webhooks") { request, context in
            let admin = try await required(request, context)
            return try await webhooksPage(admin, notice: request.uri.queryParameters["done"].map(String.init))
        }
        router.post("console/webhooks") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let form = try await Self.form(request)
            do {
                let (hook, secret) = try await EventsController(services: services).create(bundleID: admin.bundleID, url: form["url"] ?? "", keyID: nil)
                try await audit(admin, "webhook.create", target: hook.id, detail: hook.url)
                return try await webhooksPage(admin, notice: nil, created: (hook, secret))
            } catch let e as APIError {
                return try await webhooksPage(admin, notice: nil, error: e, status: e.status)
            }
        }
        router.post("console/webhooks/:webhook/delete") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            let id = try context.parameters.require("webhook")
            guard let hook = try await services.store.webhook(id: id), hook.bundleID == admin.bundleID, try await services.store.deleteWebhook(id: id) else {
                return redirect("/console/webhooks", notice: "No webhook \(id).")
            }
            try await audit(admin, "webhook.delete", target: id, detail: hook.url)
            return redirect("/console/webhooks", notice: "Webhook \(id) deleted.")
        }
    }

    // MARK: Who is asking

    struct Admin: Sendable {
        /// The app the operator is looking at.
        var bundleID: String
        var keyID: String
        /// A server-admin key: may switch to any app.
        var serverWide = false
    }

    /// `; Secure` when the console is reached over HTTPS (`--secure-cookies`).
    var secure: String { services.configuration.secureCookies ? "; Secure" : "" }

    /// The signed-in operator, from the session cookie or an admin key in `Authorization`. A
    /// session holds the hash of the key that opened it and is checked against the store (read at
    /// most once a second per key): revoking the key ends its sessions within a second.
    func admin(_ request: Request, _ context: IsleRequestContext) async throws -> Admin? {
        if let token = Self.cookie(request), let s = sessions.find(token, now: services.clock.now) {
            if let key = try await services.apiKeys.current(hash: s.keyHash) {
                if key.scope == .admin, key.bundleID == s.bundleID { return Admin(bundleID: key.bundleID, keyID: key.id) }
                // A server-wide key looks at the app its session switched to.
                if key.scope == .serverAdmin { return Admin(bundleID: s.bundleID, keyID: key.id, serverWide: true) }
            }
            sessions.close(token)
            return nil
        }
        guard let auth = request.headers[.authorization], auth.lowercased().hasPrefix("bearer ") else { return nil }
        let address = context.remoteAddress ?? "unknown"
        if let wait = services.authFailures.isExhausted(address) ? services.authFailures.take(address) : nil {
            throw KeyedRateLimiter.tooMany("this address sent keys that cannot sign in: it", services.authFailures.limit, wait)
        }
        guard let key = try await services.apiKeys.current(secret: String(auth.dropFirst(7)).trimmingCharacters(in: .whitespaces)), key.scope.isConsole else {
            // The same answer for an unknown, revoked or other-scope key: it says nothing about the key.
            _ = services.authFailures.take(address)
            throw APIError(.unauthorized, "unauthenticated", "the console takes an admin key of this server that was not revoked")
        }
        if key.scope == .serverAdmin {
            // With a bearer key, `?app=` picks the app (default: the one the key was created on).
            let asked = request.uri.queryParameters["app"].map(String.init)
            if let asked, asked != key.bundleID {
                guard !asked.unicodeScalars.contains("\u{0}"), asked.utf8.count <= 256 else { throw APIError.invalid("app", "app must be a bundle id of this server") }
                guard try await services.store.app(asked) != nil else { throw APIError.notFound("app \(asked)") }
                return Admin(bundleID: asked, keyID: key.id, serverWide: true)
            }
            return Admin(bundleID: key.bundleID, keyID: key.id, serverWide: true)
        }
        return Admin(bundleID: key.bundleID, keyID: key.id)
    }

    func required(_ request: Request, _ context: IsleRequestContext) async throws -> Admin {
        guard let a = try await admin(request, context) else { throw APIError(.unauthorized, "signInRequired", "sign in at /console with an admin key") }
        return a
    }

    /// A form post must come from the console's own page (the cookie is SameSite=Strict too).
    func checkOrigin(_ request: Request) throws {
        guard let origin = request.headers[.origin] else { return }
        let host = request.head.authority ?? ""
        guard origin == "http://\(host)" || origin == "https://\(host)" else {
            throw APIError(.forbidden, "forbiddenOrigin", "the console accepts forms from its own pages only (Origin: \(origin))", field: "Origin")
        }
    }

    // MARK: Actions

    static func jobID(_ context: IsleRequestContext) throws -> Int64 {
        guard let id = Int64(try context.parameters.require("job")), id > 0 else { throw APIError.invalid("job", "job must be a job id (a positive whole number)") }
        return id
    }

    /// Back to a console page, with a notice in its query (`?done=`); only console paths.
    func redirect(_ back: String, notice: String) -> Response {
        let path = back.hasPrefix("/console") && !back.contains("//") ? back.split(separator: "?").first.map(String.init) ?? "/console" : "/console"
        var allowed = CharacterSet.urlQueryAllowed
        allowed.remove(charactersIn: "&=+#")
        return Response(status: .seeOther, headers: [.location: "\(path)?done=\(notice.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")"])
    }

    func audit(_ admin: Admin, _ action: String, target: String?, detail: String?) async throws {
        try await services.store.appendAudit(AuditEntry(bundleID: admin.bundleID, keyID: admin.keyID, action: action, target: target, detail: detail, at: services.clock.now))
    }

    func activityPage(_ admin: Admin, _ a: ActivityRecord, compose: ConsolePages.Compose, notice: String? = nil, status: HTTPResponse.Status = .ok) async throws -> Response {
        let deliveries = try await services.store.deliveries(activityID: a.id, before: nil, limit: 200)
        let queue = try await services.store.openJobs(bundleID: admin.bundleID, activityID: a.id, limit: 100)
        let used = try await services.store.highPrioritySends(activityID: a.id, since: services.clock.now.addingTimeInterval(-3600))
        let app = try await services.app(admin.bundleID)
        let limit = app.frequentUpdatesDeclared ? services.configuration.frequentHourlyHighPriorityBudget : services.configuration.hourlyHighPriorityBudget
        return page(a.externalKey ?? a.id, ConsolePages.activity(a, deliveries: deliveries, queue: queue, budget: (used, limit), now: services.clock.now, compose: compose, notice: notice), status: status)
    }

    func webhooksPage(_ admin: Admin, notice: String?, created: (WebhookRecord, String)? = nil, error: APIError? = nil, status: HTTPResponse.Status = .ok) async throws -> Response {
        var views: [JSONValue] = []
        for hook in try await services.store.webhooks(bundleID: admin.bundleID) { views.append(try await EventsController.view(hook, store: services.store)) }
        return page("Webhooks", ConsolePages.webhooks(views, notice: notice, created: created.map { ($0.0.id, $0.1) }, error: error), status: status)
    }

    // MARK: Data

    func dashboard(_ admin: Admin, notice: String? = nil) async throws -> String {
        let app = try await services.app(admin.bundleID)
        let circuit = services.engine.circuits.circuit(admin.bundleID)
        let pause = try await services.store.operatorPauses().first { $0.bundleID == admin.bundleID }
        let status: String = if let pause { "paused by an operator (key \(pause.keyID)) since \(ISO8601DateFormatter().string(from: pause.at)): \(pause.reason)" } else {
            switch circuit.mode {
            case .running: "sending"
            case .backingOff(let until, let reason): "backing off until \(ISO8601DateFormatter().string(from: until)): \(reason)"
            case .paused(let until, let reason, _): "paused by a configuration error until \(ISO8601DateFormatter().string(from: until)): \(reason)"
            }
        }
        let queue = try await services.store.openJobs(bundleID: admin.bundleID, activityID: nil, limit: 100)
        let apps = admin.serverWide ? try await services.store.apps().map(\.bundleID) : []
        return ConsolePages.dashboard(app: app, apps: apps, status: status, paused: pause != nil || circuit.mode != .running, environment: services.environmentName, stats: try await stats(admin),
                                      queue: queue, now: services.clock.now, notice: notice)
    }

    func stats(_ admin: Admin) async throws -> JSONValue {
        let open = try await services.store.openJobCounts()
        let counts = services.engine.counters.snapshot
        return ["queued": .int(Int64(open[.queued] ?? 0)), "scheduled": .int(Int64(open[.scheduled] ?? 0)), "inFlight": .int(Int64(open[.claimed] ?? 0)),
                "sent": .int(Int64(counts["sent"] ?? 0)), "failed": .int(Int64(counts["failed"] ?? 0)), "retried": .int(Int64(counts["retried"] ?? 0)),
                "at": .double(services.clock.now.timeIntervalSince1970)]
    }

    func search(_ admin: Admin, _ q: ConsolePages.Query) async throws -> [ActivityRecord] {
        guard q.state.isEmpty || ActivityRecordState(rawValue: q.state) != nil else { throw APIError.invalid("state", "state must be one of \(ActivityRecordState.allCases.map(\.rawValue).joined(separator: ", "))") }
        let state = ActivityRecordState(rawValue: q.state)
        func nonEmpty(_ s: String) -> String? { s.isEmpty ? nil : s }
        if !q.topic.isEmpty {
            // Live activities following the topic, narrowed by the other fields.
            return try await services.store.activities(bundleID: admin.bundleID, topic: q.topic).filter { a in
                (q.key.isEmpty || a.externalKey?.hasPrefix(q.key) == true) && (state == nil || a.state == state)
                    && (q.installation.isEmpty || a.installationID == q.installation)
            }
        }
        // By the key's beginning, installation and/or user (each optional), newest first.
        return try await services.store.findActivities(bundleID: admin.bundleID, keyPrefix: nonEmpty(q.key), installationID: nonEmpty(q.installation), userID: nonEmpty(q.user),
                                                       state: state, limit: 100)
    }

    func activity(_ admin: Admin, _ id: String) async throws -> ActivityRecord {
        guard let a = try await services.store.activity(id: id), a.bundleID == admin.bundleID else { throw APIError.notFound("activity \(id)") }
        return a
    }

    enum ComposeOutcome {
        case queued(String)
        /// The validator warned: nothing queued until the operator confirms these warnings.
        case needsConfirmation([String])
    }

    /// The same checks and queueing as `POST /v1/activities/{id}/update|end`; a payload the
    /// validator warns about is queued only once the operator confirmed the warnings.
    func enqueue(_ admin: Admin, _ a: ActivityRecord, _ compose: ConsolePages.Compose) async throws -> ComposeOutcome {
        let object: JSONObject
        do {
            guard let o = try JSONParser.parse(Array(compose.body.utf8)).objectValue else { throw APIError.invalid("body", "the request must be a JSON object such as {\"contentState\": {…}}") }
            object = o
        } catch let e as APIError {
            throw e
        } catch {
            throw APIError.invalid("body", "the request is not JSON: \(error)")
        }
        let push = try ActivityPush(Body(object: object), event: compose.event == "end" ? .end : .update)
        // The API's own path (validation, the live check, the job), so the two cannot differ.
        let now = services.clock.now
        let pushes = ActivityPushes(services: services)
        let prepared = try await pushes.prepare(bundleID: admin.bundleID, push: push, to: [a], single: true, now: now)
        let warnings = prepared.warnings.map { w in
            [w["code"]?.stringValue, w["field"]?.stringValue.map { "(\($0))" }, w["message"]?.stringValue].compactMap { $0 }.joined(separator: " ")
        }
        if !warnings.isEmpty, !compose.confirmed { return .needsConfirmation(warnings) }
        let ids = try await pushes.commit(prepared, idempotency: nil, now: now)
        let job = ids.first.map(String.init) ?? "?"
        try await audit(admin, compose.event == "end" ? "activity.end" : "activity.push", target: "activity \(a.id)",
                        detail: "job \(job)\(warnings.isEmpty ? "" : "; warnings confirmed: " + warnings.joined(separator: "; ")): \(compose.body.prefix(500))")
        return .queued("Queued as job \(job).\(warnings.isEmpty ? "" : " The warnings were confirmed.")")
    }

    // MARK: HTTP

    func page(_ title: String, _ body: String, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store", .init("X-Frame-Options")!: "DENY",
                                           .init("Content-Security-Policy")!: "default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"],
                 body: .init(byteBuffer: .init(string: ConsolePages.document(title: title, body: body))))
    }

    static func cookie(_ request: Request) -> String? {
        for header in request.headers[values: .cookie] {
            for part in header.split(separator: ";") {
                let kv = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
                if kv.count == 2, kv[0] == ConsoleSessions.cookie { return String(kv[1]) }
            }
        }
        return nil
    }

    /// An `application/x-www-form-urlencoded` body.
    static func form(_ request: Request) async throws -> [String: String] {
        let buffer: ByteBuffer
        do { buffer = try await request.body.collect(upTo: Limits.body) } catch is NIOTooManyBytesError {
            throw APIError(.contentTooLarge, "bodyTooLarge", "the form is over \(Limits.body >> 20) MiB")
        } catch {
            throw APIError(.badRequest, "incompleteBody", "the form ended before it was complete")
        }
        let text = String(buffer: buffer).replacingOccurrences(of: "+", with: " ")
        var out: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = kv.first?.removingPercentEncoding else { continue }
            out[name] = kv.count > 1 ? (String(kv[1]).removingPercentEncoding ?? "") : ""
        }
        return out
    }
}

/// Signed-in operators: random tokens, for 8 hours, in memory (a restart signs everyone out).
final class ConsoleSessions: Sendable {
    static let cookie = "isle_console"
    static let lifetime: TimeInterval = 8 * 3600
    struct Session: Sendable {
        var bundleID: String
        /// The hash of the admin key that opened the session (never the key).
        var keyHash: String
        var expires: Date
    }
    private let sessions = Mutex<[String: Session]>([:])

    func open(bundleID: String, keyHash: String, now: Date) -> String {
        let token = Hex.encode((0..<32).map { _ in UInt8.random(in: 0...255) })
        sessions.withLock { s in
            s = s.filter { $0.value.expires > now }
            s[token] = Session(bundleID: bundleID, keyHash: keyHash, expires: now.addingTimeInterval(Self.lifetime))
        }
        return token
    }

    func find(_ token: String, now: Date) -> Session? {
        sessions.withLock { s in s[token].flatMap { $0.expires > now ? $0 : nil } }
    }

    func close(_ token: String) { _ = sessions.withLock { $0.removeValue(forKey: token) } }

    /// A server-wide operator's session now looks at `app`; false when there is no such session.
    func switchApp(_ token: String, to app: String) -> Bool {
        sessions.withLock { s in
            guard s[token] != nil else { return false }
            s[token]?.bundleID = app
            return true
        }
    }
}
