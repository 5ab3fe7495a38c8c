import Crypto
import Foundation
import IsleCore
@testable import IsleSimulator
import IsleTesting
import Testing

/// A running simulator with one device, the pizza app, one activity started from the app, and a
/// raw client. Time is virtual.
struct SimFixture {
    let sim: IsleSim
    let raw: RawAPNs
    let clock: ManualWallClock
    let device: String
    let activity: SimulatedActivity
    var token: String { activity.updateToken! }

    func headers(push: String = "liveactivity", topic: String? = nil, priority: String? = "10", jwt: String? = nil) -> [(String, String)] {
        var h: [(String, String)] = [("authorization", "bearer \(jwt ?? raw.jwt(iat: clock.now))"), ("apns-push-type", push)]
        h.append(("apns-topic", topic ?? Pizza.bundleID + ".push-type.liveactivity"))
        if let priority { h.append(("apns-priority", priority)) }
        h.append(("apns-id", UUID().uuidString.lowercased()))
        return h
    }

    /// The fake APNs's answers are under test, not the device's timing: priority 5 at once, tokens at
    /// install, a dismissed activity's token refused at once.
    static var instant: IsleSim.Configuration {
        var c = IsleSim.Configuration()
        c.device = .instant
        return c
    }

    static func with<R: Sendable>(configuration: IsleSim.Configuration = instant, _ body: (SimFixture) async throws -> R) async throws -> R {
        let clock = ManualWallClock(Pizza.t0)
        return try await IsleSim.withRunning(configuration: configuration, clock: clock) { sim in
            let device = sim.world.createDevice(name: "iPhone")
            _ = try Pizza.install(sim.world, on: device)
            let requested = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
            _ = try await sim.world.waitForPushToken(activityID: requested.id, on: device)
            let activity = try #require(try sim.world.device(device).activities.first { $0.id == requested.id })
            let raw = try RawAPNs(sim: sim)
            do {
                let r = try await body(SimFixture(sim: sim, raw: raw, clock: clock, device: device, activity: activity))
                try await raw.shutdown()
                return r
            } catch {
                try? await raw.shutdown()
                throw error
            }
        }
    }
}

/// One request that breaks one APNs rule, and Apple's answer to it (docs/protocol.md §3.4, §7.4;
/// docs/protocol.md, Isle's decisions for the choices Apple leaves open).
struct RuleCase: Sendable, CustomTestStringConvertible {
    let name: String
    let status: Int
    let reason: String?
    let request: @Sendable (SimFixture) async throws -> RawAPNs.Answer
    var testDescription: String { "\(name) → \(status) \(reason ?? "")" }
}

enum Rules {
    static let validBody = Pizza.update(Pizza.t0).jsonBytes

    static func device(_ f: SimFixture, token: String? = nil, method: String = "POST", headers: [(String, String)]? = nil, body: [UInt8] = validBody) async throws -> RawAPNs.Answer {
        try await f.raw.send(method, "/3/device/\(token ?? f.token)", headers: headers ?? f.headers(), body: body)
    }

    static func replacing(_ h: [(String, String)], _ name: String, _ value: String?) -> [(String, String)] {
        var out = h.filter { $0.0 != name }
        if let value { out.append((name, value)) }
        return out
    }

    static let deviceCases: [RuleCase] = [
        RuleCase(name: "valid push", status: 200, reason: nil) { f in try await device(f) },
        RuleCase(name: "GET", status: 405, reason: "MethodNotAllowed") { f in try await device(f, method: "GET", body: []) },
        RuleCase(name: "unknown path", status: 404, reason: "BadPath") { f in try await f.raw.send("/3/devices/abc", headers: f.headers(), body: validBody) },
        RuleCase(name: "no token in path", status: 400, reason: "MissingDeviceToken") { f in try await f.raw.send("/3/device/", headers: f.headers(), body: validBody) },
        RuleCase(name: "duplicate header", status: 400, reason: "DuplicateHeaders") { f in try await device(f, headers: f.headers() + [("apns-priority", "5")]) },
        RuleCase(name: "no authorization", status: 403, reason: "MissingProviderToken") { f in try await device(f, headers: replacing(f.headers(), "authorization", nil)) },
        RuleCase(name: "signed by another key", status: 403, reason: "InvalidProviderToken") { f in
            try await device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now, signer: P256.Signing.PrivateKey())))
        },
        RuleCase(name: "unknown key id", status: 403, reason: "InvalidProviderToken") { f in try await device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now, kid: "UNKNOWN000"))) },
        RuleCase(name: "iat as a string", status: 403, reason: "InvalidProviderToken") { f in
            try await device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now, iatLiteral: "\"\(Int(f.clock.now.timeIntervalSince1970))\"")))
        },
        RuleCase(name: "iat over an hour old", status: 403, reason: "ExpiredProviderToken") { f in try await device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now.addingTimeInterval(-3601)))) },
        RuleCase(name: "push type LiveActivity (case)", status: 400, reason: "InvalidPushType") { f in try await device(f, headers: f.headers(push: "LiveActivity")) },
        RuleCase(name: "no push type", status: 400, reason: "InvalidPushType") { f in try await device(f, headers: replacing(f.headers(), "apns-push-type", nil)) },
        RuleCase(name: "no topic", status: 400, reason: "MissingTopic") { f in try await device(f, headers: replacing(f.headers(), "apns-topic", nil)) },
        RuleCase(name: "topic without .push-type.liveactivity", status: 400, reason: "DeviceTokenNotForTopic") { f in try await device(f, headers: f.headers(topic: Pizza.bundleID)) },
        RuleCase(name: "voip topic without .voip", status: 400, reason: "BadTopic") { f in try await device(f, headers: f.headers(push: "voip", topic: Pizza.bundleID)) },
        RuleCase(name: "another app's topic", status: 400, reason: "DeviceTokenNotForTopic") { f in try await device(f, headers: f.headers(topic: "com.other.app.push-type.liveactivity")) },
        RuleCase(name: "widgets push to an activity token", status: 400, reason: "DeviceTokenNotForTopic") { f in try await device(f, headers: f.headers(push: "widgets", topic: Pizza.bundleID + ".push-type.widgets")) },
        RuleCase(name: "priority 7", status: 400, reason: "BadPriority") { f in try await device(f, headers: f.headers(priority: "7")) },
        RuleCase(name: "background at priority 10", status: 400, reason: "BadPriority") { f in try await device(f, headers: f.headers(push: "background", topic: Pizza.bundleID, priority: "10")) },
        RuleCase(name: "expiration not a number", status: 400, reason: "BadExpirationDate") { f in try await device(f, headers: f.headers() + [("apns-expiration", "soon")]) },
        RuleCase(name: "collapse id over 64 bytes", status: 400, reason: "BadCollapseId") { f in try await device(f, headers: f.headers() + [("apns-collapse-id", String(repeating: "c", count: 65))]) },
        RuleCase(name: "apns-id not a UUID", status: 400, reason: "BadMessageId") { f in try await device(f, headers: replacing(f.headers(), "apns-id", "123")) },
        RuleCase(name: "empty payload", status: 400, reason: "PayloadEmpty") { f in try await device(f, body: []) },
        RuleCase(name: "4097-byte payload", status: 413, reason: "PayloadTooLarge") { f in
            try await device(f, body: Array(repeating: UInt8(ascii: " "), count: 4097 - validBody.count) + validBody)
        },
        RuleCase(name: "unknown well-formed token", status: 400, reason: "BadDeviceToken") { f in try await device(f, token: String(repeating: "ab", count: 80)) },
        RuleCase(name: "malformed token", status: 400, reason: "BadDeviceToken") { f in try await device(f, token: "xyz") },
        RuleCase(name: "production token on the sandbox APNs", status: 400, reason: "BadDeviceToken") { f in
            let d = f.sim.world.createDevice(name: "prod")
            _ = try Pizza.install(f.sim.world, on: d, environment: .production)
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: d, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
            return try await device(f, token: try await f.sim.world.waitForPushToken(activityID: a.id, on: d))
        },
        RuleCase(name: "token of a dismissed activity", status: 410, reason: "Unregistered") { f in
            try f.sim.world.userDismiss(activityID: f.activity.id, on: f.device)
            return try await device(f)
        },
        RuleCase(name: "key restricted to production", status: 403, reason: "BadEnvironmentKeyIdInToken") { f in
            let key = P256.Signing.PrivateKey()
            try f.sim.apns.register(RegisteredKey(keyID: "PRODKEY001", teamID: f.raw.teamID, publicKeyPEM: key.publicKey.pemRepresentation, environment: .production))
            return try await device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now, kid: "PRODKEY001", signer: key)))
        },
    ]

    static let channel = "dHN0LXNyY2gtY2hubA=="

    static func bheaders(_ f: SimFixture, _ changes: [(String, String?)] = []) -> [(String, String)] {
        var h: [(String, String)] = [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))"), ("apns-channel-id", channel), ("apns-push-type", "liveactivity"),
                                     ("apns-priority", "10"), ("apns-expiration", "0")]
        for (n, v) in changes { h = replacing(h, n, v) }
        return h
    }

    static func withChannel(_ f: SimFixture, policy: Int = 0) async throws -> String {
        let a = try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")],
                                     body: Array(#"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#.utf8))
        return a.header("apns-channel-id")!
    }

    static let broadcastCases: [RuleCase] = [
        RuleCase(name: "valid broadcast", status: 200, reason: nil) { f in
            let id = try await withChannel(f)
            return try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-channel-id", id)]), body: validBody)
        },
        RuleCase(name: "bundle id with suffix", status: 400, reason: "TopicDisallowed") { f in
            try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID).push-type.liveactivity", headers: bheaders(f), body: validBody)
        },
        RuleCase(name: "no channel id", status: 400, reason: "MissingChannelId") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-channel-id", nil)]), body: validBody) },
        RuleCase(name: "channel id not base64", status: 400, reason: "BadChannelId") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-channel-id", "!!!")]), body: validBody) },
        RuleCase(name: "unknown channel", status: 400, reason: "ChannelNotRegistered") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f), body: validBody) },
        RuleCase(name: "no push type", status: 400, reason: "MissingPushType") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-push-type", nil)]), body: validBody) },
        RuleCase(name: "push type alert", status: 400, reason: "InvalidPushType") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-push-type", "alert")]), body: validBody) },
        RuleCase(name: "no priority", status: 400, reason: "BadPriority") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-priority", nil)]), body: validBody) },
        RuleCase(name: "no expiration", status: 400, reason: "BadExpirationDate") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-expiration", nil)]), body: validBody) },
        RuleCase(name: "storing expiration on a No-Message-Stored channel", status: 400, reason: "BadExpirationDate") { f in
            let id = try await withChannel(f, policy: 0)
            return try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-channel-id", id), ("apns-expiration", "1767229200")]), body: validBody)
        },
        RuleCase(name: "request id not a UUID", status: 400, reason: "BadMessageId") { f in try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f, [("apns-request-id", "x")]), body: validBody) },
        RuleCase(name: "5121-byte broadcast", status: 413, reason: "PayloadTooLarge") { f in
            try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: bheaders(f), body: Array(repeating: UInt8(ascii: " "), count: 5121 - validBody.count) + validBody)
        },
        RuleCase(name: "broadcast capability off", status: 400, reason: "FeatureNotEnabled") { f in
            f.sim.world.setBroadcastCapability(bundleID: Pizza.bundleID, enabled: false)
            return try await f.raw.send("GET", "/1/apps/\(Pizza.bundleID)/all-channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")])
        },
        RuleCase(name: "create: body not JSON", status: 400, reason: "BadRequestPayload") { f in
            try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")], body: Array("{".utf8))
        },
        RuleCase(name: "create: unknown attribute", status: 400, reason: "BadRequestParams") { f in
            try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")], body: Array(#"{"message-storage-policy":0,"push-type":"LiveActivity","x":1}"#.utf8))
        },
        RuleCase(name: "create: no push-type", status: 400, reason: "MissingPushType") { f in
            try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")], body: Array(#"{"message-storage-policy":0}"#.utf8))
        },
        RuleCase(name: "create: push-type liveactivity (case)", status: 400, reason: "InvalidPushType") { f in
            try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")], body: Array(#"{"message-storage-policy":0,"push-type":"liveactivity"}"#.utf8))
        },
        RuleCase(name: "channels with PUT", status: 405, reason: "MethodNotAllowed") { f in
            try await f.raw.send("PUT", "/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")], body: Array("{}".utf8))
        },
        RuleCase(name: "read: no channel id", status: 400, reason: "MissingChannelId") { f in
            try await f.raw.send("GET", "/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")])
        },
        RuleCase(name: "delete: unknown channel", status: 400, reason: "ChannelNotRegistered") { f in
            try await f.raw.send("DELETE", "/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))"), ("apns-channel-id", channel)])
        },
        RuleCase(name: "injected 503 Shutdown", status: 503, reason: "Shutdown") { f in
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "Shutdown"))
            return try await device(f)
        },
        RuleCase(name: "injected 429 TooManyRequests for one token", status: 429, reason: "TooManyRequests") { f in
            f.sim.apns.addFailure(FailureRule(token: f.token, status: 429, reason: "TooManyRequests"))
            return try await device(f)
        },
        RuleCase(name: "injected 500", status: 500, reason: "InternalServerError") { f in
            f.sim.apns.addFailure(FailureRule(status: 500, reason: "InternalServerError"))
            return try await device(f)
        },
    ]
}

@Suite("Fake APNs: each rule broken gets Apple's status and reason")
struct FakeAPNsRuleTests {
    @Test("device pushes", arguments: Rules.deviceCases)
    func device(_ c: RuleCase) async throws {
        try await SimFixture.with { f in
            let a = try await c.request(f)
            #expect(a.status == c.status)
            #expect(a.reason == c.reason, "\(String(decoding: a.body, as: UTF8.self))")
            #expect(a.header("apns-id") != nil)
            if c.status == 410 { #expect(a.json?["timestamp"]?.numberValue?.int64Value == Int64(Pizza.t0.timeIntervalSince1970 * 1000)) }
            if c.status == 200 {
                #expect(a.body.isEmpty)
                #expect(a.header("apns-unique-id") != nil, "sandbox answers carry apns-unique-id")
            } else {
                #expect(a.header("content-type") == "application/json")
            }
        }
    }

    @Test("broadcast and channel requests", arguments: Rules.broadcastCases)
    func broadcast(_ c: RuleCase) async throws {
        try await SimFixture.with { f in
            let a = try await c.request(f)
            #expect(a.status == c.status)
            #expect(a.reason == c.reason, "\(String(decoding: a.body, as: UTF8.self))")
            #expect(a.header("apns-request-id") != nil || a.header("apns-id") != nil)
        }
    }

    @Test("a new JWT on the same connection within 20 minutes: 429 TooManyProviderTokenUpdates; after 20: accepted")
    func twentyMinuteRule() async throws {
        try await SimFixture.with { f in
            let v1 = try await Rules.device(f)

            #expect(v1.status == 200)
            f.clock.advance(by: 60)
            let second = f.raw.jwt(iat: f.clock.now)
            let a = try await Rules.device(f, headers: f.headers(jwt: second))
            #expect(a.status == 429 && a.reason == "TooManyProviderTokenUpdates")
            f.clock.advance(by: 20 * 60)
            let v2 = try await Rules.device(f, headers: f.headers(jwt: f.raw.jwt(iat: f.clock.now)))

            #expect(v2.status == 200)
        }
    }

    @Test("each host's connections are their own: a fresh connection to channel management or broadcasts takes a new token after the device host used another")
    func connectionsPerHost() async throws {
        try await SimFixture.with { f in
            #expect(try await Rules.device(f).status == 200)
            // Later, a new token: on new connections to the other hosts it is their first.
            f.clock.advance(by: 60)
            let created = try await f.raw.send("/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")],
                                               body: Array(#"{"message-storage-policy":0,"push-type":"LiveActivity"}"#.utf8))
            #expect(created.status == 201, "\(created.status) \(String(decoding: created.body, as: UTF8.self))")
            f.clock.advance(by: 60)
            let channel = try #require(created.header("apns-channel-id"))
            let broadcast = try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: Rules.bheaders(f, [("apns-channel-id", channel)]), body: Rules.validBody)
            #expect(broadcast.status == 200, "\(broadcast.status) \(String(decoding: broadcast.body, as: UTF8.self))")
        }
    }

    @Test("another team's token on the same connection: 403 UnrelatedKeyIdInToken")
    func teamBinding() async throws {
        try await SimFixture.with { f in
            let v3 = try await Rules.device(f)

            #expect(v3.status == 200)
            let other = P256.Signing.PrivateKey()
            try f.sim.apns.register(RegisteredKey(keyID: "OTHERKEY01", teamID: "OTHERTEAM1", publicKeyPEM: other.publicKey.pemRepresentation))
            let jwt = RawAPNs.b64url(#"{"alg":"ES256","kid":"OTHERKEY01"}"#.utf8) + "." + RawAPNs.b64url(#"{"iss":"OTHERTEAM1","iat":\#(Int(f.clock.now.timeIntervalSince1970))}"#.utf8)
            let signed = jwt + "." + RawAPNs.b64url(try other.signature(for: Array(jwt.utf8)).rawRepresentation)
            let a = try await Rules.device(f, headers: f.headers(jwt: signed))
            #expect(a.status == 403 && a.reason == "UnrelatedKeyIdInToken")
        }
    }

    @Test("request log redacts the JWT and shortens tokens; the outcome explains a 200")
    func requestLog() async throws {
        try await SimFixture.with { f in
            _ = try await Rules.device(f)
            let entry = try #require(f.sim.apns.requestLog.last)
            #expect(entry.status == 200)
            let auth = try #require(entry.headers.first { $0[0] == "authorization" })
            #expect(auth[1].hasPrefix("bearer <redacted kid=KEY0000001 iss=TEAM000001"))
            #expect(!entry.path.contains(f.token))
            #expect(entry.outcome?.code == .applied)
        }
    }

    @Test("latency injection and GOAWAY")
    func latencyAndGoAway() async throws {
        try await SimFixture.with { f in
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, latencyMilliseconds: 300))
            let start = ContinuousClock.now
            let v4 = try await Rules.device(f)

            #expect(v4.status == 200)
            #expect(ContinuousClock.now - start >= .milliseconds(300))
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "Shutdown", remaining: 1, goAway: true))
            let v5 = try await Rules.device(f)

            #expect(v5.status == 503)
            // The connection was closed. A request racing the close may fail at the transport level
            // (clients retry those); a later attempt goes out on a new connection and works (within
            // a deadline: on a loaded machine the new connection's handshake can take a while).
            try await eventually(within: .seconds(30), "a request on a new connection answered 200") {
                (try? await Rules.device(f).status) == 200
            }
        }
    }

    @Test("a 5xx burst: N failures, then success")
    func burst() async throws {
        try await SimFixture.with { f in
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 3))
            var statuses: [Int] = []
            for _ in 0..<4 { statuses.append(try await Rules.device(f).status) }
            #expect(statuses == [503, 503, 503, 200])
        }
    }
}

/// A provider token against a virtual clock (docs/simulator.md, "Provider tokens and the virtual
/// clock"): judged by the simulator's clock alone, a token a person signs with the real time is
/// refused once the virtual clock stood still or jumped — and the answer says so; judged by
/// either clock (what `isle sim --virtual-clock` does), it is taken, and so is one signed with
/// the virtual time, while one valid by neither is still refused.
@Suite struct ProviderTokenClockTests {
    /// A client of its own per token: a new provider token on one connection within 20 minutes is
    /// `TooManyProviderTokenUpdates`, another rule.
    static func push(_ f: SimFixture, iat: Date, token: String? = nil) async throws -> RawAPNs.Answer {
        let raw = try RawAPNs(sim: f.sim, keyID: "K\(UUID().uuidString.prefix(9))".uppercased())
        defer { Task { try? await raw.shutdown() } }
        var headers = f.headers()
        headers.removeAll { $0.0 == "authorization" }
        headers.append(("authorization", "bearer \(raw.jwt(iat: iat))"))
        return try await raw.send("POST", "/3/device/\(token ?? f.token)", headers: headers, body: Rules.validBody)
    }

    @Test func theSimulatorsClockAloneRefusesARealTimeTokenAndSaysWhy() async throws {
        // The fixture's virtual clock stands at 2026-01-01: months behind the real time.
        try await SimFixture.with { f in
            let answer = try await Self.push(f, iat: Date())
            #expect(answer.status == 403)
            #expect(answer.reason == "InvalidProviderToken")
            let note = try #require(answer.header("isle-sim-outcome"), "the answer says why")
            #expect(note.hasPrefix("refused: iat is "))
            #expect(note.contains("s ahead of the simulator's clock"))
            #expect(note.contains("a virtual clock") && note.contains("s behind real time: advance it (POST /clock/advance)"))
            #expect(note.contains("restart isle sim without --virtual-clock"))
            let logged = try #require(f.sim.apns.requestLog.last)
            #expect(logged.status == 403)
            #expect(logged.note?.hasPrefix("iat is ") == true, "GET /requests says why: \(logged.note ?? "nil")")
            // A token signed with the virtual time is valid, and its answer carries no such note.
            let fine = try await Self.push(f, iat: f.clock.now)
            #expect(fine.status == 200)
            // Advanced past real time by 2 h: a token signed an hour and a half before the virtual
            // now is fine; one signed with the real time is over an hour old by the virtual clock.
            try await f.sim.world.advanceClock(by: Date().timeIntervalSince(f.clock.now) + 7200)
            let expired = try await Self.push(f, iat: Date())
            #expect(expired.reason == "ExpiredProviderToken")
            #expect(expired.header("isle-sim-outcome")?.contains("s ahead of real time") == true)
        }
    }

    @Test func eitherClockTakesATokenValidByOneOfThem() async throws {
        // The fake APNs' provider-token rule is under test, not the device's timing or APNs' leeway
        // (held or reordered pushes would only delay the 200s this test reads), as in every rule case here.
        var c = SimFixture.instant
        c.device.providerTokenClock = .simulatorOrReal
        try await SimFixture.with(configuration: c) { f in
            #expect(try await Self.push(f, iat: Date()).status == 200, "signed with the real time")
            #expect(try await Self.push(f, iat: f.clock.now).status == 200, "signed with the virtual time")
            // Valid by neither: refused with real time's reason (APNs' world), and no advice about the
            // virtual clock, which would not help.
            let neither = try await Self.push(f, iat: Date().addingTimeInterval(-7200))
            #expect(neither.status == 403)
            #expect(neither.reason == "ExpiredProviderToken")
            #expect(neither.header("isle-sim-outcome") == nil, "\(neither.header("isle-sim-outcome") ?? "no note")")
            // After a jump past the real time (the first activity has ended by then: a new one),
            // both a real-time and a virtual-time token are taken.
            try await f.sim.world.advanceClock(by: Date().timeIntervalSince(f.clock.now) + 8 * 3600)
            let requested = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
            let token = try await f.sim.world.waitForPushToken(activityID: requested.id, on: f.device)
            #expect(try await Self.push(f, iat: Date(), token: token).status == 200)
            #expect(try await Self.push(f, iat: f.clock.now, token: token).status == 200)
        }
    }

    @Test func withTheSystemClockNothingChanges() {
        let now = Date()
        for clock in SimulatorConfiguration.ProviderTokenClock.allCases {
            #expect(FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970) - 3601, now: now, real: now, offset: 0, clock: clock, virtual: false)?.reason == "ExpiredProviderToken")
            #expect(FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970) + 301, now: now, real: now, offset: 0, clock: clock, virtual: false)?.reason == "InvalidProviderToken")
            #expect(FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970) - 3599, now: now, real: now, offset: 0, clock: clock, virtual: false) == nil)
            // A refusal with the system clock has no note: nothing of the simulator's explains it.
            #expect(FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970) + 3600, now: now, real: now, offset: 0, clock: clock, virtual: false)?.note == nil)
        }
        // APNs' clock set ahead through the control API is named when it is the cause, not otherwise.
        let offset = FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970), now: now, real: now, offset: 4000, clock: .simulator, virtual: false)
        #expect(offset?.note?.contains("POST /apns/clock-offset") == true)
        let old = FakeAPNs.judgeIssuedAt(Int64(now.timeIntervalSince1970) - 7200, now: now, real: now, offset: 60, clock: .simulator, virtual: false)
        #expect(old?.reason == "ExpiredProviderToken" && old?.note == nil)
    }
}
