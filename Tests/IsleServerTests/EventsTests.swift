import Foundation
import Hummingbird
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Logging
import Synchronization
import Testing

/// A backend's webhook endpoint on 127.0.0.1: records every request, checks its signature, and
/// answers 500 to the first `failFirst` requests.
final class WebhookReceiver: Sendable {
    struct Received: Sendable {
        var body: [UInt8]
        var signature: String
        var webhookID: String
    }
    let received = Mutex<[Received]>([])
    let failFirst: Int
    /// The status of a successful answer.
    let okStatus: HTTPResponse.Status
    let task = Mutex<Task<Void, any Error>?>(nil)
    let portBox = Mutex<(Int?, [CheckedContinuation<Int, Never>])>((nil, []))

    init(failFirst: Int = 0, okStatus: HTTPResponse.Status = .ok) {
        self.failFirst = failFirst
        self.okStatus = okStatus
    }

    func start() async -> Int {
        let router = Router()
        router.post("hook") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 10_000_000)
            let n = self.received.withLock { r -> Int in
                r.append(Received(body: Array(buffer: body), signature: request.headers[.init("Isle-Signature")!] ?? "", webhookID: request.headers[.init("Isle-Webhook-Id")!] ?? ""))
                return r.count
            }
            return Response(status: n <= self.failFirst ? .internalServerError : self.okStatus)
        }
        var logger = Logger(label: "receiver")
        logger.logLevel = .critical
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)), onServerRunning: { channel in
            let waiters = self.portBox.withLock { b -> [CheckedContinuation<Int, Never>] in
                b.0 = channel.localAddress?.port ?? 0
                defer { b.1 = [] }
                return b.1
            }
            for w in waiters { w.resume(returning: channel.localAddress?.port ?? 0) }
        }, logger: logger)
        task.withLock { $0 = Task { try await app.run() } }
        return await withCheckedContinuation { c in
            let p = portBox.withLock { b -> Int? in
                if let p = b.0 { return p }
                b.1.append(c)
                return nil
            }
            if let p { c.resume(returning: p) }
        }
    }

    func stop() { task.withLock { $0?.cancel() } }

    /// The events received (each once, in the order first received), from the requests that were answered 2xx or not.
    func eventIDs() -> [String] {
        var seen = Set<String>()
        var ids: [String] = []
        for r in received.withLock({ $0 }) {
            for e in (try? JSONParser.parse(r.body))?["events"]?.arrayValue ?? [] {
                if let id = e["id"]?.stringValue, seen.insert(id).inserted { ids.append(id) }
            }
        }
        return ids
    }
}

@Suite("Delivery events: webhooks and GET /v1/events", .serialized)
struct EventsTests {
    static func tune(_ c: inout ServerConfiguration) {
        c.webhooks.poll = 0.05
        c.webhooks.maximumBackoff = 0
    }

    @Test("a webhook gets every event of a run, signed, in order, though it answered 500 at first; the pull API returns the same sequence")
    func webhookAndPull() async throws {
        let receiver = WebhookReceiver(failFirst: 3)
        let port = await receiver.start()
        defer { receiver.stop() }
        try await ServerFixture.with(server: Self.tune) { f in
            let created = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(port)/hook")])
            #expect(created.status == 201)
            let secret = try #require(created.json["secret"]?.stringValue)
            let hookID = try #require(created.json["id"]?.stringValue)
            #expect(secret.hasPrefix("whsec_"))
            #expect(try await f.call("GET", "/v1/webhooks/\(hookID)", key: f.backendKey).json["secret"] == nil)

            // Three activities: updates delivered; one dismissed on the phone (its update gets a
            // 410: token retired); one ended by the app, as the device reports.
            var ids: [String] = []
            var shown: [SimulatedActivity] = []
            for i in 0..<3 {
                let (a, id) = try await f.appStartsActivity(key: "order-\(i)")
                ids.append(id)
                shown.append(a)
            }
            for round in 0..<3 {
                for id in ids {
                    #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: [
                        "contentState": Pizza.state("Driver \(round)"), "alert": ["title": "Update", "body": .string("round \(round)")],
                    ]).status == 202)
                }
            }
            try await eventually("9 pushes delivered") {
                try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue?.filter { $0["type"] == "push.delivered" }.count == 9
            }
            try f.sim.world.userDismiss(activityID: shown[1].id, on: f.device)
            #expect(try await f.call("POST", "/v1/activities/\(ids[1])/update", key: f.backendKey, body: ["contentState": Pizza.state("Anyone?")]).status == 202)
            // The 410 retires the token at once; the push itself fails for good once the grace for a
            // rotated token that may still be on its way is over.
            try await eventually("the token retired") {
                try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue?.contains { $0["type"] == "token.retired" } == true
            }
            f.clock.advance(by: 600)
            #expect(try await f.call("POST", "/v1/activities/\(ids[2])/ended", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            // ActivityKit changes the first one's token: the app hands it over, and the activity's
            // latest content goes to it (a push to the old one may have been lost).
            let rotated = try f.sim.world.rotateUpdateToken(activityID: shown[0].id, on: f.device)
            #expect(try await f.call("PUT", "/v1/activities/\(ids[0])/token", key: f.deviceKey, body: ["token": .string(rotated)],
                                     headers: f.secretHeader()).status == 200)

            let expected = 9 + 2 + 1 + 1 + 1  // delivered, the 410 (failed for good + token retired), ended, rotated, its refresh delivered
            @Sendable func pullAll() async throws -> [JSONValue] {
                var pulled: [JSONValue] = []
                var cursor = "0"
                while true {
                    let page = try await f.call("GET", "/v1/events?after=\(cursor)&limit=4", key: f.backendKey)
                    let events = page.json["events"]?.arrayValue ?? []
                    if events.isEmpty { return pulled }
                    pulled += events
                    cursor = page.json["next"]?.stringValue ?? cursor
                }
            }
            try await eventually("every event in the pull API") { try await pullAll().count >= expected }
            let pulled = try await pullAll()
            #expect(pulled.count == expected)
            let types = pulled.compactMap { $0["type"]?.stringValue }
            #expect(types.filter { $0 == "push.delivered" }.count == 10)
            #expect(types.contains("push.failed") && types.contains("token.retired") && types.contains("activity.ended") && types.contains("activity.token_rotated"))
            // Per activity, in the order things happened: the failed push before its token's retirement.
            let second = pulled.filter { $0["activityID"]?.stringValue == ids[1] }.compactMap { $0["type"]?.stringValue }
            #expect(Array(second.suffix(2)) == ["token.retired", "push.failed"])
            #expect(pulled.first { $0["type"] == "push.delivered" }?["data"]?["apnsID"]?.stringValue?.count == 36)

            try await eventually("the webhook caught up") { receiver.eventIDs().count == expected }
            #expect(receiver.eventIDs() == pulled.compactMap { $0["id"]?.stringValue })
            for r in receiver.received.withLock({ $0 }) {
                #expect(r.webhookID == hookID)
                #expect(WebhookSignature.verify(header: r.signature, body: r.body, secret: secret, now: f.clock.now, window: 3600), "signature \(r.signature)")
                #expect(!WebhookSignature.verify(header: r.signature, body: r.body + [0x20], secret: secret, now: f.clock.now, window: 3600))
                #expect(!WebhookSignature.verify(header: r.signature, body: r.body, secret: secret, now: f.clock.now.addingTimeInterval(3601), window: 3600))
            }
            #expect(receiver.received.withLock { $0.count } >= 4)
            try await eventually("the webhook's record shows its deliveries") {
                let view = try await f.call("GET", "/v1/webhooks", key: f.backendKey).json["webhooks"]?.arrayValue?.first
                return view?["status"] == "ok" && view?["delivered"] == .int(Int64(expected)) && view?["waiting"] == 0
            }
        }
    }

    @Test("every event about an activity names its order, installation and user as they were; a failed push carries APNs' last answer, the requests APNs saw and when it failed")
    func eventsNameTheirSubject() async throws {
        try await ServerFixture.with(server: Self.tune) { f in
            let (shown, id) = try await f.appStartsActivity(key: "order-7")
            #expect(try await f.call("PUT", "/v1/installations/fixture-phone/user", key: f.backendKey, body: ["userID": "user-42"]).status == 200)
            @Sendable func all() async throws -> [JSONValue] { try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue ?? [] }

            // Delivered: the subject on the event.
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Ana")]).status == 202)
            try await eventually("delivered") { try await all().contains { $0["type"] == "push.delivered" } }

            // A push answered 503, retried, then answered 410 (the person dismissed it meanwhile):
            // its token retires at once, the push fails for good after the grace for a rotated token.
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 1))
            let acceptedAt = f.clock.now
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Bo")]).status == 202)
            try await eventually("the 503") { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.last?["status"] == 503 }
            try f.sim.world.userDismiss(activityID: shown.id, on: f.device)
            // The installation's user changes between the facts: each event keeps the one of its moment.
            try await eventually(within: .seconds(30), "the token retired") {
                if try await all().contains(where: { $0["type"] == "token.retired" }) { return true }
                f.clock.advance(by: 1)
                return false
            }
            #expect(try await f.call("PUT", "/v1/installations/fixture-phone/user", key: f.backendKey, body: ["userID": "user-43"]).status == 200)
            f.clock.advance(by: 600)
            let failedAt = f.clock.now
            try await eventually("the push failed for good") { try await all().contains { $0["type"] == "push.failed" } }

            let events = try await all()
            let about = events.filter { $0["activityID"]?.stringValue == id }
            // The 503 is retried, and told (push.retrying, once), before the 410 retires the token.
            #expect(about.map { $0["type"]?.stringValue ?? "" } == ["push.delivered", "push.retrying", "token.retired", "push.failed"])
            let retrying = try #require(about.first { $0["type"] == "push.retrying" })
            #expect(retrying["data"]?["status"] == 503 && retrying["data"]?["apnsReason"] == "ServiceUnavailable" && retrying["data"]?["retryAt"] != nil, "\(retrying)")
            for e in about {
                #expect(e["externalKey"] == "order-7", "\(e)")
                #expect(e["installationID"] == "fixture-phone", "\(e)")
            }
            // Each names the user bound when it happened: the push failed after the new binding.
            #expect(about.map { $0["userID"] } == ["user-42", "user-42", "user-42", "user-43"])
            let failed = try #require(about.last)
            // APNs' last answer, though the attempt that gave up sent nothing; two requests (503, 410).
            #expect(failed["data"]?["status"] == 410)
            #expect(failed["data"]?["apnsReason"] == "Unregistered")
            #expect(failed["data"]?["attempts"] == 2)
            // When it failed, not when it was accepted: after the grace, not a second before the retirement.
            let at = try #require(failed["at"]?.numberValue?.int64Value)
            #expect(at >= Int64(failedAt.timeIntervalSince1970.rounded(.down)))
            #expect(at > Int64(acceptedAt.timeIntervalSince1970) + 30)
            let retiredAt = try #require(about[1]["at"]?.numberValue?.int64Value)
            #expect(at >= retiredAt)
            #expect(about[0]["data"]?["attempts"] == 1)

            // A device's report names the user bound now.
            let (_, second) = try await f.appStartsActivity(key: "order-8")
            #expect(try await f.call("POST", "/v1/activities/\(second)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the dismissal's event") { try await all().contains { $0["type"] == "activity.dismissed" } }
            let dismissed = try #require(try await all().first { $0["type"] == "activity.dismissed" })
            #expect(dismissed["externalKey"] == "order-8" && dismissed["installationID"] == "fixture-phone" && dismissed["userID"] == "user-43")
            // Deleting the installation unbinds its user and ends its activities: their events name
            // the user it had.
            let (_, third) = try await f.appStartsActivity(key: "order-9")
            #expect(try await f.call("DELETE", "/v1/installations/fixture-phone", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            let ended = try #require(try await all().first { $0["type"] == "activity.ended" && $0["activityID"]?.stringValue == third })
            #expect(ended["userID"] == "user-43" && ended["externalKey"] == "order-9" && ended["data"]?["source"] == "installationDeleted")
        }
    }

    @Test("webhooks managed: a filter, update, disable and enable, secret rotation with an overlap, a log of attempts, replay from a cursor, redelivery of one event, all audited")
    func webhooksManaged() async throws {
        let receiver = WebhookReceiver()
        let port = await receiver.start()
        defer { receiver.stop() }
        try await ServerFixture.with(server: Self.tune) { f in
            @Sendable func types() -> [String] {
                receiver.received.withLock { $0 }.flatMap { (try? JSONParser.parse($0.body))?["events"]?.arrayValue ?? [] }.compactMap { $0["type"]?.stringValue }
            }
            // Events of a type received, each once (a batch may come again: at least once).
            @Sendable func distinct(_ type: String) -> Int {
                Set(receiver.received.withLock { $0 }.flatMap { (try? JSONParser.parse($0.body))?["events"]?.arrayValue ?? [] }
                    .filter { $0["type"]?.stringValue == type }.compactMap { $0["id"]?.stringValue }).count
            }
            let created = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(port)/hook"), "eventTypes": ["activity.dismissed", "push.failed"]])
            #expect(created.status == 201 && created.json["eventTypes"] == ["activity.dismissed", "push.failed"] && created.json["enabled"] == true)
            let hook = try #require(created.json["id"]?.stringValue)
            let oldSecret = try #require(created.json["secret"]?.stringValue)

            // The filter: a delivered push is passed over, the dismissal arrives; nothing waits.
            let (_, a1) = try await f.appStartsActivity(key: "order-1")
            #expect(try await f.call("POST", "/v1/activities/\(a1)/update", key: f.backendKey, body: ["contentState": Pizza.state("Ana")]).status == 202)
            try await eventually("delivered") { try await f.call("GET", "/v1/events?limit=100", key: f.backendKey).json["events"]?.arrayValue?.contains { $0["type"] == "push.delivered" } == true }
            #expect(try await f.call("POST", "/v1/activities/\(a1)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the dismissal arrived") { types() == ["activity.dismissed"] }
            try await eventually("nothing waits") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["waiting"] == 0 }

            // Every type again; the secret rotated with an hour's overlap: both secrets sign.
            let changed = try await f.call("PATCH", "/v1/webhooks/\(hook)", key: f.backendKey, body: ["eventTypes": nil])
            #expect(changed.status == 200 && changed.json["eventTypes"] == .null)
            let rotated = try await f.call("POST", "/v1/webhooks/\(hook)/rotate-secret", key: f.backendKey, body: ["overlapSeconds": 3600])
            #expect(rotated.status == 200)
            let newSecret = try #require(rotated.json["secret"]?.stringValue)
            #expect(newSecret != oldSecret && rotated.json["previousSecretValidUntil"]?.numberValue != nil)
            let (_, a2) = try await f.appStartsActivity(key: "order-2")
            #expect(try await f.call("POST", "/v1/activities/\(a2)/update", key: f.backendKey, body: ["contentState": Pizza.state("Bo")]).status == 202)
            try await eventually("the delivery arrived") { types().contains("push.delivered") }
            let overlapping = try #require(receiver.received.withLock { $0.last })
            #expect(WebhookSignature.verify(header: overlapping.signature, body: overlapping.body, secret: newSecret, now: f.clock.now))
            #expect(WebhookSignature.verify(header: overlapping.signature, body: overlapping.body, secret: oldSecret, now: f.clock.now))
            // A rotation retried (its answer lost): the secret receivers still hold stays valid,
            // the one in between is dropped.
            let retried = try await f.call("POST", "/v1/webhooks/\(hook)/rotate-secret", key: f.backendKey, body: ["overlapSeconds": 3600])
            let newestSecret = try #require(retried.json["secret"]?.stringValue)
            #expect(try await f.call("POST", "/v1/activities/\(a2)/update", key: f.backendKey, body: ["contentState": Pizza.state("Cy")]).status == 202)
            try await eventually("the second delivery arrived") { distinct("push.delivered") == 2 }
            let twice = try #require(receiver.received.withLock { $0.last })
            #expect(WebhookSignature.verify(header: twice.signature, body: twice.body, secret: newestSecret, now: f.clock.now))
            #expect(WebhookSignature.verify(header: twice.signature, body: twice.body, secret: oldSecret, now: f.clock.now))
            #expect(!WebhookSignature.verify(header: twice.signature, body: twice.body, secret: newSecret, now: f.clock.now))
            // After the overlap only the new secret signs.
            f.clock.advance(by: 3700)
            #expect(try await f.call("POST", "/v1/activities/\(a2)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the second dismissal arrived") { distinct("activity.dismissed") == 2 }
            let after = try #require(receiver.received.withLock { $0.last })
            #expect(WebhookSignature.verify(header: after.signature, body: after.body, secret: newestSecret, now: f.clock.now))
            #expect(!WebhookSignature.verify(header: after.signature, body: after.body, secret: oldSecret, now: f.clock.now))

            // Disabled: nothing is sent, the stream says so; enabled: what waited arrives. (A second
            // webhook, enabled, shows when the dispatcher has had the event to send.)
            let witness = WebhookReceiver(okStatus: .noContent)
            let witnessPort = await witness.start()
            defer { witness.stop() }
            let witnessHook = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(witnessPort)/hook"), "eventTypes": ["activity.dismissed"]])
            #expect(witnessHook.status == 201)
            // Caught up first: a change during a round refuses that round's progress, and its last
            // batch would be sent again (at least once).
            try await eventually("caught up") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["waiting"] == 0 }
            let disabled = try await f.call("PATCH", "/v1/webhooks/\(hook)", key: f.backendKey, body: ["enabled": false])
            #expect(disabled.status == 200 && disabled.json["status"] == "disabled" && disabled.json["enabled"] == false)
            let sentBefore = receiver.received.withLock { $0.count }
            let (_, a3) = try await f.appStartsActivity(key: "order-3")
            #expect(try await f.call("POST", "/v1/activities/\(a3)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            let stream = try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue ?? []
            let notice = try #require(stream.first { $0["type"] == "webhook.disabled" })
            #expect(notice["data"]?["webhookID"]?.stringValue == hook && notice["data"]?["source"] == "api")
            try await eventually("the witness got the dismissal") { witness.eventIDs().count == 1 }
            // Its log keeps what the endpoint answered: 204 is a success, and says 204.
            let witnessID = try #require(witnessHook.json["id"]?.stringValue)
            try await eventually("the witness's attempt logged") {
                try await f.call("GET", "/v1/webhooks/\(witnessID)/attempts", key: f.backendKey).json["attempts"]?.arrayValue?.first?["status"] == 204
            }
            #expect(try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["waiting"] == 2)
            #expect(receiver.received.withLock { $0.count } == sentBefore)
            #expect(try await f.call("PATCH", "/v1/webhooks/\(hook)", key: f.backendKey, body: ["enabled": true]).json["enabled"] == true)
            try await eventually("what waited arrived") { types().suffix(2) == ["webhook.disabled", "activity.dismissed"] }

            // The log of attempts, newest first.
            // (An attempt is written once its answer is in: the receiver may count a request first.)
            try await eventually("every request in the log") {
                try await f.call("GET", "/v1/webhooks/\(hook)/attempts?limit=50", key: f.backendKey).json["attempts"]?.arrayValue?.count == receiver.received.withLock { $0.count }
            }
            let log = try await f.call("GET", "/v1/webhooks/\(hook)/attempts?limit=50", key: f.backendKey).json["attempts"]?.arrayValue ?? []
            #expect(log.allSatisfy { $0["status"] == 200 && $0["kind"] == "delivery" && ($0["events"]?.numberValue?.int64Value ?? 0) >= 1 })
            #expect(log.first?["lastEventID"]?.stringValue != nil && log.first?["at"]?.numberValue != nil && log.first?["latencyMS"]?.numberValue != nil)

            // Replay from a cursor: the events after it come again, in order, with their ids.
            let all = try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue ?? []
            let firstID = try #require(all.first?["id"]?.stringValue)
            @Sendable func sent() -> [String] {
                receiver.received.withLock { $0 }.flatMap { (try? JSONParser.parse($0.body))?["events"]?.arrayValue ?? [] }.compactMap { $0["id"]?.stringValue }
            }
            let lastID = try #require(all.last?["id"]?.stringValue)
            let sentBefore2 = sent()
            let replay = try await f.call("POST", "/v1/webhooks/\(hook)/replay", key: f.backendKey, body: ["after": "0"])
            #expect(replay.status == 200 && replay.json["cursor"] == "0")
            // Every event since the start, in order (the first one filtered out at the time too).
            try await eventually("the replay arrived") { sent().count >= sentBefore2.count + all.count && sent().last == lastID }
            #expect(Array(sent().suffix(all.count)) == all.compactMap { $0["id"]?.stringValue })
            #expect(sent().contains(firstID))

            // Redeliver one event, whatever the cursor.
            let redelivered = try await f.call("POST", "/v1/webhooks/\(hook)/redeliver", key: f.backendKey, body: ["eventID": .string(firstID)])
            #expect(redelivered.status == 200 && redelivered.json["status"] == 200 && redelivered.json["delivered"] == true)
            #expect(try await f.call("GET", "/v1/webhooks/\(hook)/attempts?limit=1", key: f.backendKey).json["attempts"]?.arrayValue?.first?["kind"] == "redelivery")

            // Refusals name the field.
            for (method, path, body, status, field) in [
                ("PATCH", "/v1/webhooks/\(hook)", ["eventTypes": []] as JSONValue, 400, "eventTypes"),
                ("PATCH", "/v1/webhooks/\(hook)", ["eventTypes": ["push.nope"]], 400, "eventTypes[0]"),
                ("PATCH", "/v1/webhooks/\(hook)", ["enabled": "yes"], 400, "enabled"),
                ("PATCH", "/v1/webhooks/\(hook)", [:], 400, "body"),
                ("PATCH", "/v1/webhooks/\(hook)", ["secret": "x"], 400, "secret"),
                ("POST", "/v1/webhooks/\(hook)/rotate-secret", ["overlapSeconds": 604_801], 400, "overlapSeconds"),
                ("POST", "/v1/webhooks/\(hook)/replay", ["after": "99999999"], 422, "after"),
                ("POST", "/v1/webhooks/\(hook)/replay", ["after": "x"], 400, "after"),
                ("POST", "/v1/webhooks/\(hook)/redeliver", ["eventID": "evt_99999999"], 404, nil),
                ("POST", "/v1/webhooks/\(hook)/redeliver", ["eventID": "1"], 400, "eventID"),
            ] as [(String, String, JSONValue, Int, String?)] {
                let r = try await f.call(method, path, key: f.backendKey, body: body)
                #expect(r.status == status, "\(method) \(path) \(body.jsonString): \(r.json)")
                if let field { #expect(r.json["error"]?["field"]?.stringValue == field, "\(body.jsonString): \(r.json)") }
            }
            #expect(try await f.call("PATCH", "/v1/webhooks/wh_nope", key: f.backendKey, body: ["enabled": false]).status == 404)
            #expect(try await f.call("PATCH", "/v1/webhooks/\(hook)", key: f.deviceKey, body: ["enabled": false]).status == 403)

            // Every change is audited under the key that made it.
            let audit = try await SQLiteStore(path: f.databasePath).auditLog(bundleID: Pizza.bundleID, before: nil, limit: 100).map(\.action)
            for action in ["webhook.create", "webhook.update", "webhook.rotate", "webhook.replay", "webhook.redeliver"] { #expect(audit.contains(action), "\(action)") }
        }
    }

    @Test("a webhook whose host the server refuses at sending time is failing, its attempts say why, and it is disabled in time too")
    func webhookRefusedHostDisabled() async throws {
        try await ServerFixture.with(server: { c in
            Self.tune(&c)
            c.webhooks.disableAfter = 600
            c.webhooks.allowPrivate = false
        }) { f in
            // A webhook made under looser rules (written straight to the store: the API would refuse
            // it now) obeys the server's rules at each round: loopback is refused, nothing is sent.
            let hook = "wh_loose"
            try await f.server.app.store.insertWebhook(WebhookRecord(id: hook, bundleID: Pizza.bundleID, url: "http://127.0.0.1:9/hook", secret: "whsec_x", createdAt: f.clock.now,
                                                                     cursor: try await f.server.app.store.lastEventSeq(bundleID: Pizza.bundleID)))
            let (_, id) = try await f.appStartsActivity(key: "order-z")
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("failing") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["status"] == "failing" }
            let attempt = try #require(try await f.call("GET", "/v1/webhooks/\(hook)/attempts", key: f.backendKey).json["attempts"]?.arrayValue?.first)
            #expect(attempt["status"] == 0 && attempt["events"] == 0 && attempt["error"]?.stringValue?.isEmpty == false, "\(attempt)")
            f.clock.advance(by: 601)
            try await eventually("disabled") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["status"] == "disabled" }
            let events = try await f.call("GET", "/v1/events?limit=100", key: f.backendKey).json["events"]?.arrayValue ?? []
            #expect(events.contains { $0["type"] == "webhook.disabled" && $0["data"]?["source"] == "failures" })
        }
    }

    @Test("a webhook failing longer than --webhook-disable-after is disabled, and the stream says so")
    func webhookDisabledAfterFailing() async throws {
        let receiver = WebhookReceiver(failFirst: .max)
        let port = await receiver.start()
        defer { receiver.stop() }
        try await ServerFixture.with(server: { c in
            Self.tune(&c)
            c.webhooks.disableAfter = 600
        }) { f in
            let created = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(port)/hook")])
            let hook = try #require(created.json["id"]?.stringValue)
            let (_, id) = try await f.appStartsActivity(key: "order-x")
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("failing") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["status"] == "failing" }
            #expect(try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["enabled"] == true)
            // Ten minutes of failures later, the next failure disables it.
            f.clock.advance(by: 601)
            try await eventually("disabled") { try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json["status"] == "disabled" }
            let view = try await f.call("GET", "/v1/webhooks/\(hook)", key: f.backendKey).json
            #expect(view["disabledReason"]?.stringValue?.contains("failing since") == true)
            let events = try await f.call("GET", "/v1/events?limit=100", key: f.backendKey).json["events"]?.arrayValue ?? []
            let notice = try #require(events.first { $0["type"] == "webhook.disabled" })
            #expect(notice["data"]?["source"] == "failures" && notice["data"]?["webhookID"]?.stringValue == hook)
            // Disabled, it is not tried again (a second webhook shows when the dispatcher had more to send).
            let tries = receiver.received.withLock { $0.count }
            let witness = WebhookReceiver()
            let witnessPort = await witness.start()
            defer { witness.stop() }
            #expect(try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(witnessPort)/hook")]).status == 201)
            f.clock.advance(by: 3600)
            let (_, other) = try await f.appStartsActivity(key: "order-y")
            #expect(try await f.call("POST", "/v1/activities/\(other)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            try await eventually("the witness got the dismissal") { witness.eventIDs().count == 1 }
            #expect(receiver.received.withLock { $0.count } == tries)
        }
    }

    @Test("a long poll answers with the first event as it is written")
    func longPoll() async throws {
        try await ServerFixture.with(server: Self.tune) { f in
            let (_, id) = try await f.appStartsActivity(key: "order-lp")
            let start = try await f.call("GET", "/v1/events?after=latest", key: f.backendKey)
            let cursor = try #require(start.json["next"]?.stringValue)
            async let polled = f.call("GET", "/v1/events?after=\(cursor)&wait=30", key: f.backendKey)
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            let answer = try await polled
            #expect(answer.status == 200)
            #expect(answer.json["events"]?.arrayValue?.map { $0["type"] } == ["activity.dismissed"])
            #expect(answer.json["events"]?.arrayValue?.first?["data"]?["source"] == "device")
            // Nothing after it: a poll without wait answers at once, empty, with the same cursor.
            let next = try #require(answer.json["next"]?.stringValue)
            let empty = try await f.call("GET", "/v1/events?after=\(next)", key: f.backendKey)
            #expect(empty.json["events"] == [] && empty.json["next"]?.stringValue == next)
        }
    }

    @Test("bad requests name the field; webhooks are per app and bounded")
    func refusals() async throws {
        try await ServerFixture.with(server: Self.tune) { f in
            for (path, field) in [("/v1/events?after=abc", "after"), ("/v1/events?limit=0", "limit"), ("/v1/events?limit=1001", "limit"), ("/v1/events?wait=31", "wait"), ("/v1/events?wait=nan", "wait")] {
                let r = try await f.call("GET", path, key: f.backendKey)
                #expect(r.status == 400 && r.json["error"]?["field"]?.stringValue == field, "\(path): \(r.json)")
            }
            for url in ["ftp://127.0.0.1/x", "127.0.0.1:9/x", "http:///nohost", "http://127.0.0.1/x#frag", ""] {
                let r = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string(url)])
                #expect(r.status == 400 && r.json["error"]?["field"] == "url", "\(url): \(r.json)")
            }
            let unknown = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": "http://127.0.0.1:9/x", "events": ["push.delivered"]])
            #expect(unknown.status == 400 && unknown.json["error"]?["field"] == "events")
            // The device key may not read events or manage webhooks.
            #expect(try await f.call("GET", "/v1/events", key: f.deviceKey).status == 403)
            #expect(try await f.call("POST", "/v1/webhooks", key: f.deviceKey, body: ["url": "http://127.0.0.1:9/x"]).status == 403)
            var made: [String] = []
            for i in 0..<10 {  // an app's most
                let r = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:9/x\(i)")])
                #expect(r.status == 201)
                if let id = r.json["id"]?.stringValue { made.append(id) }
            }
            let over = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": "http://127.0.0.1:9/y"])
            #expect(over.status == 409 && over.json["error"]?["code"] == "tooManyWebhooks")
            #expect(try await f.call("GET", "/v1/webhooks/wh_nope", key: f.backendKey).status == 404)
            #expect(try await f.call("DELETE", "/v1/webhooks/\(made[0])", key: f.backendKey).json["deleted"] == true)
            #expect(try await f.call("DELETE", "/v1/webhooks/\(made[0])", key: f.backendKey).status == 404)
            // An endpoint that cannot be reached shows its failure (the closed port 9).
            let (_, id) = try await f.appStartsActivity(key: "order-fail")
            #expect(try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: f.secretHeader()).status == 200)
            let failing = made[1]
            try await eventually("the unreachable endpoint reports its failure") {
                let view = try await f.call("GET", "/v1/webhooks/\(failing)", key: f.backendKey).json
                return view["status"] == "failing" && view["failure"]?["status"] == 0 && view["failure"]?["error"]?.stringValue?.isEmpty == false && view["waiting"] == 1
            }
        }
    }

    @Test("--webhook-hosts: a webhook may point only at the hosts the operator named (422 naming them); --max-event-wait caps a long poll")
    func allowedHosts() async throws {
        try await ServerFixture.with(server: { c in
            Self.tune(&c)
            c.webhooks.allowedHosts = ["127.0.0.1", "*.hooks.example.com"]
            c.webhooks.maximumPollWait = 0.2
        }) { f in
            for (url, status) in [("http://127.0.0.1:9/in", 201), ("https://a.hooks.example.com/in", 201), ("https://hooks.example.com/in", 422),
                                  ("http://169.254.169.254/latest/meta-data", 422), ("http://localhost:9/in", 422), ("https://evilhooks.example.com/in", 422)] {
                let r = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string(url)])
                #expect(r.status == status, "\(url): \(r.json)")
                if status == 422 {
                    #expect(r.json["error"]?["code"] == "webhookHostNotAllowed" && r.json["error"]?["message"]?.stringValue?.contains("*.hooks.example.com") == true)
                }
            }
            // The poll asked for 30 s and got the server's cap: an empty answer, not a 30 s wait
            // (the suite would notice the latter only as slowness, so the answer's content is checked).
            let r = try await f.call("GET", "/v1/events?after=latest&wait=30", key: f.backendKey)
            #expect(r.status == 200 && r.json["events"] == [])
        }
    }
}
