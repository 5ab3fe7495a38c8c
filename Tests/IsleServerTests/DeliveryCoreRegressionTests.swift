import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleHTTP2Server
import IsleTesting
import Logging
import Synchronization
import Testing

/// One test per defect of the first delivery core (docs/server.md, "Delivery semantics"), each against the simulator over
/// HTTP/2 + TLS, with the server on a real SQLite file. (docs/server.md, "Delivery semantics")
@Suite("Delivery core v2: the defects of v1 stay fixed", .serialized)
struct DeliveryCoreRegressionTests {
    static func plain(_ driver: String) -> JSONValue { ["contentState": Pizza.state(driver)] }
    static func alerted(_ driver: String) -> JSONValue { ["contentState": Pizza.state(driver), "alert": ["title": "Update", "body": .string(driver)]] }

    func view(_ f: ServerFixture, _ id: String) async throws -> JSONValue { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json }

    /// Nothing on the device was dropped as older; the server's record shows what the phone shows.
    func expectInStep(_ f: ServerFixture, _ id: String, _ deviceActivity: String) async throws {
        let events = try f.sim.world.device(f.device).events
        #expect(!events.contains { $0.outcome?.code == .olderTimestamp }, "the phone dropped a push as older")
        let shown = try #require(try f.deviceActivity(deviceActivity))
        #expect(try await view(f, id)["contentState"] == shown.contentState)
    }

    @Test("1. one 503 does not let a later push overtake the retry: the alert is shown and the record matches the phone")
    func retryIsNotOvertaken() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-503")
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1))
            let u1 = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("U1 with alert"))
            #expect(u1.status == 202)
            try await eventually("U1 answered 503 and waits for its retry") { try await view(f, id)["deliveries"]?.arrayValue?.first?["status"] == 503 }
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("U2 plain")).status == 202)
            try await eventually(within: .seconds(30), "U2 on the phone") {
                if try f.deviceActivity(a.id)?.contentState["driverName"] == "U2 plain" { return true }
                f.clock.advance(by: 1)
                return false
            }
            try await eventually("U2's delivery recorded") { (try await view(f, id)["deliveries"]?.arrayValue ?? []).count == 3 }
            let deliveries = try await view(f, id)["deliveries"]?.arrayValue ?? []
            #expect(deliveries.map { $0["status"] } == [503, 200, 200])
            // U1's alert reached the phone (its apns-id was applied there), before U2.
            let u1ID = try #require(deliveries[1]["apnsID"]?.stringValue)
            let applied = try f.sim.world.device(f.device).events.filter { $0.outcome?.code == .applied }.compactMap(\.apnsID)
            #expect(applied.suffix(2) == [u1ID, deliveries[2]["apnsID"]?.stringValue])
            try await expectInStep(f, id, a.id)
        }
    }

    @Test("2. a claim whose lease ran out while the server runs is taken back by the sweep and delivered")
    func leaseSweptAtRunTime() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(50) }) { f in
            let (a, id) = try await f.appStartsActivity(key: "order-lease")
            // A worker that died (or whose bookkeeping failed) holds the job: claimed, lease 10 s.
            let other = try SQLiteStore(path: f.databasePath)
            let due = f.clock.now.addingTimeInterval(100)
            try await other.enqueue([NewPushJob(bundleID: Pizza.bundleID, kind: .update, activityID: id, payload: .update(Pizza.state("Swept"), at: f.clock.now), runAt: due)],
                                    idempotency: nil, now: f.clock.now)
            let lost = try await other.claim(limit: 1, now: due, lease: 10, worker: "dead-worker")
            #expect(lost.count == 1)
            f.clock.advance(by: 200)
            try await f.waitForDevice("the swept job delivered") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Swept" }
            try await eventually("recorded as sent") { try await other.job(id: lost[0].job.id)?.state == .sent }
        }
    }

    @Test("2d. no poll: a push scheduled before a restart (its timer gone with the process) and a retry due later are delivered when the clock reaches them")
    func dueWorkFoundWithoutPolling() async throws {
        // A sweep so rare it cannot be what delivers: only the engine's own due-time timers can.
        try await ServerFixture.with(server: { $0.sweepInterval = .seconds(3600) }) { f in
            let (a, id) = try await f.appStartsActivity(key: "order-no-poll")
            let sendAt = Int64(f.clock.now.timeIntervalSince1970) + 600
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey,
                                     body: ["contentState": Pizza.state("Scheduled"), "sendAt": JSONValue(integerLiteral: sendAt)]).status == 202)
            // The server that set the timer stops; a new one starts on the same file and has no timer of its own for it.
            await f.stop()
            try await f.start()
            f.clock.advance(by: 300)
            #expect(try f.deviceActivity(a.id)?.contentState["driverName"] != "Scheduled", "not before its time")
            f.clock.advance(by: 301)
            try await f.waitForDevice("the scheduled push delivered at its time") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Scheduled" }
            // A 503 makes the next push a retry due later: the engine's timer on the injected clock brings it.
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Retried")]).status == 202)
            try await eventually("the 503 answered") { (try await view(f, id)["deliveries"]?.arrayValue ?? []).contains { $0["status"] == 503 } }
            f.clock.advance(by: 120)
            try await f.waitForDevice("the retry delivered once its time came") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Retried" }
        }
    }

    @Test("3a. a token rotated while a push is in flight is kept: later pushes use it and the activity stays reachable")
    func rotationDuringSendWins() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-rotate")
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, latencyMilliseconds: 300))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("during")).status == 202)
            try await eventually("the push is in flight") { !f.sim.apns.requestLog.isEmpty }
            let newToken = try f.sim.world.rotateUpdateToken(activityID: a.id, on: f.device)
            #expect(try await f.call("PUT", "/v1/activities/\(id)/token", key: f.deviceKey, body: ["token": .string(newToken)], headers: f.secretHeader()).status == 200)
            try await eventually("the in-flight push recorded") { try await view(f, id)["deliveries"]?.arrayValue?.contains { $0["status"] == 200 } == true }
            #expect(try await SQLiteStore(path: f.databasePath).activity(id: id)?.updateToken == newToken)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("after")).status == 202)
            try await f.waitForDevice("the next push reaches the new token") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "after" }
            #expect(try await view(f, id)["state"] == "active")
        }
    }

    @Test("3c. a rotated token reported just after APNs answered 410 for the old one revives the activity; the push goes out")
    func lateRotationRevives() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-late-token")
            let newToken = try f.sim.world.rotateUpdateToken(activityID: a.id, on: f.device)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("still here")).status == 202)
            try await eventually("the 410 for the old token") { try await view(f, id)["state"] == "unreachable" }
            let put = try await f.call("PUT", "/v1/activities/\(id)/token", key: f.deviceKey, body: ["token": .string(newToken)], headers: f.secretHeader())
            #expect(put.status == 200 && put.json["state"] == "active")
            try await f.waitForDevice("delivered to the new token") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "still here" }
            try await eventually("both deliveries recorded") { (try await view(f, id)["deliveries"]?.arrayValue ?? []).map { $0["status"] } == [410, 200] }
        }
    }

    @Test("3b. a dismissal reported while a push is in flight is not undone by its bookkeeping")
    func dismissalDuringSendWins() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-dismiss")
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, latencyMilliseconds: 300))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("late news")).status == 202)
            try await eventually("the push is in flight") { !f.sim.apns.requestLog.isEmpty }
            try f.sim.world.userDismiss(activityID: a.id, on: f.device)
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the in-flight push recorded") { try await view(f, id)["deliveries"]?.arrayValue?.isEmpty == false }
            let v = try await view(f, id)
            #expect(v["state"] == "dismissed")
        }
    }

    @Test("2b. a delivery whose bookkeeping write fails is retried in process: recorded once, never left claimed, never sent twice")
    func bookkeepingRetriedInProcess() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-disk-full")
            f.faults.arm(.complete, times: 3)  // the disk is full for the next three result writes
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("written at last")).status == 202)
            try await f.waitForDevice("delivered") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "written at last" }
            try await eventually("the result written once the disk has room") { try await view(f, id)["deliveries"]?.arrayValue?.count == 1 }
            #expect(f.faults.injected == 3)
            let counts = try await SQLiteStore(path: f.databasePath).jobCounts()
            #expect(counts[.sent] == 1 && counts[.claimed] == nil && counts[.queued] == nil, "\(counts)")
            #expect(f.sim.apns.requestLog.count == 1, "sent once")
            try await expectInStep(f, id, a.id)
        }
    }

    @Test("2c. a write the database cannot commit answers 503 with Retry-After in the error shape, and queues nothing")
    func unavailableDatabaseAnswers503() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-503")
            let store = try SQLiteStore(path: f.databasePath)
            f.faults.arm(.enqueue, times: 1)
            let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("x"))
            #expect(r.status == 503 && r.json["error"]?["code"] == "databaseUnavailable" && r.retryAfter == "1", "\(r.json.jsonString)")
            #expect(r.json["error"]?["message"]?.stringValue?.contains("SELECT") == false)
            #expect(try await store.jobCounts().isEmpty)
            // The next one goes through.
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("y")).status == 202)
        }
    }

    @Test("2d. a commit that fails (a full disk) answers 503; /ready says not ready until the disk takes writes again (a file beside the database, then the database itself), then ready")
    func failedCommitTurnsReadyOff() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-disk")
            #expect(try await f.call("GET", "/ready").status == 200)
            // The commit fails, and so does the disk check after it: the disk is full.
            f.faults.arm(.commit, times: 1)
            f.faults.arm(.diskProbe, times: 1)
            let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("lost"))
            #expect(r.status == 503 && r.retryAfter == "1", "\(r.json.jsonString)")
            let notReady = try await f.call("GET", "/ready")
            #expect(notReady.status == 503 && notReady.retryAfter == "1", "\(notReady.json.jsonString)")
            // Room again: the next check writes its file, then the database itself (on its own, so
            // /ready never waits behind the writer), and /ready is back; so are writes.
            try await eventually(within: .seconds(10), "/ready back once the database takes a write") { try await f.call("GET", "/ready").status == 200 }
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("kept")).status == 202)
            #expect(f.faults.injected == 2)
            #expect(!FileManager.default.fileExists(atPath: f.databasePath + "-isle-probe"), "the check leaves no file")
        }
    }

    @Test("2e. on a disk still full, a commit that succeeds in the space the log already holds does not make /ready say ready; space back does")
    func commitOnFullDiskKeepsNotReady() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-full")
            f.faults.arm(.commit, times: 1)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("lost")).status == 503)
            // The next commits succeed (SQLite reused its log's space) but the disk has no room for
            // anything new: the write is kept and delivered, and readiness stays off meanwhile.
            f.faults.arm(.diskProbe, times: 1_000)
            let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("kept"))
            #expect(r.status == 202)
            #expect(f.faults.injected >= 2, "the commit's disk check ran")
            #expect(try await f.call("GET", "/ready").status == 503)
            try await eventually("the update delivered") { try f.deviceActivity(a.id)?.contentState["driverName"] == "kept" }
            #expect(try await f.call("GET", "/ready").status == 503)
            f.faults.disarm(.diskProbe)
            try await eventually(within: .seconds(10), "/ready back once the disk has room") { try await f.call("GET", "/ready").status == 200 }
        }
    }

    @Test("4a. an APNs outage of two hours loses nothing (v1 gave up after 10 tries, 4–8 minutes): the end goes out when APNs is back")
    func outageRetriedByTime() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-outage")
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: nil))
            #expect(try await f.call("POST", "/v1/activities/\(id)/end", key: f.backendKey, body: ["contentState": Pizza.state("Delivered")]).status == 202)
            // Two hours: past the 15-minute backoff cap several times, so the count of attempts
            // does not depend on how many of the early, second-apart retries one clock step merges.
            let outageEnds = f.clock.now.addingTimeInterval(7200)
            try await eventually(within: .seconds(90), "the end delivered after the outage") {
                if try f.deviceActivity(a.id)?.state == .ended { return true }
                if f.clock.now >= outageEnds { f.sim.apns.clearFailures() }
                f.clock.advance(by: 20)
                return false
            }
            try await eventually("the server records the end") { try await view(f, id)["state"] == "ended" }
            let statuses = (try await view(f, id)["deliveries"]?.arrayValue ?? []).map { $0["status"]?.numberValue?.int64Value ?? 0 }
            #expect(statuses.count > 10, "v1 gave up after 10 attempts")
            #expect(statuses.last == 200 && statuses.dropLast().allSatisfy { $0 == 503 })
            #expect(try f.deviceActivity(a.id)?.contentState["driverName"] == "Delivered")
        }
    }

    @Test("4b. a revoked key pauses the app (status on /ready and /v1/app); nothing is killed; a fix and a resume deliver")
    func configurationErrorPausesTheApp() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-key")
            f.sim.apns.addFailure(FailureRule(status: 403, reason: "InvalidProviderToken", remaining: nil))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("after the fix")).status == 202)
            try await eventually("the app is paused") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
            let app = try await f.call("GET", "/v1/app", key: f.backendKey).json
            #expect(app["delivery"]?["reason"]?.stringValue?.contains("InvalidProviderToken") == true)
            // Without an admin key /ready says only degraded; the operator's key sees which app and why.
            let ready = try await f.call("GET", "/ready").json
            #expect(ready["status"] == "degraded" && ready["apps"] == nil && !ready.jsonString.contains(Pizza.bundleID), "\(ready.jsonString)")
            let admin = try await ServerSetup.createKey(store: SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
            let detail = try await f.call("GET", "/ready", headers: [("Authorization", "Bearer \(admin)")]).json
            #expect(detail["status"] == "degraded" && detail["apps"]?.arrayValue?.first?["bundleID"] == .string(Pizza.bundleID), "\(detail.jsonString)")
            #expect(try await view(f, id)["state"] == "active")
            #expect(try await SQLiteStore(path: f.databasePath).jobCounts()[.failed] == nil)
            f.sim.apns.clearFailures()
            #expect(try await f.call("POST", "/v1/app/resume", key: f.backendKey).status == 200)
            try await f.waitForDevice("delivered after the fix") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "after the fix" }
            try await eventually("running again") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "running" }
        }
    }

    @Test("4d. APNs refuses the provider token for real (its clock ahead: ExpiredProviderToken; another key under the key id: InvalidProviderToken): the app pauses with what to do, on /v1/app, /ready, the console, a warning, /metrics and app.paused; fixing it resumes")
    func providerTokenRefusalsPauseTheApp() async throws {
        let logs = LogRecords()
        try await ServerFixture.with(logger: logs.logger()) { f in
            let (a, id) = try await f.appStartsActivity(key: "order-token")
            let admin = try await ServerSetup.createKey(store: SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
            let cookie = try await ConsoleTests.signIn(f)

            /// Every surface shows the pause and its reason; returns the reason.
            func expectPaused(_ apnsReason: String, _ words: [String]) async throws -> String {
                try await eventually("the app is paused (\(apnsReason))") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
                let reason = try #require(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["reason"]?.stringValue)
                #expect(reason.contains(apnsReason) && words.allSatisfy { reason.contains($0) }, "\(reason)")
                let ready = try await f.call("GET", "/ready").json
                #expect(ready["status"] == "degraded" && ready["apps"] == nil && !ready.jsonString.contains(apnsReason), "\(ready.jsonString)")
                let detail = try await f.call("GET", "/ready", headers: [("Authorization", "Bearer \(admin)")]).json
                #expect(detail["apps"]?.arrayValue?.first?["delivery"]?["reason"]?.stringValue == reason, "\(detail.jsonString)")
                let console = try await ConsoleTests.send(f, "GET", "/console", cookie: cookie).text
                #expect(console.contains(apnsReason) && console.contains("refused the app"), "\(console.prefix(3000))")
                let warned = logs.records.withLock { $0 }.contains { $0.level == .warning && $0.message.contains("app paused") && $0.metadata["apns.reason"] == apnsReason }
                #expect(warned, "no warning naming \(apnsReason)")
                let metrics = try await f.call("GET", "/metrics").json.stringValue ?? ""
                #expect(metrics.contains("isle_apps_paused{cause=\"configuration\"} 1"), "\(metrics)")
                try await eventually("app.paused with \(apnsReason)") {
                    try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue?.contains {
                        $0["type"] == "app.paused" && $0["data"]?["apnsReason"] == .string(apnsReason) && $0["data"]?["cause"] == "configuration"
                    } == true
                }
                // Nothing is lost meanwhile: the activity and its job wait.
                #expect(try await view(f, id)["state"] == "active")
                return reason
            }

            // 1. A clock an hour and more behind APNs': every token looks expired.
            f.sim.apns.clockOffset = 3 * 3600
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("while expired")).status == 202)
            let expired = try await expectPaused("ExpiredProviderToken", ["clock", "POST /v1/app/resume"])
            #expect(!expired.contains("OPENSSL") && expired.contains("key \(TestProviderKey.keyID)"))
            f.sim.apns.clockOffset = 0
            #expect(try await f.call("POST", "/v1/app/resume", key: f.backendKey).status == 200)
            try await f.waitForDevice("delivered once the clock is right") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "while expired" }
            try await eventually("running again") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "running" }
            #expect(try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue?.contains { $0["type"] == "app.resumed" } == true)

            // 2. APNs knows another key under this key id (the key was replaced in the developer account).
            let replacement = TestProviderKey()
            try f.sim.apns.register(RegisteredKey(keyID: replacement.keyID, teamID: replacement.teamID, publicKeyPEM: replacement.publicKeyPEM))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("while invalid")).status == 202)
            _ = try await expectPaused("InvalidProviderToken", ["isle app add", "--key-id"])
            // The fix: the app registered again with the new key file, under the same key id.
            let store = try SQLiteStore(path: f.databasePath)
            var app = try #require(try await store.app(Pizza.bundleID))
            app.keyPEM = ServerFixture.masterKey.seal(replacement.privateKeyPEM, bundleID: Pizza.bundleID)
            try await store.upsertApp(app)
            try await eventually("delivered with the new key") {
                _ = try await f.call("POST", "/v1/app/resume", key: f.backendKey)
                return try f.deviceActivity(a.id)?.contentState["driverName"] == "while invalid"
            }
        }
    }

    @Test("4e. APNs' certificate is not signed by the CA the server trusts (isle sim restarted in a new folder): the app pauses saying which certificate and what to do, never the TLS library's chain")
    func untrustedAPNsCertificatePauses() async throws {
        let otherCA = try CertificateAuthority(commonName: "Another CA")
        try await ServerFixture.with(server: { c in
            for (environment, target) in c.apnsTargets {
                if case .custom(let url, let broadcast, let management, _) = target {
                    c.apnsTargets[environment] = .custom(url: url, broadcastURL: broadcast, managementURL: management, trustRootsPEM: otherCA.certificatePEM)
                }
            }
        }) { f in
            let (_, id) = try await f.appStartsActivity(key: "order-tls")
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("never")).status == 202)
            try await eventually("the app is paused") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
            let reason = try #require(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["reason"]?.stringValue)
            #expect(reason.contains("not signed by a CA this server trusts") && reason.contains("--apns-ca-cert") && reason.contains("ca.pem"), "\(reason)")
            for word in ["OPENSSL", "BoringSSL", ".cc", "handshakeFailed", "refused the app"] { #expect(!reason.contains(word), "\(word) in: \(reason)") }
        }
    }

    @Test("4c. BadDeviceToken for every token before any success smells of the wrong environment: the app pauses, no token dies")
    func wrongEnvironmentPauses() async throws {
        try await ServerFixture.with(configure: { $0.device.maximumActivitiesPerApp = 20; $0.device.maximumActivitiesPerDevice = 20 }) { f in
            var ids: [String] = []
            // Six installations: one installation's tokens alone never pause the app (docs/security.md).
            for i in 0..<6 { ids.append(try await f.appStartsActivity(key: "env-\(i)", installation: "env-phone-\(i)").isleID) }
            f.sim.apns.addFailure(FailureRule(status: 400, reason: "BadDeviceToken", remaining: nil))
            for id in ids { #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("x")).status == 202) }
            try await eventually("the app is paused") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["reason"]?.stringValue?.contains("environment") == true)
            for id in ids { #expect(try await view(f, id)["state"] == "active") }
        }
    }

    @Test("5a. an end without content-state does not supersede the update before it: the phone shows that update's content")
    func endWithoutContentKeepsUpdate() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-end")
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, latencyMilliseconds: 200))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.alerted("first")).status == 202)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: Self.plain("final state")).status == 202)
            #expect(try await f.call("POST", "/v1/activities/\(id)/end", key: f.backendKey, body: [:]).status == 202)
            try await f.waitForDevice("ended") { d in d.activities.first { $0.id == a.id }?.state == .ended }
            #expect(try f.deviceActivity(a.id)?.contentState["driverName"] == "final state")
            try await eventually("the server records the end") { try await view(f, id)["state"] == "ended" }
            try await expectInStep(f, id, a.id)
        }
    }

    @Test("5b. push-to-start to a user's two devices: each links its own activity; a by-key update reaches both")
    func pushToStartToSeveralDevices() async throws {
        try await ServerFixture.with { f in
            let second = f.sim.world.createDevice(name: "iPad")
            _ = try f.sim.world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema]), on: second)
            var secrets: [String] = []
            for (n, device) in [f.device, second].enumerated() {
                let token = try #require(try f.sim.world.app(Pizza.bundleID, on: device).pushToStartTokens["PizzaDeliveryAttributes"])
                let r = try await f.call("PUT", "/v1/installations/inst-\(n)", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(token)]])
                #expect(r.status == 200)
                secrets.append(try #require(r.json["installationSecret"]?.stringValue))
                #expect(try await f.call("PUT", "/v1/installations/inst-\(n)/user", key: f.backendKey, body: ["userID": "u-7"]).status == 200)
            }
            let start = try await f.call("POST", "/v1/users/u-7/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Oven"),
                "alert": ["title": "Order 7", "body": "In the oven"], "externalKey": "order-7",
            ])
            #expect(start.status == 202 && start.json["accepted"] == 2)
            var deviceActivities: [(device: String, id: String)] = []
            for (n, device) in [f.device, second].enumerated() {
                let world = f.sim.world
                try await withDeadline(.seconds(20), "the activity started on device \(n)") {
                    let changes = world.changes.subscribe()
                    if try world.device(device).activities.contains(where: { $0.startedBy == .push }) { return }
                    for await _ in changes where try world.device(device).activities.contains(where: { $0.startedBy == .push }) { return }
                }
                let started = try #require(try f.sim.world.device(device).activities.first { $0.startedBy == .push })
                let link = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: [
                    "attributesType": "PizzaDeliveryAttributes", "token": .string(try await f.sim.world.waitForPushToken(activityID: started.id, on: device)), "externalKey": "order-7", "installationID": .string("inst-\(n)"),
                ], headers: [("Isle-Installation-Secret", secrets[n])])
                #expect(link.status == 200 && link.json["installationID"] == .string("inst-\(n)"))
                deviceActivities.append((device, started.id))
            }
            f.clock.advance(by: 5)
            let update = try await f.call("POST", "/v1/activities/by-key/order-7/update", key: f.backendKey, body: Self.plain("On the way"))
            #expect(update.status == 202 && update.json["accepted"] == 2)
            for (device, activityID) in deviceActivities {
                let world = f.sim.world
                try await withDeadline(.seconds(20), "the update on \(device)") {
                    let changes = world.changes.subscribe()
                    func done() throws -> Bool { try world.device(device).activities.first { $0.id == activityID }?.contentState["driverName"] == "On the way" }
                    if try done() { return }
                    for await _ in changes where try done() { return }
                }
            }
        }
    }

    @Test("6. a second server on the same SQLite file stops at once with the reason")
    func oneProcessPerFile() async throws {
        try await ServerFixture.with { f in
            var quiet = Logger(label: "second")
            quiet.logLevel = .critical
            let second = IsleServerApp(configuration: f.configuration(), store: try SQLiteStore(path: f.databasePath), clock: f.clock, logger: quiet)
            await #expect {
                try await second.run()
            } throws: { error in
                "\(error)".contains("another isle serve is already using")
            }
            // The first one still serves.
            #expect(try await f.call("GET", "/ready").status == 200)
        }
    }
}
