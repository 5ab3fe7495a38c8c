import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// Who sees and does what in the console (docs/security.md): a read-only viewer key, `/ready`
/// naming only the apps a key may see, notices from a fixed set (never the link's text), and live
/// figures that are the signed-in app's own.
@Suite("Console roles: the viewer, /ready per app, fixed notices, the app's own figures", .serialized)
struct ConsoleRolesTests {
    typealias C = ConsoleTests

    static let tacos = "com.example.tacos"

    /// How many forms on the page post (the header's sign-out is one of them).
    static func postForms(_ text: String) -> Int { text.components(separatedBy: "method=\"post\"").count - 1 }

    static func addTacos(_ f: ServerFixture) async throws {
        try await SQLiteStore(path: f.databasePath).upsertApp(AppRecord(bundleID: tacos, teamID: "TEAM000002", keyID: "KEY0000002", keyPEM: "-", createdAt: Pizza.t0))
    }

    static func signIn(_ f: ServerFixture, _ secret: String) async throws -> String {
        let r = try await C.send(f, "POST", "/console/login", form: ["key": secret])
        #expect(r.status == 303 && r.location == "/console")
        return try #require(r.cookie)
    }

    static func json(_ page: ConsoleTests.Page) throws -> JSONValue { try JSONParser.parse(Array(page.text.utf8)) }

    @Test("a viewer key signs in and sees every page of its app, with no action on any; every action is a 403 that changes nothing; it opens no API")
    func viewer() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-viewer")
            let later = Int64(f.clock.now.timeIntervalSince1970) + 4 * 3600
            let job = try #require(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Tomorrow"), "sendAt": .int(later)])
                .json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            #expect(try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": "http://127.0.0.1:9/closed"]).status == 201)
            let hook = try #require(try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue?.first?["id"]?.stringValue)
            let store = try SQLiteStore(path: f.databasePath)
            let viewer = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .viewer)
            #expect(viewer.secret.hasPrefix("isle_viewer_"))
            let cookie = try await Self.signIn(f, viewer.secret)

            // Every page, the app's data on it, and no form that acts (only the header's sign-out posts).
            let home = try await C.send(f, "GET", "/console", cookie: cookie)
            #expect(home.status == 200 && home.text.contains("<h1>\(Pizza.bundleID)</h1>") && home.text.contains("data-job=\"\(job)\"") && home.text.contains("id=\"read-only\""))
            #expect(!home.text.contains("/console/jobs/\(job)/cancel") && !home.text.contains("/console/app/pause") && !home.text.contains("id=\"pause-app\""))
            let activity = try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie)
            #expect(activity.status == 200 && activity.text.contains("data-job=\"\(job)\""))
            #expect(!activity.text.contains("/end\"") && !activity.text.contains("/compose\"") && !activity.text.contains("/cancel\"") && !activity.text.contains("id=\"end-activity\""))
            let hooks = try await C.send(f, "GET", "/console/webhooks", cookie: cookie)
            #expect(hooks.status == 200 && hooks.text.contains("data-webhook=\"\(hook)\""))
            #expect(!hooks.text.contains("/delete\"") && !hooks.text.contains("action=\"/console/webhooks\""))
            let pages = [home, activity, hooks,
                         try await C.send(f, "GET", "/console/activities", cookie: cookie),
                         try await C.send(f, "GET", "/console/history", cookie: cookie),
                         try await C.send(f, "GET", "/console/audit", cookie: cookie)]
            for page in pages {
                #expect(page.status == 200)
                #expect(Self.postForms(page.text) == 1, "only the sign-out posts: \(page.text.prefix(3000))")
            }
            #expect(try await C.send(f, "GET", "/console/stats", cookie: cookie).status == 200)

            // Every action: 403, saying why; with the cookie and with the key as a bearer alike.
            let actions: [(String, [String: String])] = [
                ("/console/activities/\(id)/compose", ["event": "update", "body": #"{"contentState":{"driverName":"Viewer","deliveryTimer":[788918400,788919900]}}"#]),
                ("/console/activities/\(id)/end", [:]),
                ("/console/jobs/\(job)/cancel", ["back": "/console"]),
                ("/console/jobs/\(job)/retry", [:]),
                ("/console/app/pause", ["reason": "a viewer tries"]),
                ("/console/app/resume", [:]),
                ("/console/webhooks", ["url": "http://127.0.0.1:9/other"]),
                ("/console/webhooks/\(hook)/delete", [:]),
                ("/console/webhooks/\(hook)/enabled", ["enabled": "false"]),
            ]
            for (path, form) in actions {
                let r = try await C.send(f, "POST", path, form: form, cookie: cookie)
                #expect(r.status == 403 && r.text.contains("read-only (viewer)") && r.text.contains("an admin key can"), "\(path): \(r.status) \(r.text.prefix(300))")
                let bearer = try await C.send(f, "POST", path, form: form, bearer: viewer.secret)
                #expect(bearer.status == 403 && bearer.text.contains("read-only (viewer)"), "\(path) (bearer): \(bearer.status)")
            }
            #expect(try await C.send(f, "POST", "/console/switch", form: ["app": Pizza.bundleID], cookie: cookie).status == 403)

            // Nothing changed: the job waits, the webhook is there, the app sends, the activity is live, and the audit log has only the sign-in.
            #expect(try await store.job(id: job)?.state == .scheduled)
            #expect(try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue?.count == 1)
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "running")
            #expect(try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["state"] == "active")
            #expect(try await store.openJobs(bundleID: Pizza.bundleID, activityID: id, limit: 10).map(\.id) == [job])
            let audit = try await store.auditLog(bundleID: Pizza.bundleID, before: nil, limit: 100)
            #expect(audit.filter { $0.keyID == viewer.id }.map(\.action) == ["signIn"], "\(audit.map(\.action))")
            #expect(audit.map(\.action).sorted() == ["signIn", "webhook.create"], "the backend's webhook and the viewer's sign-in only: \(audit.map(\.action))")

            // A viewer key opens no API route, whatever its scope needs.
            for (method, path) in [("GET", "/v1/app"), ("GET", "/v1/jobs"), ("GET", "/v1/webhooks"), ("DELETE", "/v1/jobs/\(job)"), ("POST", "/v1/app/resume")] {
                let r = try await f.call(method, path, key: viewer.secret)
                #expect(r.status == 403 && r.json["error"]?["code"] == "wrongScope", "\(method) \(path): \(r.status)")
            }
            // An admin key still acts (the refusal is the viewer's, not the console's).
            let admin = try await C.signIn(f)
            #expect(try await C.send(f, "GET", "/console", cookie: admin).text.contains("/console/jobs/\(job)/cancel"))
            #expect(try await C.send(f, "POST", "/console/jobs/\(job)/cancel", form: [:], cookie: admin).status == 303)
            #expect(try await store.job(id: job)?.state == .dropped)
        }
    }

    @Test("/ready: an app's admin or viewer key sees its own app's pause only, a server-admin key every app's, other keys none")
    func readyPerApp() async throws {
        try await ServerFixture.with { f in
            try await Self.addTacos(f)
            let store = try SQLiteStore(path: f.databasePath)
            let pizzaAdmin = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .admin).secret
            let pizzaViewer = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .viewer).secret
            let tacosAdmin = try await ServerSetup.createKey(store: store, bundleID: Self.tacos, scope: .admin).secret
            let wide = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .serverAdmin).secret
            for key in [pizzaAdmin, tacosAdmin] {
                let paused = try await C.send(f, "POST", "/console/app/pause", form: ["reason": "secret reason of each app"], cookie: try await Self.signIn(f, key))
                #expect(paused.status == 303)
            }
            func apps(_ key: String?) async throws -> [String]? {
                let r = try await f.call("GET", "/ready", headers: key.map { [("Authorization", "Bearer \($0)")] } ?? [])
                #expect(r.status == 200 && r.json["status"] == "degraded", "\(r.json.jsonString)")
                return r.json["apps"]?.arrayValue?.compactMap { $0["bundleID"]?.stringValue }
            }
            #expect(try await apps(nil) == nil)
            #expect(try await apps(f.backendKey) == nil)
            #expect(try await apps(pizzaAdmin) == [Pizza.bundleID])
            #expect(try await apps(pizzaViewer) == [Pizza.bundleID])
            #expect(try await apps(tacosAdmin) == [Self.tacos])
            #expect(try await apps(wide) == [Pizza.bundleID, Self.tacos])
        }
    }

    @Test("/ready: wrong keys are throttled per address like the API's; a probe without a key is never held back")
    func readyThrottlesWrongKeys() async throws {
        try await ServerFixture.with(server: { c in c.authFailureLimit = RateLimit(perSecond: 0.01, burst: 3) }) { f in
            let admin = try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
            #expect(try await C.send(f, "POST", "/console/app/pause", form: ["reason": "held for the test"], cookie: try await Self.signIn(f, admin)).status == 303)
            #expect(try await f.call("GET", "/ready", key: admin).json["apps"]?.arrayValue?.count == 1)
            for _ in 0..<3 {
                let r = try await f.call("GET", "/ready", key: "isle_admin_guess")
                #expect(r.status == 200 && r.json["apps"] == nil)
            }
            let held = try await f.call("GET", "/ready", key: "isle_admin_guess")
            #expect(held.status == 429 && held.retryAfter != nil, "\(held.status) \(held.json.jsonString)")
            #expect(try await f.call("GET", "/ready", key: admin).status == 429, "past the budget, before any look-up")
            #expect(try await f.call("GET", "/ready").status == 200)
        }
    }

    @Test("?done= shows one of the console's own notices, never the link's text; a job is named only when it is the app's")
    func fixedNotices() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-notice")
            let later = Int64(f.clock.now.timeIntervalSince1970) + 4 * 3600
            let job = try #require(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Later"), "sendAt": .int(later)])
                .json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            let cookie = try await C.signIn(f)
            for path in ["/console", "/console/activities/\(id)", "/console/webhooks"] {
                for done in ["%3Cscript%3Ealert(1)%3C%2Fscript%3E", "Your%20account%20is%20locked%3A%20call%20us", "jobCancelled%20x", ""] {
                    let page = try await C.send(f, "GET", "\(path)?done=\(done)", cookie: cookie)
                    #expect(page.status == 200 && !page.text.contains("id=\"notice\""), "\(path)?done=\(done)")
                    #expect(!page.text.contains("alert(1)") && !page.text.contains("script&gt;") && !page.text.contains("account is locked"))
                }
            }
            // A known code: its own text. A job's id only when the job is this app's.
            #expect(try await C.send(f, "GET", "/console?done=appPaused", cookie: cookie).text.contains("id=\"notice\">Paused: nothing is sent"))
            #expect(try await C.send(f, "GET", "/console?done=jobCancelled&job=\(job)", cookie: cookie).text.contains("id=\"notice\">Job \(job) cancelled."))
            for other in ["987654", "-1", "%3Cb%3E"] {
                let page = try await C.send(f, "GET", "/console?done=jobCancelled&job=\(other)", cookie: cookie).text
                #expect(page.contains("id=\"notice\">The job cancelled.") && !page.contains("987654") && !page.contains("&lt;b&gt;"), "\(other)")
            }
            // What the actions redirect to: codes, not text.
            let cancelled = try await C.send(f, "POST", "/console/jobs/\(job)/cancel", form: ["back": "/console/activities/\(id)"], cookie: cookie)
            #expect(cancelled.status == 303 && cancelled.location == "/console/activities/\(id)?done=jobCancelled&job=\(job)")
            #expect(try await C.send(f, "POST", "/console/jobs/\(job)/cancel", form: [:], cookie: cookie).location == "/console?done=jobNotCancelled&job=\(job)")
            #expect(try await C.send(f, "POST", "/console/app/pause", form: ["reason": ""], cookie: cookie).location == "/console?done=pauseNeedsReason")
            #expect(try await C.send(f, "POST", "/console/webhooks/wh_nope/delete", form: [:], cookie: cookie).location == "/console/webhooks?done=webhookNotFound")
            #expect(try await C.send(f, "GET", "/console/webhooks?done=webhookNotFound", cookie: cookie).text.contains("id=\"notice\">No such webhook"))
        }
    }

    @Test("the live figures are the signed-in app's own: another app's queue and deliveries never show under its name")
    func ownFigures() async throws {
        try await ServerFixture.with(server: { $0.historyFlush = .milliseconds(50) }) { f in
            try await Self.addTacos(f)
            let (a, id) = try await f.appStartsActivity(key: "order-figures")
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Sent now")]).status == 202)
            try await f.waitForDevice("the update") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Sent now" }
            let later = Int64(f.clock.now.timeIntervalSince1970) + 4 * 3600
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Later"), "sendAt": .int(later)]).status == 202)
            let pizza = try await C.signIn(f)
            let tacos = try await Self.signIn(f, try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Self.tacos, scope: .viewer).secret)
            try await eventually("pizza's delivery in its figures") {
                try Self.json(try await C.send(f, "GET", "/console/stats", cookie: pizza))["sent"]?.numberValue?.int64Value ?? 0 >= 1
            }
            let own = try Self.json(try await C.send(f, "GET", "/console/stats", cookie: pizza))
            #expect(own["scheduled"] == 1 && own["rate"] != nil, "\(own.jsonString)")
            let other = try Self.json(try await C.send(f, "GET", "/console/stats", cookie: tacos))
            #expect(other["sent"] == 0 && other["scheduled"] == 0 && other["queued"] == 0 && other["failed"] == 0 && other["retried"] == 0, "\(other.jsonString)")
            let page = try await C.send(f, "GET", "/console", cookie: tacos).text
            #expect(page.contains("<h1>\(Self.tacos)</h1>") && page.contains("id=\"scheduled\">0<") && page.contains("id=\"sent\">0<"))
        }
    }
}
