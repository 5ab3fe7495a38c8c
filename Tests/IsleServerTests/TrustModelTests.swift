import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// The device key ships inside every copy of the app, so these attacks are made with it
/// (docs/security.md, "What someone with the device key can do"). Each failed before the trust
/// model was enforced.
@Suite("Trust model: what the public device key cannot do")
struct TrustModelTests {
    static let secretHeader = "Isle-Installation-Secret"
    static let otherToken = String(repeating: "ee", count: 40)

    @Test("an installation's first registration returns its secret; later ones without it, or with another, are refused and change nothing")
    func installationSecret() async throws {
        try await ServerFixture.with { f in
            let first = try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: ["liveActivitiesEnabled": true])
            #expect(first.status == 200)
            let secret = try #require(first.json["installationSecret"]?.stringValue)
            #expect(secret.hasPrefix("isle_inst_") && secret.count > 40)

            let hijack = try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(Self.otherToken)]])
            #expect(hijack.status == 403 && hijack.json["error"]?["code"] == "installationSecretRequired", "\(hijack.json.jsonString)")
            let guess = try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(Self.otherToken)]],
                                         headers: [(Self.secretHeader, "isle_inst_guess")])
            #expect(guess.status == 403 && guess.json["error"]?["code"] == "wrongInstallationSecret")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: "victim")?.pushToStartTokens.isEmpty == true, "a refused registration changed nothing")

            let owner = try await f.call("PUT", "/v1/installations/victim", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(Self.otherToken)]],
                                         headers: [(Self.secretHeader, secret)])
            #expect(owner.status == 200 && owner.json["installationSecret"] == nil, "the secret is shown once")
            // The secret is stored as a hash only.
            let bytes = String(decoding: try Data(contentsOf: URL(fileURLWithPath: f.databasePath)), as: UTF8.self) + ((try? String(contentsOfFile: f.databasePath + "-wal", encoding: .isoLatin1)) ?? "")
            #expect(!bytes.contains(secret))
        }
    }

    @Test("the device cannot say who the user is; the backend binds it, and push-to-start to a user reaches that user's installations only")
    func userBoundByBackend() async throws {
        try await ServerFixture.with { f in
            let app = try f.sim.world.app(Pizza.bundleID, on: f.device)
            let pts = try #require(app.pushToStartTokens["PizzaDeliveryAttributes"])
            let claim = try await f.call("PUT", "/v1/installations/attacker", key: f.deviceKey, body: ["userID": "victim-user", "pushToStartTokens": ["PizzaDeliveryAttributes": .string(Self.otherToken)]])
            #expect(claim.status == 400 && claim.json["error"]?["field"] == "userID", "\(claim.json.jsonString)")
            #expect(try await f.call("PUT", "/v1/installations/victim-phone", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(pts)]]).status == 200)
            #expect(try await f.call("PUT", "/v1/installations/attacker", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(Self.otherToken)]]).status == 200)
            // Only the backend key binds a user.
            #expect(try await f.call("PUT", "/v1/installations/victim-phone/user", key: f.deviceKey, body: ["userID": "victim-user"]).status == 403)
            let bound = try await f.call("PUT", "/v1/installations/victim-phone/user", key: f.backendKey, body: ["userID": "victim-user"])
            #expect(bound.status == 200 && bound.json["userID"] == "victim-user")
            #expect(try await f.call("PUT", "/v1/installations/nobody/user", key: f.backendKey, body: ["userID": "x"]).status == 404)
            let start = try await f.call("POST", "/v1/users/victim-user/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Private"),
                "alert": ["title": "Order", "body": "For the victim only"], "externalKey": "order-private",
            ])
            #expect(start.status == 202 && start.json["accepted"] == 1, "\(start.json.jsonString)")
            #expect(start.json["activities"]?.arrayValue?.allSatisfy { $0["installationID"] == "victim-phone" } == true, "\(start.json.jsonString)")
        }
    }

    @Test("a live activity's external key cannot be taken by another registration, and its content is never returned to it")
    func externalKeyTakeover() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-1234")
            // Without the backend's ticket for the key: refused before anything is looked up.
            let takeover = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.otherToken), "externalKey": "order-1234"],
                                                installation: "attacker", ticket: "")
            #expect(takeover.status == 403 && takeover.json["error"]?["code"] == "ticketRequired" && takeover.json["error"]?["field"] == "ticket", "\(takeover.json.jsonString)")
            // Even with a genuine ticket for the key (say one leaked), another installation gets a
            // 409 that names nobody's activity.
            let leaked = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.otherToken), "externalKey": "order-1234"],
                                              installation: "attacker")
            #expect(leaked.status == 409 && leaked.json["error"]?["code"] == "externalKeyInUse", "\(leaked.json.jsonString)")
            #expect(!leaked.json.jsonString.contains(id) && leaked.json["contentState"] == nil && leaked.json["attributes"] == nil)
            // By-key updates still reach only the real activity.
            let update = try await f.call("POST", "/v1/activities/by-key/order-1234/update", key: f.backendKey, body: ["contentState": Pizza.state("Real")])
            #expect(update.status == 202 && update.json["activityID"] == .string(id), "\(update.json.jsonString)")
        }
    }

    @Test("an activity registered on an installation needs that installation's secret for its token and reports")
    func activityCallsNeedTheSecret() async throws {
        try await ServerFixture.with { f in
            let r = try await f.call("PUT", "/v1/installations/phone", key: f.deviceKey, body: ["liveActivitiesEnabled": true])
            let secret = try #require(r.json["installationSecret"]?.stringValue)
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state("A"))
            let token = try await f.sim.world.waitForPushToken(activityID: a.id, on: f.device)
            let body: JSONValue = ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "externalKey": "o-9", "installationID": "phone", "ticket": .string(f.ticket(key: "o-9"))]
            #expect(try await f.call("POST", "/v1/activities", key: f.deviceKey, body: body).status == 403)
            let unknown = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "installationID": "ghost"])
            #expect(unknown.status == 404 && unknown.json["error"]?["field"] == "installationID")
            let registered = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: body, headers: [(Self.secretHeader, secret)])
            #expect(registered.status == 201, "\(registered.json.jsonString)")
            let activity = try #require(registered.json["id"]?.stringValue)
            #expect(try await f.call("PUT", "/v1/activities/\(activity)/token", key: f.deviceKey, body: ["token": .string(Self.otherToken)]).status == 403)
            #expect(try await f.call("POST", "/v1/activities/\(activity)/dismissed", key: f.deviceKey, body: [:]).status == 403)
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.activity(id: activity)?.state == .active, "the refused dismissal changed nothing")
            #expect(try await f.call("POST", "/v1/activities/\(activity)/dismissed", key: f.deviceKey, body: [:], headers: [(Self.secretHeader, secret)]).status == 200)
        }
    }

    @Test("nothing unbounded is stored: attributes and content state checked against the schema and the 4 KB limit at registration; ids, keys and topics bounded")
    func sizes() async throws {
        try await ServerFixture.with { f in
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state("A"))
            let token = try await f.sim.world.waitForPushToken(activityID: a.id, on: f.device)
            func register(_ extra: JSONObject) async throws -> ServerFixture.Answer {
                var body: JSONObject = ["attributesType": "PizzaDeliveryAttributes", "token": .string(token)]
                for (k, v) in extra { body[k] = v }
                return try await f.register(.object(body))
            }
            let huge = try await register(["contentState": ["driverName": .string(String(repeating: "x", count: 5000)), "deliveryTimer": [1, 2]]])
            #expect(huge.status == 422 && huge.json["error"]?["code"] == "tooLarge" && huge.json["error"]?["field"] == "contentState", "\(huge.json.jsonString)")
            let wrong = try await register(["attributes": ["numberOfPizzas": "three", "totalAmount": "$1", "orderNumber": "1"]])
            #expect(wrong.status == 422 && wrong.json["error"]?["field"] == "attributes.numberOfPizzas", "\(wrong.json.jsonString)")
            let manyTopics = try await register(["topics": .array((0..<33).map { .string("t\($0)") })])
            #expect(manyTopics.status == 400 && manyTopics.json["error"]?["field"] == "topics")
            let longTopic = try await register(["topics": [.string(String(repeating: "t", count: 200))]])
            #expect(longTopic.status == 400 && longTopic.json["error"]?["field"] == "topics[0]")
            let longKey = try await register(["externalKey": .string(String(repeating: "k", count: 300))])
            #expect(longKey.status == 400 && longKey.json["error"]?["field"] == "externalKey")
            let longInstallation = try await f.call("PUT", "/v1/installations/\(String(repeating: "i", count: 200))", key: f.deviceKey, body: ["liveActivitiesEnabled": true])
            #expect(longInstallation.status == 400 && longInstallation.json["error"]?["field"] == "installation")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.activity(bundleID: Pizza.bundleID, updateToken: token) == nil, "nothing refused was stored")
            let ok = try await register(["externalKey": "o-sized", "contentState": Pizza.state("Fits"), "attributes": Pizza.attributes])
            #expect(ok.status == 201, "\(ok.json.jsonString)")
        }
    }

    @Test("per-key rate limits: past the burst a key gets 429 with Retry-After; time refills it; other keys are not affected")
    func rateLimits() async throws {
        try await ServerFixture.with(server: { $0.rateLimits = [.device: RateLimit(perSecond: 1, burst: 3)] }) { f in
            for i in 0..<3 {
                #expect(try await f.call("PUT", "/v1/installations/rl-\(i)", key: f.deviceKey, body: ["liveActivitiesEnabled": true]).status == 200)
            }
            let limited = try await f.call("PUT", "/v1/installations/rl-9", key: f.deviceKey, body: ["liveActivitiesEnabled": true])
            #expect(limited.status == 429 && limited.json["error"]?["code"] == "rateLimited" && limited.retryAfter == "1", "\(limited.json.jsonString)")
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).status == 200, "the backend key has its own budget")
            f.clock.advance(by: 1)
            #expect(try await f.call("PUT", "/v1/installations/rl-9", key: f.deviceKey, body: ["liveActivitiesEnabled": true]).status == 200)
        }
    }

    @Test("a rate so small the wait overflows any integer still answers 429 with a bounded Retry-After, and the server stays up")
    func absurdRate() async throws {
        try await ServerFixture.with(server: { $0.rateLimits = [.backend: RateLimit(perSecond: 1e-300, burst: 1)] }) { f in
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).status == 200)
            let limited = try await f.call("GET", "/v1/app", key: f.backendKey)
            #expect(limited.status == 429 && limited.retryAfter == "86400", "\(limited.json.jsonString)")
            #expect(try await f.call("GET", "/health").status == 200)
        }
    }

    @Test("another app's backend key cannot read a widget delivery; the delivery history is paged")
    func deliveriesAreTheAppsOwn() async throws {
        try await ServerFixture.with { f in
            let app = try f.sim.world.app(Pizza.bundleID, on: f.device)
            #expect(try await f.call("PUT", "/v1/installations/inst-w", key: f.deviceKey, body: ["widgetToken": .string(app.widgetPushToken!)]).status == 200)
            #expect(try await f.call("POST", "/v1/installations/inst-w/widgets/reload", key: f.backendKey).status == 202)
            try await eventually("the widget push answered") { f.sim.apns.requestLog.contains { $0.status == 200 && $0.apnsID != nil } }
            let apnsID = try #require(f.sim.apns.requestLog.last { $0.status == 200 }?.apnsID)
            try await eventually("the delivery recorded") { try await f.call("GET", "/v1/deliveries/\(apnsID)", key: f.backendKey).status == 200 }
            // A second app on the same server, with its own backend key.
            let store = try SQLiteStore(path: f.databasePath)
            let key = TestProviderKey()
            try await store.upsertApp(AppRecord(bundleID: "com.example.other", teamID: key.teamID, keyID: key.keyID,
                                                keyPEM: ServerFixture.masterKey.seal(key.privateKeyPEM, bundleID: "com.example.other"), createdAt: Pizza.t0))
            let other = try await ServerSetup.createKey(store: store, bundleID: "com.example.other", scope: .backend).secret
            let peek = try await f.call("GET", "/v1/deliveries/\(apnsID)", key: other)
            #expect(peek.status == 404, "\(peek.json.jsonString)")

            // Paging: five updates, pages of two, oldest first within a page.
            let (_, id) = try await f.appStartsActivity(key: "paged")
            for n in 0..<5 {
                f.clock.advance(by: 1)
                #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("P\(n)"), "alert": ["title": "t", "body": "b"]]).status == 202)
            }
            try await eventually("five deliveries") { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count == 5 }
            let first = try await f.call("GET", "/v1/activities/\(id)?deliveries=2", key: f.backendKey)
            let page1 = try #require(first.json["deliveries"]?.arrayValue)
            #expect(page1.count == 2)
            let before = try #require(first.json["moreDeliveries"]?["before"]?.numberValue?.int64Value)
            let second = try await f.call("GET", "/v1/activities/\(id)?deliveries=2&before=\(before)", key: f.backendKey)
            let page2 = try #require(second.json["deliveries"]?.arrayValue)
            #expect(page2.count == 2)
            let ids = (page2 + page1).compactMap { $0["id"]?.numberValue?.int64Value }
            #expect(ids == ids.sorted() && Set(ids).count == 4, "\(ids)")
            #expect(try await f.call("GET", "/v1/activities/\(id)?deliveries=0", key: f.backendKey).status == 400)
            #expect(try await f.call("GET", "/v1/activities/\(id)?before=x", key: f.backendKey).status == 400)
        }
    }
}
