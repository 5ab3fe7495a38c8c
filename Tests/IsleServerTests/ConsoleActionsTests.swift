import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// The console acts (issue 26): the queue with why and until when, cancel, retry now, end an
/// activity, compose that refuses a warned payload until confirmed, webhooks; every action in the
/// audit log with the admin key that did it.
@Suite("Console actions and the audit log", .serialized)
struct ConsoleActionsTests {
    typealias C = ConsoleTests

    @Test("queue: a scheduled push shows and is cancelled; a push waiting for its retry is sent now; both in the audit log with the key")
    func cancelAndRetry() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-queue")
            let (cookie, keyID, _) = try await C.signInWithKey(f)
            // Scheduled four hours ahead: on the dashboard and the activity's page, cancellable.
            let later = Int64(f.clock.now.timeIntervalSince1970) + 4 * 3600
            let queued = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Tomorrow"), "sendAt": .int(later)])
            let job = try #require(queued.json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            let dashboard = try await C.send(f, "GET", "/console", cookie: cookie)
            #expect(dashboard.text.contains("data-job=\"\(job)\"") && dashboard.text.contains(">scheduled<") && dashboard.text.contains("/console/jobs/\(job)/cancel"))
            let cancelled = try await C.send(f, "POST", "/console/jobs/\(job)/cancel", form: ["back": "/console/activities/\(id)"], cookie: cookie)
            #expect(cancelled.status == 303 && cancelled.location?.hasPrefix("/console/activities/\(id)?done=") == true)
            #expect(try await SQLiteStore(path: f.databasePath).job(id: job)?.state == .dropped)
            let again = try await C.send(f, "POST", "/console/jobs/\(job)/cancel", form: [:], cookie: cookie)
            #expect(again.location?.contains("done=jobNotCancelled") == true)
            // Gone from the queue; on the activity's page under "Not sent", with why.
            let afterCancel = try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie).text
            let parts = afterCancel.components(separatedBy: "<h2>Not sent</h2>")
            #expect(parts.count == 2 && !parts[0].contains("data-job=\"\(job)\""), "the cancelled job is still in the queue, or not under Not sent")
            #expect(parts.count == 2 && parts[1].contains("data-job=\"\(job)\"") && parts[1].contains(">dropped<") && parts[1].contains("cancelled by an operator"))

            // Updates queued behind one in flight: the older is superseded by the newer, and counted.
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, latencyMilliseconds: 300))
            for driver in ["First", "Second", "Third"] {
                #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state(driver)]).status == 202)
            }
            try await f.waitForDevice("the newest update") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Third" }
            let figures = try JSONParser.parse(Array(try await C.send(f, "GET", "/console/stats", cookie: cookie).text.utf8))
            #expect(figures["superseded"]?.numberValue?.int64Value == 1 && figures["dropped"]?.numberValue?.int64Value == 1, "\(figures.jsonString)")
            let history = try await C.send(f, "GET", "/console/history", cookie: cookie).text
            #expect(history.contains("id=\"total-superseded\">1<") && history.contains("id=\"total-dropped\">1<"))
            #expect(try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie).text.contains(">superseded<"))

            // A 503: the push waits for its retry; "Retry now" sends it at once (the clock does not move).
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Retried")]).status == 202)
            try await eventually("the push waits for its retry") {
                let page = try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie).text
                return page.contains(">waiting for retry<") && page.contains("ServiceUnavailable") && page.contains("/retry")
            }
            let waiting = try #require(try await SQLiteStore(path: f.databasePath).openJobs(bundleID: Pizza.bundleID, activityID: id, limit: 10).first?.id)
            let retried = try await C.send(f, "POST", "/console/jobs/\(waiting)/retry", form: ["back": "/console/activities/\(id)"], cookie: cookie)
            #expect(retried.status == 303)
            try await f.waitForDevice("the retried push delivered") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Retried" }
            // A job of another app, or one that does not exist: not found, nothing changes.
            #expect(try await C.send(f, "POST", "/console/jobs/999999/retry", form: [:], cookie: cookie).location?.contains("done=jobNotRetried") == true)
            #expect(try await C.send(f, "POST", "/console/jobs/abc/retry", form: [:], cookie: cookie).status == 400)

            let audit = try await C.send(f, "GET", "/console/audit", cookie: cookie).text
            #expect(audit.contains(">job.cancel<") && audit.contains("job \(job)") && audit.contains(">job.retry<") && audit.contains("job \(waiting)") && audit.contains(keyID) && audit.contains(">signIn<"))
            // Cancel and retry need a signed-in operator, from the console's own pages.
            #expect(try await C.send(f, "POST", "/console/jobs/\(waiting)/retry", form: [:]).status == 401)
        }
    }

    @Test("the device's own budget: with Isle counting per activity and the simulator per app, a push the device throttled shows as such on the timeline, not as a plain 200")
    func deviceThrottleShown() async throws {
        // The device counts per app, as isle sim does by default (the fixture's instant device does
        // not); the server counts per activity (not its default, which never lets the phone
        // throttle): the subject is how a push the device throttled shows on the timeline.
        try await ServerFixture.with(configure: { $0.device.budgetPerApp = true }, server: { $0.budgetScope = .activity }) { f in
            let (_, first) = try await f.appStartsActivity(key: "order-budget-1")
            let (b, second) = try await f.appStartsActivity(key: "order-budget-2")
            let cookie = try await C.signIn(f)
            // 8 alerts to each: 16 priority-10 pushes for the app, 8 per activity (within Isle's 15).
            for n in 0..<8 {
                for id in [first, second] {
                    #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey,
                                             body: ["contentState": Pizza.state("n\(n)"), "alert": ["title": "Update", "body": .string("\(n)")]]).status == 202)
                }
            }
            try await eventually("every push answered") {
                try await SQLiteStore(path: f.databasePath).deliveries(activityID: second, before: nil, limit: 50).count >= 8
            }
            try await eventually(within: .seconds(20), "a push the device throttled, on a timeline") { () async throws -> Bool in
                for id in [first, second] {
                    let page = try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie).text
                    if page.contains("device-warn") && page.contains("device: throttled") { return true }
                }
                return false
            }
            // Isle did not downgrade them: by its count each activity had budget left.
            let page = try await C.send(f, "GET", "/console/activities/\(second)", cookie: cookie).text
            #expect(page.contains("id=\"budget\">8 of 15") && page.contains("this activity alone"))
            #expect(try f.deviceActivity(b.id) != nil)
        }
    }

    @Test("end an activity from its page; compose refuses a payload the validator warns about until the operator confirms the warning")
    func endAndConfirm() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-end")
            let cookie = try await C.signIn(f)
            // Unix time in a Date field (shown 31 years late): a warning, nothing queued.
            let unix = #"{"contentState":{"driverName":"Late","deliveryTimer":[1767225600,1767227400]}}"#
            let warned = try await C.send(f, "POST", "/console/activities/\(id)/compose", form: ["event": "update", "body": unix], cookie: cookie)
            #expect(warned.status == 422 && warned.text.contains("id=\"warnings\"") && warned.text.contains("unixTimeInDateField") && warned.text.contains("name=\"confirm\""), "\(warned.text.prefix(3000))")
            #expect(!warned.text.contains("Queued as job"))
            #expect(try await SQLiteStore(path: f.databasePath).openJobs(bundleID: Pizza.bundleID, activityID: id, limit: 10).isEmpty)
            let confirmed = try await C.send(f, "POST", "/console/activities/\(id)/compose", form: ["event": "update", "body": unix, "confirm": "on"], cookie: cookie)
            #expect(confirmed.status == 200 && confirmed.text.contains("Queued as job") && confirmed.text.contains("warnings were confirmed"))
            try await f.waitForDevice("the confirmed update") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Late" }

            let ended = try await C.send(f, "POST", "/console/activities/\(id)/end", form: [:], cookie: cookie)
            #expect(ended.status == 200 && ended.text.contains("Queued as job"))
            try await f.waitForDevice("the activity ended on the phone") { d in d.activities.first { $0.id == a.id }?.state == .ended }
            let audit = try await C.send(f, "GET", "/console/audit", cookie: cookie).text
            #expect(audit.contains(">activity.push<") && audit.contains("warnings confirmed") && audit.contains(">activity.end<"))
        }
    }

    @Test("webhooks in the console: added (the secret shown once), listed with a failure, deleted; refusals shown")
    func webhooks() async throws {
        try await ServerFixture.with(server: EventsTests.tune) { f in
            let (_, id) = try await f.appStartsActivity(key: "order-hooks")
            let cookie = try await C.signIn(f)
            let bad = try await C.send(f, "POST", "/console/webhooks", form: ["url": "ftp://x"], cookie: cookie)
            #expect(bad.status == 400 && bad.text.contains("invalidField"))
            let added = try await C.send(f, "POST", "/console/webhooks", form: ["url": "http://127.0.0.1:9/closed"], cookie: cookie)
            #expect(added.status == 200 && added.text.contains("id=\"secret\">whsec_"))
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the failure shown") {
                let page = try await C.send(f, "GET", "/console/webhooks", cookie: cookie).text
                return page.contains(">failing<") && page.contains("no answer") && !page.contains("whsec_")
            }
            let hook = try #require(try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue?.first?["id"]?.stringValue)
            // Its recent attempts are listed; it receives every type.
            let listed = try await C.send(f, "GET", "/console/webhooks", cookie: cookie).text
            #expect(listed.contains("class=\"attempts\"><ul><li>") && listed.contains(">every type<"))
            // Disabled and enabled from the console: audited, the stream told.
            let disabled = try await C.send(f, "POST", "/console/webhooks/\(hook)/enabled", form: ["enabled": "false"], cookie: cookie)
            #expect(disabled.status == 303 && disabled.location == "/console/webhooks?done=webhookDisabled")
            let page = try await C.send(f, "GET", "/console/webhooks", cookie: cookie).text
            #expect(page.contains(">disabled<") && page.contains("disabled in the console") && page.contains(">Enable</button>"))
            #expect(try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["enabled"] == false)
            let stream = try await f.call("GET", "/v1/events?limit=100", key: f.backendKey).json["events"]?.arrayValue ?? []
            #expect(stream.contains { $0["type"] == "webhook.disabled" && $0["data"]?["source"] == "console" })
            #expect(try await C.send(f, "POST", "/console/webhooks/\(hook)/enabled", form: ["enabled": "true"], cookie: cookie).location == "/console/webhooks?done=webhookEnabled")
            #expect(try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["enabled"] == true)
            // One added with a filter (the types ticked).
            let filtered = try await C.send(f, "POST", "/console/webhooks", form: ["url": "http://127.0.0.1:9/filtered", "type.push.failed": "on", "type.token.retired": "on"], cookie: cookie)
            #expect(filtered.status == 200)
            let views = try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue ?? []
            #expect(views.contains { $0["eventTypes"] == ["push.failed", "token.retired"] })
            #expect(try await C.send(f, "GET", "/console/webhooks", cookie: cookie).text.contains(">push.failed, token.retired<"))
            let deleted = try await C.send(f, "POST", "/console/webhooks/\(hook)/delete", form: [:], cookie: cookie)
            #expect(deleted.status == 303)
            #expect(try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue?.count == 1)
            let audit = try await C.send(f, "GET", "/console/audit", cookie: cookie).text
            #expect(audit.contains(">webhook.create<") && audit.contains(">webhook.delete<") && audit.contains(hook))
            #expect(audit.contains(">webhook.disable<") && audit.contains(">webhook.enable<"))
        }
    }

    @Test("pause the app by hand: nothing is sent, across a restart, until it is resumed; both are events and in the audit log")
    func pauseAndResume() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-pause")
            let cookie = try await C.signIn(f)
            #expect(try await C.send(f, "POST", "/console/app/pause", form: ["reason": ""], cookie: cookie).location?.contains("done=pauseNeedsReason") == true)
            let paused = try await C.send(f, "POST", "/console/app/pause", form: ["reason": "wrong copy in the alerts"], cookie: cookie)
            #expect(paused.status == 303 && paused.location?.contains("Paused") == true)
            let app = try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]
            #expect(app?["state"] == "paused" && app?["reason"]?.stringValue?.contains("wrong copy in the alerts") == true)
            #expect(try await C.send(f, "GET", "/console", cookie: cookie).text.contains("id=\"resume-app\""))
            // The backend cannot lift an operator's pause: its resume only probes.
            #expect(try await f.call("POST", "/v1/app/resume", key: f.backendKey).json["delivery"]?["state"] == "paused")
            // Accepted, not sent; still paused after a restart.
            let queued = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("After the pause")])
            #expect(queued.status == 202)
            await f.stop()
            try await f.start()
            try await eventually("the pause read back after the restart") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
            let job = try #require(queued.json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            #expect(try await SQLiteStore(path: f.databasePath).job(id: job)?.state == .queued)
            #expect(try f.deviceActivity(a.id)?.contentState["driverName"] != "After the pause")
            // Sessions live in memory: sign in again after the restart.
            let again = try await C.signIn(f)
            let resumed = try await C.send(f, "POST", "/console/app/resume", form: [:], cookie: again)
            #expect(resumed.status == 303 && resumed.location?.contains("Resumed") == true)
            try await f.waitForDevice("sent once resumed") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "After the pause" }
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "running")
            let events = try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue ?? []
            #expect(events.filter { $0["type"] == "app.paused" }.map { $0["data"]?["cause"] } == ["operator"])
            #expect(events.filter { $0["type"] == "app.resumed" }.map { $0["data"]?["source"] } == ["operator"])
            let audit = try await C.send(f, "GET", "/console/audit", cookie: again).text
            #expect(audit.contains(">app.pause<") && audit.contains("wrong copy in the alerts") && audit.contains(">app.resume<"))
        }
    }

    @Test("history: deliveries by outcome, APNs reasons with their remedy, latency and queue quantiles, charts over 1 h, 24 h and 7 d, and the priority-10 budget per app and activity")
    func history() async throws {
        try await ServerFixture.with(server: { $0.historyFlush = .milliseconds(50) }) { f in
            let (a, id) = try await f.appStartsActivity(key: "order-history")
            let cookie = try await C.signIn(f)
            let empty = try await C.send(f, "GET", "/console/history", cookie: cookie)
            #expect(empty.status == 200 && empty.text.contains("id=\"no-errors\"") && empty.text.contains("id=\"budget-empty\""))
            // Three updates with an alert (priority 10), the second answered 503 once (a retry).
            for (i, driver) in ["One", "Two", "Three"].enumerated() {
                if i == 1 { f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1)) }
                #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: [
                    "contentState": Pizza.state(driver), "alert": ["title": "Update", "body": .string(driver)],
                ]).status == 202)
                if i == 1 {
                    try await eventually("the 503 answered") { (try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue ?? []).contains { $0["status"] == 503 } }
                    f.clock.advance(by: 120)
                }
                try await f.waitForDevice(driver) { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == .string(driver) }
            }
            try await eventually("the history written") {
                let page = try await C.send(f, "GET", "/console/history?range=1h", cookie: cookie).text
                return page.contains("id=\"total-delivered\">3<") && page.contains("id=\"total-retried\">1<")
            }
            let page = try await C.send(f, "GET", "/console/history?range=1h", cookie: cookie).text
            #expect(page.contains("<code>ServiceUnavailable</code>") && page.contains("Retry later"), "the reason with Isle's advice")
            #expect(page.contains("id=\"chart-deliveries\"") && page.contains("data-series=\"delivered\"") && page.contains("id=\"chart-latency\"") && page.contains("id=\"chart-queue\""))
            #expect(!page.contains("id=\"total-latency-p50\">—<"), "latency quantiles from the recorded histogram")
            #expect(page.contains("id=\"budget-total\">3 priority-10 pushes to 1 activities") && page.contains("3 of 14"))
            for range in ["24h", "7d"] { #expect(try await C.send(f, "GET", "/console/history?range=\(range)", cookie: cookie).text.contains("id=\"total-delivered\">3<")) }
            #expect(try await C.send(f, "GET", "/console/history?range=1y", cookie: cookie).status == 400)
            #expect(try await C.send(f, "GET", "/console/activities/\(id)", cookie: cookie).text.contains("id=\"budget\">3 of 14"))
            // Kept across a restart: the counters are in the database.
            await f.stop()
            try await f.start()
            let again = try await C.signIn(f)
            #expect(try await C.send(f, "GET", "/console/history", cookie: again).text.contains("id=\"total-delivered\">3<"))
        }
    }

    @Test("search: by the beginning of a key, by installation, by user (the installations the backend bound to the user), with state")
    func search() async throws {
        try await ServerFixture.with { f in
            _ = try await f.installation("phone-b")
            let (_, one) = try await f.appStartsActivity(key: "order-1")
            let (_, twelve) = try await f.appStartsActivity(key: "order-12", installation: "phone-b")
            let (_, other) = try await f.appStartsActivity(key: "pizza-3", installation: "phone-b")
            #expect(try await f.call("PUT", "/v1/installations/phone-b/user", key: f.backendKey, body: ["userID": "user-42"]).status == 200)
            let cookie = try await C.signIn(f)
            func found(_ query: String) async throws -> Set<String> {
                let page = try await C.send(f, "GET", "/console/activities?\(query)", cookie: cookie)
                #expect(page.status == 200)
                return Set([one, twelve, other].filter { page.text.contains("/console/activities/\($0)\"") })
            }
            #expect(try await found("key=order-1") == [one, twelve])
            #expect(try await found("key=order-12") == [twelve])
            #expect(try await found("installation=phone-b") == [twelve, other])
            #expect(try await found("user=user-42") == [twelve, other])
            #expect(try await found("user=user-42&key=pizza") == [other])
            #expect(try await found("user=nobody").isEmpty)
            #expect(try await found("key=order&state=ended").isEmpty)
            #expect(try await found("key=order&state=active") == [one, twelve])
        }
    }

    @Test("a server-admin key sees every app: an app switcher in the console (session) or ?app= (bearer); an app's admin key cannot switch; neither opens the API")
    func serverAdmin() async throws {
        try await ServerFixture.with { f in
            let store = try SQLiteStore(path: f.databasePath)
            try await store.upsertApp(AppRecord(bundleID: "com.example.tacos", teamID: "TEAM000002", keyID: "KEY0000002", keyPEM: "-", createdAt: Pizza.t0))
            let wide = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .serverAdmin)
            #expect(wide.secret.hasPrefix("isle_server-admin_"))
            let login = try await C.send(f, "POST", "/console/login", form: ["key": wide.secret])
            let cookie = try #require(login.cookie)
            let home = try await C.send(f, "GET", "/console", cookie: cookie)
            #expect(home.text.contains("<h1>com.example.pizza</h1>") && home.text.contains("<option value=\"com.example.tacos\">") && home.text.contains("id=\"switch-app\""))
            let switched = try await C.send(f, "POST", "/console/switch", form: ["app": "com.example.tacos"], cookie: cookie)
            #expect(switched.status == 303)
            #expect(try await C.send(f, "GET", "/console", cookie: cookie).text.contains("<h1>com.example.tacos</h1>"))
            #expect(try await C.send(f, "GET", "/console/audit", cookie: cookie).text.contains(">app.switch<"))
            #expect(try await C.send(f, "POST", "/console/switch", form: ["app": "com.example.none"], cookie: cookie).location?.contains("done=noSuchApp") == true)
            // Bearer: ?app= picks the app.
            #expect(try await C.send(f, "GET", "/console?app=com.example.tacos", bearer: wide.secret).text.contains("<h1>com.example.tacos</h1>"))
            #expect(try await C.send(f, "GET", "/console?app=com.example.none", bearer: wide.secret).status == 404)
            // An app's own admin key sees that app only.
            let narrow = try await C.signIn(f)
            #expect(!(try await C.send(f, "GET", "/console", cookie: narrow)).text.contains("id=\"switch-app\""))
            #expect(try await C.send(f, "POST", "/console/switch", form: ["app": "com.example.tacos"], cookie: narrow).status == 403)
            // Console keys never open the API.
            #expect(try await f.call("GET", "/v1/app", key: wide.secret).status == 403)
        }
    }

    @Test("the queue over the API: GET /v1/jobs, DELETE /v1/jobs/{id} and POST /v1/jobs/{id}/retry, with 404 for another app's and 409 naming the state")
    func queueAPI() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-api-queue")
            let later = Int64(f.clock.now.timeIntervalSince1970) + 4 * 3600
            let scheduled = try #require(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Later"), "sendAt": .int(later)])
                .json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            let list = try await f.call("GET", "/v1/jobs?activity=\(id)", key: f.backendKey)
            #expect(list.status == 200 && list.json["jobs"]?.arrayValue?.map { $0["state"] } == ["scheduled"] && list.json["jobs"]?.arrayValue?.first?["dueAt"] == .int(later))
            #expect(try await f.call("GET", "/v1/jobs?limit=0", key: f.backendKey).status == 400)
            #expect(try await f.call("GET", "/v1/jobs", key: f.deviceKey).status == 403)
            let cancelled = try await f.call("DELETE", "/v1/jobs/\(scheduled)", key: f.backendKey)
            #expect(cancelled.status == 200 && cancelled.json["state"] == "dropped")
            let again = try await f.call("DELETE", "/v1/jobs/\(scheduled)", key: f.backendKey)
            #expect(again.status == 409 && again.json["error"]?["code"] == "jobNotWaiting" && again.json["error"]?["message"]?.stringValue?.contains("dropped") == true)
            #expect(try await f.call("DELETE", "/v1/jobs/987654", key: f.backendKey).status == 404)
            #expect(try await f.call("DELETE", "/v1/jobs/abc", key: f.backendKey).status == 400)
            // A retry after a 503, sent now.
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1))
            let job = try #require(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Now")]).json["jobs"]?.arrayValue?.first?.numberValue?.int64Value)
            try await eventually("waiting for its retry") {
                try await f.call("GET", "/v1/jobs?activity=\(id)", key: f.backendKey).json["jobs"]?.arrayValue?.first?["state"] == "waitingForRetry"
            }
            #expect(try await f.call("POST", "/v1/jobs/\(job)/retry", key: f.backendKey).json["retried"] == true)
            try await f.waitForDevice("sent now") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Now" }
            try await eventually("finished") { try await f.call("GET", "/v1/jobs", key: f.backendKey).json["jobs"] == [] }
            #expect(try await f.call("POST", "/v1/jobs/\(job)/retry", key: f.backendKey).status == 409)
        }
    }

    @Test("GET / leads a person somewhere: the console, the OpenAPI document, health")
    func root() async throws {
        try await ServerFixture.with { f in
            let page = try await C.send(f, "GET", "/")
            #expect(page.status == 200 && page.text.contains("href=\"/console\"") && page.text.contains("href=\"/openapi.json\"") && page.text.contains("href=\"/health\""))
        }
    }

    @Test("a custom APNs without a channel-management host: creating a channel says which setting is missing")
    func managementHint() async throws {
        try await ServerFixture.with(server: { c in
            // As the README's walkthrough once did: --apns-url only.
            if case .custom(let url, _, _, let roots) = c.target(.sandbox) { c.sendBothEnvironments(to: .custom(url: url, trustRootsPEM: roots)) }
        }) { f in
            let r = try await f.call("POST", "/v1/channels", key: f.backendKey, body: [:])
            #expect(r.status == 502)
            #expect(r.json["error"]?["message"]?.stringValue?.contains("no --apns-management-url") == true, "\(r.json)")
        }
    }

    @Test("graceful stop (SIGTERM): no new claims, in-flight sends finish and are recorded, nothing is left claimed, and the next start sends the rest")
    func gracefulStop() async throws {
        try await ServerFixture.with(server: { $0.concurrency = 4 }) { f in
            var ids: [String] = []
            var shown: [SimulatedActivity] = []
            for i in 0..<5 {  // the simulated app's most
                let (a, id) = try await f.appStartsActivity(key: "order-stop-\(i)")
                ids.append(id)
                shown.append(a)
            }
            // Every push takes 700 ms at APNs: up to four in flight when the stop comes.
            f.sim.apns.addFailure(FailureRule(remaining: nil, latencyMilliseconds: 700))
            for id in ids { #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Stop")]).status == 202) }
            try await eventually("the first sends answered, more in flight") { !f.sim.apns.requestLog.isEmpty }
            await f.stop()
            let store = try SQLiteStore(path: f.databasePath)
            let counts = try await store.jobCounts()
            #expect((counts[.claimed] ?? 0) == 0, "\(counts)")
            #expect((counts[.sent] ?? 0) >= 1, "the sends in flight finished and were recorded: \(counts)")
            #expect((counts[.sent] ?? 0) + (counts[.queued] ?? 0) == ids.count, "\(counts)")
            f.sim.apns.clearFailures()
            try await f.start()
            let phones = shown
            try await f.waitForDevice("every update after the restart") { d in
                phones.allSatisfy { a in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Stop" }
            }
        }
    }
}
