import AsyncHTTPClient
import Foundation
import IsleCore
@testable import IsleServer
import IsleStore
import IsleDelivery
import IsleTesting
import NIOCore
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Trust v3 (docs/security.md): one abuser cannot hurt the fleet, and a webhook cannot reach inside.
@Suite("Trust v3: limits in the right order, registration quotas and retention, webhooks that cannot reach inside, connections bounded", .serialized)
struct TrustV3Tests {
    static func behindProxy(_ c: inout ServerConfiguration) {
        c.trustedProxies = [AddressRange("127.0.0.1")!]
    }

    @Test("a flooding address spends only its own allowance: a genuine device at another address is not refused by the fleet's")
    func floodCostsTheFleetNothing() async throws {
        try await ServerFixture.with(server: { c in
            Self.behindProxy(&c)
            c.deviceAddressLimit = RateLimit(perSecond: 0.001, burst: 5)
            // The fleet's allowance: 12 requests; the flood alone would spend it under the old order.
            c.rateLimits[.device] = RateLimit(perSecond: 0.001, burst: 12)
        }) { f in
            var flood: [Int] = []
            for i in 0..<40 {
                flood.append(try await f.call("PUT", "/v1/installations/flood-\(i)", key: f.deviceKey, body: [:], headers: [("X-Forwarded-For", "203.0.113.66")]).status)
            }
            #expect(flood.filter { $0 == 200 }.count == 5 && flood.filter { $0 == 429 }.count == 35, "\(flood)")
            // The fleet spent 5 of its 12: the genuine device's 5 go through.
            for i in 0..<5 {
                let r = try await f.call("PUT", "/v1/installations/genuine-\(i)", key: f.deviceKey, body: [:], headers: [("X-Forwarded-For", "198.51.100.7")])
                #expect(r.status == 200, "genuine \(i): \(r.json.jsonString)")
            }
        }
    }

    @Test("requests without an installation's secret never throttle it: the owner's own request still passes")
    func othersCannotThrottleAnInstallation() async throws {
        try await ServerFixture.with(server: { c in c.deviceInstallationLimit = RateLimit(perSecond: 0.001, burst: 3) }) { f in
            let secret = try await f.installation("victim")
            var answers: [Int] = []
            for _ in 0..<10 { answers.append(try await f.call("DELETE", "/v1/installations/victim", key: f.deviceKey).status) }
            for _ in 0..<5 { answers.append(try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: [:], headers: [("Isle-Installation-Secret", String(repeating: "x", count: 40))]).status) }
            #expect(answers.contains(429) && !answers.contains(200), "\(answers)")
            let own = try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: ["liveActivitiesEnabled": true], headers: [("Isle-Installation-Secret", secret)])
            #expect(own.status == 200, "\(own.json.jsonString)")
        }
    }

    @Test("one address creates at most its hourly allowance of installations and activities (429 quotaExceeded); reports and other addresses are not counted")
    func creationQuotas() async throws {
        try await ServerFixture.with(server: { c in
            Self.behindProxy(&c)
            c.quotas.newInstallationsPerAddressPerHour = 3
            c.quotas.newActivitiesPerAddressPerHour = 2
        }) { f in
            let from = [("X-Forwarded-For", "203.0.113.9")]
            var secrets: [String] = []
            for i in 0..<3 {
                let r = try await f.call("PUT", "/v1/installations/q-\(i)", key: f.deviceKey, body: [:], headers: from)
                #expect(r.status == 200)
                secrets.append(r.json["installationSecret"]?.stringValue ?? "")
            }
            let fourth = try await f.call("PUT", "/v1/installations/q-3", key: f.deviceKey, body: [:], headers: from)
            #expect(fourth.status == 429 && fourth.json["error"]?["code"] == "quotaExceeded" && fourth.retryAfter != nil, "\(fourth.json.jsonString)")
            // A known installation's report is not a creation.
            #expect(try await f.call("PUT", "/v1/installations/q-0", key: f.deviceKey, body: ["liveActivitiesEnabled": true], headers: from + [("Isle-Installation-Secret", secrets[0])]).status == 200)
            #expect(try await f.call("PUT", "/v1/installations/q-3", key: f.deviceKey, body: [:], headers: [("X-Forwarded-For", "198.51.100.1")]).status == 200)
            // A third of an hour later, one more.
            f.clock.advance(by: 1_201)
            #expect(try await f.call("PUT", "/v1/installations/q-4", key: f.deviceKey, body: [:], headers: from).status == 200)

            func activity(_ n: Int) async throws -> Int {
                try await f.call("POST", "/v1/activities", key: f.deviceKey, body: [
                    "installationID": "q-0", "attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "\(n % 10)", count: 64)),
                    "attributes": Pizza.attributes, "contentState": Pizza.state("x"),
                ], headers: from + [("Isle-Installation-Secret", secrets[0])]).status
            }
            let created = [try await activity(1), try await activity(2), try await activity(3)]
            #expect(created == [201, 201, 429], "\(created)")
        }
    }

    @Test("retention: live activities nothing was pushed to, and installations with no user and no activity, are deleted; useful ones stay")
    func unusedRegistrationsPruned() async throws {
        try await ServerFixture.with { f in
            // Useful: an activity that got a push, on an installation with a user.
            let (_, used) = try await f.appStartsActivity(key: "used")
            #expect(try await f.call("POST", "/v1/activities/\(used)/update", key: f.backendKey, body: ["contentState": Pizza.state("y")]).status == 202)
            try await f.waitForDevice("the update") { d in d.activities.contains { $0.contentState["driverName"] == "y" } }
            // Never useful: an installation and its activity nobody pushed to.
            let secret = try await f.installation("junk")
            let junk = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: [
                "installationID": "junk", "attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "e", count: 64)),
                "attributes": Pizza.attributes, "contentState": Pizza.state("x"),
            ], headers: [("Isle-Installation-Secret", secret)])
            let junkID = try #require(junk.json["id"]?.stringValue)
            try await f.installation("bound")
            #expect(try await f.call("PUT", "/v1/installations/bound/user", key: f.backendKey, body: ["userID": "u1"]).status == 200)
            try await f.installation("empty")

            f.clock.advance(by: 86_400 + 60)
            _ = try await f.server.app.store.prune(now: f.clock.now, retention: f.server.app.configuration.retention, limit: 1_000)
            #expect(try await f.call("GET", "/v1/activities/\(junkID)", key: f.backendKey).status == 404)
            #expect(try await f.call("GET", "/v1/activities/\(used)", key: f.backendKey).status == 200)
            f.clock.advance(by: 7 * 86_400)
            _ = try await f.server.app.store.prune(now: f.clock.now, retention: f.server.app.configuration.retention, limit: 1_000)
            let store = f.server.app.store
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: "empty") == nil)
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: "junk") == nil)
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: "bound") != nil)
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: "fixture-phone") != nil)
        }
    }

    @Test("webhook addresses: loopback, private, link-local, mapped and numeric forms refused; every resolved address checked; an operator's named host may be private")
    func webhookAddressRules() async throws {
        var settings = WebhookSettings()
        func kind(_ text: String) -> WebhookTarget.Kind { WebhookTarget.kind(WebhookTarget.parse(text)!) }
        #expect(kind("127.0.0.1") == .loopback && kind("::1") == .loopback && kind("10.1.2.3") == .privateNetwork && kind("172.31.0.1") == .privateNetwork)
        #expect(kind("192.168.0.1") == .privateNetwork && kind("169.254.169.254") == .linkLocal && kind("fe80::1") == .linkLocal && kind("fd00::1") == .privateNetwork)
        #expect(kind("::ffff:127.0.0.1") == .loopback && kind("64:ff9b::a9fe:a9fe") == .linkLocal && kind("2002:7f00:1::") == .loopback)
        #expect(kind("0.0.0.0") == .unspecified && kind("224.0.0.1") == .multicast && kind("ff02::1") == .multicast && kind("100.64.0.1") == .sharedNAT)
        #expect(kind("93.184.216.34") == .global && kind("2606:4700::1111") == .global && kind("172.32.0.1") == .global)
        let stub: @Sendable (String) async throws -> [[UInt8]] = { host in
            switch host {
            case "rebind.example": return [WebhookTarget.parse("93.184.216.34")!, WebhookTarget.parse("127.0.0.1")!]
            case "public.example": return [WebhookTarget.parse("93.184.216.34")!]
            case "inside.example": return [WebhookTarget.parse("10.0.0.8")!]
            default: throw WebhookTarget.Refusal(code: "webhookHostUnresolvable", message: "no")
            }
        }
        func check(_ url: String) async -> String {
            switch await WebhookTarget.check(url: url, settings: settings, resolve: stub) {
            case .success(let t): return "ok " + t.address
            case .failure(let r): return r.code
            }
        }
        #expect(await check("https://public.example/in") == "ok 93.184.216.34")
        #expect(await check("https://rebind.example/in") == "webhookAddressNotAllowed")
        #expect(await check("https://inside.example/in") == "webhookAddressNotAllowed")
        #expect(await check("http://[::1]:9/in") == "webhookAddressNotAllowed")
        #expect(await check("http://nowhere.example/in") == "webhookHostUnresolvable")
        settings.allowedHosts = ["inside.example"]
        #expect(await check("https://inside.example/in") == "ok 10.0.0.8")
        #expect(await check("https://public.example/in") == "webhookHostNotAllowed")
        settings.allowedHosts = nil
        settings.allowPrivate = true
        #expect(await check("http://[::1]:9/in") == "ok ::1")
        #expect(await check("http://224.0.0.1/in") == "webhookAddressNotAllowed")
    }

    @Test("the API refuses webhooks inside by default (422), names resolving there too; a webhook made before the rule is refused when sending, and says only 'refused'")
    func webhooksCannotReachInside() async throws {
        let receiver = WebhookReceiver()
        let port = await receiver.start()
        defer { receiver.stop() }
        try await ServerFixture.with(server: { c in
            EventsTests.tune(&c)
            c.webhooks.allowPrivate = false
        }) { f in
            for url in ["http://127.0.0.1:\(port)/hook", "http://[::1]:\(port)/hook", "http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data",
                        "http://localhost:\(port)/hook", "http://[::ffff:127.0.0.1]:\(port)/hook", "http://2130706433:\(port)/hook", "http://0.0.0.0:\(port)/hook"] {
                let r = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string(url)])
                #expect(r.status == 422 && r.json["error"]?["code"] == "webhookAddressNotAllowed", "\(url): \(r.json.jsonString)")
            }
            // One made when the rules allowed it (here: written straight to the store).
            let hook = WebhookRecord(id: "wh_old", bundleID: Pizza.bundleID, url: "http://127.0.0.1:\(port)/hook", secret: "whsec_x", createdAt: f.clock.now,
                                     cursor: try await f.server.app.store.lastEventSeq(bundleID: Pizza.bundleID))
            try await f.server.app.store.insertWebhook(hook)
            let (_, event) = try await f.appStartsActivity(key: "event")
            #expect(try await f.call("POST", "/v1/activities/\(event)/update", key: f.backendKey, body: ["contentState": Pizza.state("e")]).status == 202)
            // The webhook's state has no change feed: its view is read until it shows the refusal.
            try await eventually(within: .seconds(20), "the old webhook refused") {
                try await f.call("GET", "/v1/webhooks/wh_old", key: f.backendKey).json["failure"]?["error"]?.stringValue != nil
            }
            let error = try await f.call("GET", "/v1/webhooks/wh_old", key: f.backendKey).json["failure"]?["error"]?.stringValue ?? ""
            #expect(error.hasPrefix("refused:") && !error.contains("errno"), "\(error)")
            #expect(receiver.received.withLock { $0.isEmpty })
        }
    }

    @Test("a webhook stops when the key that made it is revoked; API-made webhooks are audited; a failure shows no errno; a long poll outliving its key's revocation answers 401")
    func webhooksFollowTheirKey() async throws {
        let kept = WebhookReceiver()
        let stopped = WebhookReceiver()
        let keptPort = await kept.start()
        let stoppedPort = await stopped.start()
        defer { kept.stop(); stopped.stop() }
        try await ServerFixture.with(server: EventsTests.tune) { f in
            let store = f.server.app.store
            let second = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .backend)
            let doomed = try await f.call("POST", "/v1/webhooks", key: second.secret, body: ["url": .string("http://127.0.0.1:\(stoppedPort)/hook")])
            #expect(doomed.status == 201 && doomed.json["keyID"]?.stringValue == second.id)
            let doomedID = try #require(doomed.json["id"]?.stringValue)
            #expect(try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:\(keptPort)/hook")]).status == 201)
            let closed = try await f.call("POST", "/v1/webhooks", key: f.backendKey, body: ["url": .string("http://127.0.0.1:9/closed")])
            let closedID = try #require(closed.json["id"]?.stringValue)
            let audit = try await store.auditLog(bundleID: Pizza.bundleID, before: nil, limit: 10)
            #expect(audit.filter { $0.action == "webhook.create" }.count == 3 && audit.contains { $0.keyID == second.id && $0.target == doomedID })

            // A long poll with the second key, then its revocation.
            let poll = Task { try await f.call("GET", "/v1/events?after=latest&wait=10", key: second.secret) }
            #expect(try await store.revokeAPIKey(id: second.id, at: f.clock.now))
            f.clock.advance(by: 2)
            let (_, event) = try await f.appStartsActivity(key: "after-revoke")
            #expect(try await f.call("POST", "/v1/activities/\(event)/update", key: f.backendKey, body: ["contentState": Pizza.state("e")]).status == 202)
            let answer = try await poll.value
            #expect(answer.status == 401, "\(answer.json.jsonString)")
            try await eventually(within: .seconds(20), "the kept webhook's delivery, and the closed port's failure") {
                let failing = try await f.call("GET", "/v1/webhooks/\(closedID)", key: f.backendKey).json["failure"] != nil
                return failing && !kept.received.withLock({ $0.isEmpty })
            }
            #expect(stopped.received.withLock { $0.isEmpty })
            let view = try await f.call("GET", "/v1/webhooks/\(doomedID)", key: f.backendKey).json
            #expect(view["status"] == "stopped", "\(view.jsonString)")
            let failure = try await f.call("GET", "/v1/webhooks/\(closedID)", key: f.backendKey).json["failure"]?["error"]?.stringValue ?? ""
            #expect(failure == "could not connect to the endpoint", "\(failure)")
            // A stopped webhook cannot be made to send by another key of the app either.
            let first = try #require(try await f.call("GET", "/v1/events?limit=1", key: f.backendKey).json["events"]?.arrayValue?.first?["id"]?.stringValue)
            let redelivery = try await f.call("POST", "/v1/webhooks/\(doomedID)/redeliver", key: f.backendKey, body: ["eventID": .string(first)])
            #expect(redelivery.status == 409 && redelivery.json["error"]?["code"] == "webhookStopped")
            #expect(stopped.received.withLock { $0.isEmpty })
        }
    }

    @Test("one address holding many idle connections is capped, and another address is still served")
    func connectionsPerAddress() async throws {
        FileDescriptorLimit.raise()
        try await ServerFixture.with(server: { c in c.quotas.connectionsPerAddress = 50 }) { f in
            let port = await f.server.port
            var sockets: [Int32] = []
            defer { for s in sockets { close(s) } }
            // 400 idle connections from 127.0.0.2.
            for _ in 0..<400 {
                let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                guard s >= 0 else { break }
                var local = sockaddr_in()
                local.sin_family = sa_family_t(AF_INET)
                inet_pton(AF_INET, "127.0.0.2", &local.sin_addr)
                var remote = sockaddr_in()
                remote.sin_family = sa_family_t(AF_INET)
                remote.sin_port = in_port_t(UInt16(port).bigEndian)
                inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr)
                let bound = withUnsafePointer(to: &local) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                let connected = withUnsafePointer(to: &remote) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                guard bound == 0, connected == 0 else { close(s); break }
                sockets.append(s)
            }
            #expect(sockets.count == 400)
            // The server admits 50 of them and closes the rest: wait until it counted them.
            let limiter = f.server.app.connections
            try await eventually(within: .seconds(20), "the flood's connections counted") { limiter.count("127.0.0.2") >= 50 }
            #expect(limiter.count("127.0.0.2") == 50)
            for _ in 0..<12 { #expect(try await f.call("GET", "/health").status == 200) }
        }
    }
}
