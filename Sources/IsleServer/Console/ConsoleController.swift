import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery
import NIOCore
import Synchronization

/// The operator console (`/console`): the app and its status, live queue depth and delivery
/// rates, activities found by key, state or topic with each one's delivery timeline, and a form
/// that validates an update or end with IsleCore's validator before it is queued.
///
/// Never open: a key of the `admin` scope signs in (`isle key create --scope admin`), backend and
/// device keys are refused. A `viewer` key signs in too and sees every page of its app, but acts on
/// nothing: each action answers 403 and its pages show no action. The session is a random token in
/// an HttpOnly, SameSite=Strict cookie (the key itself is not stored in the browser);
/// `Authorization: Bearer <admin key>` works too. Every page is server-rendered and escapes what
/// it prints; the notice an action leaves (`?done=`) is one of a fixed set of texts, never the link's.
/// What the operator's console reads and does: the one consumer that sees most of the store.
typealias ConsoleStore = JobOperations & AppLookup & AppRepository & HistoryRepository & DeliveryHistory & AuditRepository & EventRepository & APIKeyRepository
    & OperatorPauseRepository & ActivityRepository & JobIntake

struct ConsoleController: Sendable {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any ConsoleStore
    let sessions = ConsoleSessions()

    func addRoutes(to router: Router<IsleRequestContext>) {
        router.get("console") { request, context in
            guard let admin = try await admin(request, context) else { return page("Sign in", ConsolePages.login(error: nil), status: .ok) }
            return page(admin.bundleID, try await dashboard(admin, notice: try await notice(request, admin)))
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
            return try await activityPage(admin, a, compose: .init(), notice: try await notice(request, admin))
        }
        router.post("console/activities/:activity/compose") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "send updates and ends")
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
        // Operator actions: each is a form post from the console's pages, written to the audit log,
        // refused to a viewer before it reads anything.
        router.post("console/activities/:activity/end") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "end activities")
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
            let admin = try await acting(request, context, "cancel jobs")
            let id = try Self.jobID(context)
            let back = try await Self.form(request)["back"] ?? "/console"
            guard let job = try await store.cancelJob(id: id, bundleID: admin.bundleID, reason: "cancelled by an operator (key \(admin.keyID))") else {
                return redirect(back, .jobNotCancelled, job: id)
            }
            services.engine.wake()
            try await audit(admin, "job.cancel", target: "job \(id)", detail: "\(job.kind.rawValue)\(job.activityID.map { " to activity \($0)" } ?? ""), \(job.state.rawValue)")
            return redirect(back, .jobCancelled, job: id)
        }
        router.post("console/jobs/:job/retry") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "retry jobs")
            let id = try Self.jobID(context)
            let back = try await Self.form(request)["back"] ?? "/console"
            guard try await store.retryJobNow(id: id, bundleID: admin.bundleID, now: services.clock.now) else {
                return redirect(back, .jobNotRetried, job: id)
            }
            services.engine.wake()
            try await audit(admin, "job.retry", target: "job \(id)", detail: nil)
            return redirect(back, .jobRetried, job: id)
        }
        router.post("console/switch") { request, context in
            try checkOrigin(request)
            let admin = try await required(request, context)
            guard admin.serverWide else { throw APIError(.forbidden, "wrongScope", "switching apps needs a server-admin key (isle key create --scope server-admin)") }
            let app = try await Self.form(request)["app"] ?? ""
            guard !app.unicodeScalars.contains("\u{0}"), app.utf8.count <= 256 else { throw APIError.invalid("app", "app must be a bundle id of this server") }
            guard try await store.app(app) != nil else { return redirect("/console", .noSuchApp) }
            guard let token = Self.cookie(request), sessions.switchApp(token, to: app) else { return redirect("/console", .switchNeedsSession) }
            try await audit(Admin(bundleID: app, keyID: admin.keyID, serverWide: true), "app.switch", target: app, detail: "from \(admin.bundleID)")
            return redirect("/console", .appSwitched)
        }
        router.post("console/app/pause") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "pause the app")
            let reason = (try await Self.form(request)["reason"] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
            guard !reason.unicodeScalars.contains("\u{0}") else { throw APIError.invalid("reason", "reason holds U+0000; write the reason as text") }
            guard !reason.isEmpty, reason.count <= 500 else { return redirect("/console", .pauseNeedsReason) }
            let paused = try await AppControl(services: services, store: store).pause(bundleID: admin.bundleID, keyID: admin.keyID, reason: reason)
            try await audit(admin, "app.pause", target: admin.bundleID, detail: reason)
            return redirect("/console", paused ? .appPaused : .appPausedAlready)
        }
        router.post("console/app/resume") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "resume the app")
            let lifted = try await AppControl(services: services, store: store).resume(bundleID: admin.bundleID, keyID: admin.keyID)
            try await audit(admin, "app.resume", target: admin.bundleID, detail: lifted ? "an operator's pause lifted" : "a probe now")
            return redirect("/console", lifted ? .appResumed : .appProbed)
        }
        router.get("console/history") { request, context in
            let admin = try await required(request, context)
            let name = request.uri.queryParameters["range"].map(String.init)
            guard let range = HistoryPage.Range.named(name) else { throw APIError.invalid("range", "range must be 1h, 24h or 7d") }
            let now = services.clock.now
            let points = try await store.history(bundleID: admin.bundleID, from: now.addingTimeInterval(-range.span - range.bucket), to: now.addingTimeInterval(range.bucket), bucket: range.bucket)
            let budget = try await store.highPrioritySends(bundleID: admin.bundleID, since: now.addingTimeInterval(-3600), limit: 20)
            let app = try await services.app(admin.bundleID)
            // As Isle applies it: per installation, one kept in hand (DeliveryPlanner.budgetUsed).
            let limit = (app.frequentUpdatesDeclared ? services.configuration.frequentHourlyHighPriorityBudget : services.configuration.hourlyHighPriorityBudget)
                - (services.configuration.budgetScope == .installation ? 1 : 0)
            let unsent = try await store.unsentJobCounts(bundleID: admin.bundleID, since: now.addingTimeInterval(-range.span))
            return page("History", HistoryPage.render(points, range: range, now: now, budget: budget, budgetLimit: limit, budgetScope: services.configuration.budgetScope, unsent: unsent))
        }
        router.get("console/audit") { request, context in
            let admin = try await required(request, context)
            var before: Int64?
            if let text = request.uri.queryParameters["before"] {
                guard let n = Int64(String(text)), n > 0 else { throw APIError.invalid("before", "before must be an entry id (a positive whole number)") }
                before = n
            }
            let entries = try await store.auditLog(bundleID: admin.bundleID, before: before, limit: 101)
            return page("Audit log", ConsolePages.audit(Array(entries.prefix(100)), more: entries.count > 100 ? entries[99].id : nil))
        }
        router.get("console/webhooks") { request, context in
            let admin = try await required(request, context)
            return try await webhooksPage(admin, notice: try await notice(request, admin))
        }
        router.post("console/webhooks") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "add webhooks")
            let form = try await Self.form(request)
            do {
                // The types ticked (none: every type).
                let types = EventType.allCases.filter { form["type.\($0.rawValue)"] != nil }
                let (hook, secret) = try await EventsController(services: services, store: store).create(bundleID: admin.bundleID, url: form["url"] ?? "", keyID: nil,
                                                                                                          eventTypes: types.isEmpty ? nil : types)
                try await audit(admin, "webhook.create", target: hook.id, detail: hook.url + (types.isEmpty ? "" : "; eventTypes " + types.map(\.rawValue).joined(separator: ",")))
                return try await webhooksPage(admin, notice: nil, created: (hook, secret))
            } catch let e as APIError {
                return try await webhooksPage(admin, notice: nil, error: e, status: e.status)
            }
        }
        // Disable or enable (the API's PATCH … {"enabled"}): audited; disabling tells the stream.
        router.post("console/webhooks/:webhook/enabled") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "disable or enable webhooks")
            let id = try context.parameters.require("webhook")
            let form = try await Self.form(request)
            let enable = form["enabled"] == "true"
            // As the API's PATCH does it; nothing written when it is so already.
            guard let current = try await store.webhook(id: id), current.bundleID == admin.bundleID else { return redirect("/console/webhooks", .webhookNotFound) }
            if (current.disabledAt == nil) != enable {
                do {
                    let changed = try await EventsController(services: services, store: store).change(id: id, bundleID: admin.bundleID) { hook, now in
                        let (reset, events) = EventsController.setEnabled(enable, &hook, at: now, source: "console", by: "in the console (key \(admin.keyID))")
                        return (nil, reset, events)
                    }
                    try await audit(admin, enable ? "webhook.enable" : "webhook.disable", target: id, detail: changed.url)
                } catch let e as APIError where e.status == .notFound {
                    return redirect("/console/webhooks", .webhookNotFound)
                }
            }
            return redirect("/console/webhooks", enable ? .webhookEnabled : .webhookDisabled)
        }
        router.post("console/webhooks/:webhook/delete") { request, context in
            try checkOrigin(request)
            let admin = try await acting(request, context, "delete webhooks")
            let id = try context.parameters.require("webhook")
            guard let hook = try await store.webhook(id: id), hook.bundleID == admin.bundleID, try await store.deleteWebhook(id: id) else {
                return redirect("/console/webhooks", .webhookNotFound)
            }
            try await audit(admin, "webhook.delete", target: id, detail: hook.url)
            // Named by the audit log, not the notice: once deleted, no id in a link can be checked as the app's.
            return redirect("/console/webhooks", .webhookDeleted)
        }
    }

    // MARK: Who is asking

    struct Admin: Sendable {
        /// The app the operator is looking at.
        var bundleID: String
        var keyID: String
        /// A server-admin key: may switch to any app.
        var serverWide = false
        /// A viewer key: sees every page of its app, acts on nothing.
        var readOnly = false
    }

    /// `; Secure` when the console is reached over HTTPS (`--secure-cookies`).
    var secure: String { services.configuration.secureCookies ? "; Secure" : "" }

    /// The signed-in operator, from the session cookie or an admin key in `Authorization`. A
    /// session holds the hash of the key that opened it and is checked against the store (read at
    /// most once a second per key): revoking the key ends its sessions within a second.
    func admin(_ request: Request, _ context: IsleRequestContext) async throws -> Admin? {
        if let token = Self.cookie(request), let s = sessions.find(token, now: services.clock.now) {
            if let key = try await services.apiKeys.current(hash: s.keyHash) {
                if key.scope == .admin || key.scope == .viewer, key.bundleID == s.bundleID { return Admin(bundleID: key.bundleID, keyID: key.id, readOnly: key.scope == .viewer) }
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
                guard try await store.app(asked) != nil else { throw APIError.notFound("app \(asked)") }
                return Admin(bundleID: asked, keyID: key.id, serverWide: true)
            }
            return Admin(bundleID: key.bundleID, keyID: key.id, serverWide: true)
        }
        return Admin(bundleID: key.bundleID, keyID: key.id, readOnly: key.scope == .viewer)
    }

    func required(_ request: Request, _ context: IsleRequestContext) async throws -> Admin {
        guard let a = try await admin(request, context) else { throw APIError(.unauthorized, "signInRequired", "sign in at /console with an admin key") }
        return a
    }

    /// The signed-in operator of an action (`what`, as in "an admin key can …"): a viewer key is
    /// read-only, so the action is a 403 before it reads its form or changes anything — hiding the
    /// forms from a viewer's pages is for the eye, this is the rule.
    func acting(_ request: Request, _ context: IsleRequestContext, _ what: String) async throws -> Admin {
        let admin = try await required(request, context)
        guard !admin.readOnly else {
            throw APIError(.forbidden, "readOnly", "this key is read-only (viewer); an admin key can \(what) (isle key create --scope admin)")
        }
        return admin
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

    /// Back to a console page, with a notice's code in its query (`?done=<code>`, and `&job=<id>`
    /// for a job, which the page names only once it checked the job is the app's); only console paths.
    func redirect(_ back: String, _ notice: ConsolePages.Notice, job: Int64? = nil) -> Response {
        let path = back.hasPrefix("/console") && !back.contains("//") ? back.split(separator: "?").first.map(String.init) ?? "/console" : "/console"
        return Response(status: .seeOther, headers: [.location: "\(path)?done=\(notice.rawValue)\(job.map { "&job=\($0)" } ?? "")"])
    }

    /// The text of the notice in the page's query (`?done=<code>`): one of the fixed texts, or
    /// nothing for a code that is not one. Whoever made the link chose the query, so it puts no
    /// words of its own under the app's name: a job's id (`&job=`) is named only when it is a job
    /// of the app the operator looks at, else the text says "the job".
    func notice(_ request: Request, _ admin: Admin) async throws -> ConsolePages.ShownNotice? {
        let query = request.uri.queryParameters
        guard let code = query["done"], let notice = ConsolePages.Notice(rawValue: String(code)) else { return nil }
        var job: Int64?
        if notice.aboutJob, let text = query["job"], let id = Int64(String(text)), id > 0, try await store.job(id: id)?.bundleID == admin.bundleID { job = id }
        return ConsolePages.ShownNotice(text: notice.text(job: job, app: admin.bundleID), tone: notice.tone)
    }

    func audit(_ admin: Admin, _ action: String, target: String?, detail: String?) async throws {
        try await store.appendAudit(AuditEntry(bundleID: admin.bundleID, keyID: admin.keyID, action: action, target: target, detail: detail, at: services.clock.now))
    }

    func activityPage(_ admin: Admin, _ a: ActivityRecord, compose: ConsolePages.Compose, notice: ConsolePages.ShownNotice? = nil, status: HTTPResponse.Status = .ok) async throws -> Response {
        let deliveries = try await store.deliveries(activityID: a.id, before: nil, limit: 200)
        let queue = try await store.openJobs(bundleID: admin.bundleID, activityID: a.id, limit: 100)
        let budget = try await services.budget(of: a, history: store)
        let unsent = try await store.unsentJobs(activityID: a.id, limit: 50)
        return page(a.externalKey ?? a.id, ConsolePages.activity(a, deliveries: deliveries, queue: queue, budget: budget, now: services.clock.now, compose: compose, notice: notice,
                                                                 canAct: !admin.readOnly, unsent: unsent), status: status)
    }

    func webhooksPage(_ admin: Admin, notice: ConsolePages.ShownNotice?, created: (WebhookRecord, String)? = nil, error: APIError? = nil, status: HTTPResponse.Status = .ok) async throws -> Response {
        var views: [JSONValue] = []
        for hook in try await store.webhooks(bundleID: admin.bundleID) {
            var view = WireEncoder.encode(try await EventsController.view(hook, store: store)).objectValue ?? [:]
            view["attempts"] = .array(try await store.webhookAttempts(webhookID: hook.id, limit: 5).map { WireEncoder.encode(EventsController.view($0)) })
            views.append(.object(view))
        }
        return page("Webhooks", ConsolePages.webhooks(views, notice: notice, created: created.map { ($0.0.id, $0.1) }, error: error, canAct: !admin.readOnly), status: status)
    }

    // MARK: Data

    func dashboard(_ admin: Admin, notice: ConsolePages.ShownNotice? = nil) async throws -> String {
        let app = try await services.app(admin.bundleID)
        let circuit = services.engine.circuits.circuit(admin.bundleID)
        let pause = try await store.operatorPauses().first { $0.bundleID == admin.bundleID }
        let status: String = if let pause { "paused by an operator (key \(pause.keyID)) since \(ISO8601DateFormatter().string(from: pause.at)): \(pause.reason)" } else {
            switch circuit.mode {
            case .running: "sending"
            case .backingOff(let until, let reason): "backing off until \(ISO8601DateFormatter().string(from: until)): \(reason)"
            case .paused(let until, let reason, _): "paused: APNs refused the app's set-up. \(reason) (next probe \(ISO8601DateFormatter().string(from: until)), or Resume after the fix)"
            }
        }
        let retrying = services.engine.circuits.retrying(admin.bundleID, now: services.clock.now)
        let retryingNote = retrying.first.map { r in
            "; \(retrying.count) push\(retrying.count == 1 ? "" : "es") retried after APNs refused \(retrying.count == 1 ? "it" : "them") (since \(ISO8601DateFormatter().string(from: r.since)), jobs \(retrying.prefix(5).map { "#\($0.jobID)" }.joined(separator: ", "))): \(r.lastAnswer) — \(r.reason)"
        } ?? ""
        let queue = try await store.openJobs(bundleID: admin.bundleID, activityID: nil, limit: 100)
        // The queue names activities by their external key (as the backend knows them).
        var keys: [String: String] = [:]
        for id in Set(queue.compactMap(\.activityID)) {
            if let key = try await store.activity(id: id)?.externalKey { keys[id] = key }
        }
        let apps = admin.serverWide ? try await store.apps().map(\.bundleID) : []
        return ConsolePages.dashboard(app: app, apps: apps, status: status + retryingNote, paused: pause != nil || circuit.mode != .running, environment: services.environmentName, stats: try await stats(admin),
                                      queue: queue, now: services.clock.now, notice: notice, canAct: !admin.readOnly, keys: keys)
    }

    /// The most open jobs the live figures count; past it they read "at least" (`queueMore`).
    static let statsQueueLimit = 1000

    /// The live figures of the app the operator looks at, and only its own: the engine's counters
    /// and `openJobCounts()` are the whole server's (every app's, in `/metrics`), which under one
    /// app's name would show other apps' traffic to its operators. So: its open jobs by state,
    /// counted from its own queue (at most ``statsQueueLimit``); its deliveries over the last hour,
    /// and the send rate over the last five whole minutes, from the history the store keeps per app
    /// (every instance adds to it every few seconds: the app's figures across instances, a few
    /// seconds behind).
    func stats(_ admin: Admin) async throws -> JSONValue {
        let bundleID = admin.bundleID
        let open = try await store.openJobs(bundleID: bundleID, activityID: nil, limit: Self.statsQueueLimit + 1)
        var states: [PushJobState: Int] = [:]
        for job in open.prefix(Self.statsQueueLimit) { states[job.state, default: 0] += 1 }
        let now = services.clock.now
        let minute = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / 60).rounded(.down) * 60)
        // Totals per metric, summed over whatever buckets the span falls in (their size does not matter).
        func totals(from: Date, to: Date) async throws -> [String: Int64] {
            var t: [String: Int64] = [:]
            for p in try await store.history(bundleID: bundleID, from: from, to: to, bucket: 7200) { t[p.metric, default: 0] += p.count }
            return t
        }
        // The last hour: sixty whole minutes, this one included (History's "1h" the same).
        let hour = try await totals(from: minute.addingTimeInterval(-3540), to: minute.addingTimeInterval(60))
        let recent = try await totals(from: minute.addingTimeInterval(-300), to: minute)
        // Superseded and dropped jobs, from the jobs themselves (most never reach the engine's history).
        let unsent = try await store.unsentJobCounts(bundleID: bundleID, since: minute.addingTimeInterval(-3540))
        return ["queued": .int(Int64(states[.queued] ?? 0)), "scheduled": .int(Int64(states[.scheduled] ?? 0)), "inFlight": .int(Int64(states[.claimed] ?? 0)),
                "queueMore": .bool(open.count > Self.statsQueueLimit),
                "sent": .int(hour[HistoryMetric.delivered] ?? 0), "failed": .int(hour[HistoryMetric.failed] ?? 0), "retried": .int(hour[HistoryMetric.retried] ?? 0),
                "superseded": .int(Int64(unsent[.superseded] ?? 0)), "dropped": .int(Int64(unsent[.dropped] ?? 0)),
                "rate": .double(Double(recent[HistoryMetric.delivered] ?? 0) / 300),
                "at": .double(now.timeIntervalSince1970)]
    }

    func search(_ admin: Admin, _ q: ConsolePages.Query) async throws -> [ActivityRecord] {
        guard q.state.isEmpty || ActivityRecordState(rawValue: q.state) != nil else { throw APIError.invalid("state", "state must be one of \(ActivityRecordState.allCases.map(\.rawValue).joined(separator: ", "))") }
        let state = ActivityRecordState(rawValue: q.state)
        func nonEmpty(_ s: String) -> String? { s.isEmpty ? nil : s }
        if !q.topic.isEmpty {
            // Live activities following the topic, narrowed by the other fields.
            return try await store.activities(bundleID: admin.bundleID, topic: q.topic).filter { a in
                (q.key.isEmpty || a.externalKey?.hasPrefix(q.key) == true) && (state == nil || a.state == state)
                    && (q.installation.isEmpty || a.installationID == q.installation)
            }
        }
        // By the key's beginning, installation and/or user (each optional), newest first.
        return try await store.findActivities(bundleID: admin.bundleID, keyPrefix: nonEmpty(q.key), installationID: nonEmpty(q.installation), userID: nonEmpty(q.user),
                                                       state: state, limit: 100)
    }

    func activity(_ admin: Admin, _ id: String) async throws -> ActivityRecord {
        guard let a = try await store.activity(id: id), a.bundleID == admin.bundleID else { throw APIError.notFound("activity \(id)") }
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
        let push = try ActivityPush(object, event: compose.event == "end" ? .end : .update).toDeviceTokens()
        // The API's own path (validation, the live check, the job), so the two cannot differ.
        let now = services.clock.now
        let pushes = ActivityPushes(services: services, store: store)
        let prepared = try await pushes.prepare(bundleID: admin.bundleID, push: push, to: [a], single: true, now: now)
        // Each warning with the validator's fix, on a line of its own.
        let warnings = prepared.warnings.map { w in
            [w["code"]?.stringValue, w["field"]?.stringValue.map { "(\($0))" }, w["message"]?.stringValue].compactMap { $0 }.joined(separator: " ")
                + (w["fix"]?.stringValue.map { "\nFix: \($0)" } ?? "")
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
