import Crypto
import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// Trust model v2 (docs/security.md): the device key is public, so binding an order or a user to a
/// phone comes from the backend. Each test is an attack that worked before (docs/security.md).
@Suite("Trust model v2: binding comes from the backend")
struct TrustModelV2Tests {
    static let junk = String(repeating: "ee", count: 40)

    @Test("an activity cannot be registered without an installation; the old flow is refused with what to do")
    func noInstallationLessActivities() async throws {
        try await ServerFixture.with { f in
            let old = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: ["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.junk), "externalKey": "order-1"])
            #expect(old.status == 400 && old.json["error"]?["field"] == "installationID", "\(old.json.jsonString)")
            #expect(old.json["error"]?["message"]?.stringValue?.contains("PUT /v1/installations") == true)
        }
    }

    @Test("squatting: an order key registered before the genuine app is refused without the backend's ticket, and the genuine registration then works")
    func squatting() async throws {
        try await ServerFixture.with { f in
            let squat = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.junk), "externalKey": "order-8888"], installation: "attacker", ticket: "")
            #expect(squat.status == 403 && squat.json["error"]?["code"] == "ticketRequired" && squat.json["error"]?["field"] == "ticket", "\(squat.json.jsonString)")
            // A ticket for the attacker's own order does not cover another key.
            let other = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.junk), "externalKey": "order-8888"],
                                             installation: "attacker", ticket: f.ticket(key: "order-1111"))
            #expect(other.status == 403 && other.json["error"]?["field"] == "ticket", "\(other.json.jsonString)")
            // A ticket bound to another installation cannot be replayed by this one.
            let bound = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.junk), "externalKey": "order-8888"],
                                             installation: "attacker", ticket: f.ticket(key: "order-8888", installation: "victim-phone"))
            #expect(bound.status == 403 && bound.json["error"]?["field"] == "ticket", "\(bound.json.jsonString)")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.liveActivities(bundleID: Pizza.bundleID, externalKey: "order-8888").isEmpty)
            // The genuine app, with the ticket its backend gave it for the order.
            let (a, id) = try await f.appStartsActivity(key: "order-8888")
            f.clock.advance(by: 1)
            let update = try await f.call("POST", "/v1/activities/by-key/order-8888/update", key: f.backendKey, body: ["contentState": Pizza.state("Door code 4321")])
            #expect(update.status == 202 && update.json["activityID"] == .string(id))
            try await f.waitForDevice("the genuine phone got the update") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Door code 4321" }
        }
    }

    @Test("tickets: expired, too long-lived, tampered, for another app or signed by an unknown key are refused by name")
    func ticketRules() async throws {
        try await ServerFixture.with { f in
            let body: JSONValue = ["attributesType": "PizzaDeliveryAttributes", "token": .string(Self.junk), "externalKey": "order-t"]
            func code(_ ticket: String) async throws -> String? {
                let r = try await f.register(body, installation: "phone-t", ticket: ticket)
                #expect(r.status == 403 && r.json["error"]?["field"] == "ticket", "\(r.json.jsonString)")
                #expect(!r.json.jsonString.contains(ticket), "the ticket is never echoed")
                return r.json["error"]?["code"]?.stringValue
            }
            #expect(try await code(f.ticket(key: "order-t", ttl: -1)) == "ticketExpired")
            #expect(try await code(f.ticket(key: "order-t", ttl: 2 * 86_400)) == "invalidTicket")
            #expect(try await code(f.ticket(key: "order-t", bundleID: "com.example.other")) == "invalidTicket")
            var parts = f.ticket(key: "order-t").split(separator: ".").map(String.init)
            parts[1] = RegistrationTicketTestSupport.base64url(Array(#"{"aud":"com.example.pizza","exp":9999999999,"key":"order-t"}"#.utf8))
            #expect(try await code(parts.joined(separator: ".")) == "invalidTicket")
            let stranger = try RegistrationTicket(bundleID: Pizza.bundleID, expires: f.clock.now.addingTimeInterval(60), externalKey: "order-t")
                .signed(with: P256.Signing.PrivateKey(), keyID: ServerFixture.ticketKeyID)
            #expect(try await code(stranger) == "invalidTicket")
            #expect(try await code("not.a.jwt!") == "invalidTicket")
            // A ticket that names a user binds no order key.
            #expect(try await code(f.ticket(user: "alice")) == "invalidTicket")
            // The genuine ticket works, once the key is free.
            #expect(try await f.register(body, installation: "phone-t").status == 201)
        }
    }

    @Test("the backend binds a key to an activity the app registered by id alone; by-key updates and fan-outs reach only bound activities")
    func backendBindsKeys() async throws {
        try await ServerFixture.with { f in
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state("A"))
            let token = try await f.sim.world.waitForPushToken(activityID: a.id, on: f.device)
            let r = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(token)])
            #expect(r.status == 201 && r.json["externalKey"] == .null, "\(r.json.jsonString)")
            let id = try #require(r.json["id"]?.stringValue)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-77/update", key: f.backendKey, body: ["contentState": Pizza.state("B")]).status == 404)
            // The device key cannot bind; the backend key can.
            #expect(try await f.call("PUT", "/v1/activities/\(id)/key", key: f.deviceKey, body: ["externalKey": "order-77"], headers: f.secretHeader()).status == 403)
            let bound = try await f.call("PUT", "/v1/activities/\(id)/key", key: f.backendKey, body: ["externalKey": "order-77"])
            #expect(bound.status == 200 && bound.json["externalKey"] == "order-77", "\(bound.json.jsonString)")
            f.clock.advance(by: 1)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-77/update", key: f.backendKey, body: ["contentState": Pizza.state("Bound")]).status == 202)
            try await f.waitForDevice("the bound activity updated") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Bound" }
        }
    }

    @Test("another installation cannot rotate, dismiss or end a victim's activity, with or without a secret of its own; an installation-less activity takes no device call")
    func redirectAttempts() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-4321")
            let mine = try await f.installation("attacker")
            for headers in [[], [("Isle-Installation-Secret", mine)]] {
                let rotate = try await f.call("PUT", "/v1/activities/\(id)/token", key: f.deviceKey, body: ["token": .string(Self.junk)], headers: headers)
                #expect(rotate.status == 403, "\(rotate.json.jsonString)")
                for report in ["dismissed", "ended"] {
                    #expect(try await f.call("POST", "/v1/activities/\(id)/\(report)", key: f.deviceKey, body: [:], headers: headers).status == 403)
                }
            }
            // A record from before v2 (no installation): no device call can prove it owns it.
            let store = try SQLiteStore(path: f.databasePath)
            try await store.insertActivity(ActivityRecord(id: "act_legacy", bundleID: Pizza.bundleID, externalKey: "legacy", attributesType: "PizzaDeliveryAttributes",
                                                          updateToken: String(repeating: "aa", count: 32), startedAt: Pizza.t0))
            let legacy = try await f.call("PUT", "/v1/activities/act_legacy/token", key: f.deviceKey, body: ["token": .string(Self.junk)], headers: [("Isle-Installation-Secret", mine)])
            #expect(legacy.status == 403 && legacy.json["error"]?["code"] == "installationRequired", "\(legacy.json.jsonString)")
            #expect(try await store.activity(id: "act_legacy")?.updateToken == String(repeating: "aa", count: 32))
            // Nothing of the victim's changed: the backend's next update reaches the victim's phone.
            let victim = try await store.activity(id: id)
            #expect(victim?.updateToken == a.updateToken && victim?.state == .active)
            f.clock.advance(by: 1)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-4321/update", key: f.backendKey, body: ["contentState": Pizza.state("Door code 4321")]).status == 202)
            try await f.waitForDevice("the victim got it") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Door code 4321" }
            #expect(!f.sim.apns.requestLog.contains { $0.path.hasSuffix(Self.junk) }, "nothing was ever sent to the attacker's token")
        }
    }

    @Test("ids and tokens are per app: two apps may use one installation id; another app's token or activity is never named")
    func namespacedPerApp() async throws {
        try await ServerFixture.with { f in
            let (a, _) = try await f.appStartsActivity(key: "order-ns")
            let store = try SQLiteStore(path: f.databasePath)
            let key = TestProviderKey()
            try await store.upsertApp(AppRecord(bundleID: "com.example.other", teamID: key.teamID, keyID: key.keyID,
                                                keyPEM: ServerFixture.masterKey.seal(key.privateKeyPEM, bundleID: "com.example.other"), createdAt: Pizza.t0))
            let otherDevice = try await ServerSetup.createKey(store: store, bundleID: "com.example.other", scope: .device).secret
            // The same installation id in another app is another installation, with its own secret.
            let same = try await f.call("PUT", "/v1/installations/fixture-phone", key: otherDevice, body: ["liveActivitiesEnabled": true])
            #expect(same.status == 200 && same.json["installationSecret"]?.stringValue != nil, "\(same.json.jsonString)")
            let secret = try #require(same.json["installationSecret"]?.stringValue)
            // Registering the pizza app's token under the other app tells nothing about the pizza app.
            let r = try await f.call("POST", "/v1/activities", key: otherDevice, body: ["attributesType": "X", "token": .string(a.updateToken!), "installationID": "fixture-phone"],
                                     headers: [("Isle-Installation-Secret", secret)])
            #expect(!r.json.jsonString.contains("act_") || r.status == 201, "\(r.json.jsonString)")
            let pizza = try await store.installation(bundleID: Pizza.bundleID, id: "fixture-phone"), other = try await store.installation(bundleID: "com.example.other", id: "fixture-phone")
            #expect(pizza?.secretHash != nil && pizza?.secretHash != other?.secretHash)
        }
    }

    @Test("a user is bound by the backend or by its ticket, never by the device's word; installations per user are bounded")
    func usersAndQuotas() async throws {
        try await ServerFixture.with(server: { $0.quotas.installationsPerUser = 2; $0.quotas.liveActivitiesPerInstallation = 3 }) { f in
            try await f.installation("u-phone")
            let noTicket = try await f.call("PUT", "/v1/installations/u-phone", key: f.deviceKey, body: ["userID": "alice"], headers: f.secretHeader("u-phone"))
            #expect(noTicket.status == 400 && noTicket.json["error"]?["field"] == "userID")
            let withTicket = try await f.call("PUT", "/v1/installations/u-phone", key: f.deviceKey, body: ["ticket": .string(f.ticket(user: "alice"))], headers: f.secretHeader("u-phone"))
            #expect(withTicket.status == 200 && withTicket.json["userID"] == "alice", "\(withTicket.json.jsonString)")
            #expect(try await f.call("PUT", "/v1/installations/u-2/user", key: f.backendKey, body: ["userID": "alice"]).status == 404, "unknown installations are not created")
            try await f.installation("u-2")
            try await f.installation("u-3")
            #expect(try await f.call("PUT", "/v1/installations/u-2/user", key: f.backendKey, body: ["userID": "alice"]).status == 200)
            let third = try await f.call("PUT", "/v1/installations/u-3/user", key: f.backendKey, body: ["userID": "alice"])
            #expect(third.status == 409 && third.json["error"]?["code"] == "tooManyInstallations", "\(third.json.jsonString)")
            // Live activities per installation.
            for i in 0..<3 {
                let token = String(repeating: "a\(i)", count: 32)
                #expect(try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(token)], installation: "u-phone").status == 201)
            }
            let fourth = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "a9", count: 32))], installation: "u-phone")
            #expect(fourth.status == 409 && fourth.json["error"]?["code"] == "tooManyActivities", "\(fourth.json.jsonString)")
        }
    }

    @Test("the device key is limited per installation and per address: one flooding installation gets 429s, another does not; unknown keys are throttled per address")
    func fleetLimits() async throws {
        try await ServerFixture.with(server: { c in
            c.deviceInstallationLimit = RateLimit(perSecond: 1, burst: 5)
            c.authFailureLimit = RateLimit(perSecond: 1, burst: 5)
        }) { f in
            var answers: [Int] = []
            for _ in 0..<10 { answers.append(try await f.call("PUT", "/v1/installations/flood", key: f.deviceKey, body: ["liveActivitiesEnabled": true]).status) }
            #expect(answers.filter { $0 == 429 }.count >= 5, "\(answers)")
            #expect(try await f.call("PUT", "/v1/installations/genuine", key: f.deviceKey, body: ["liveActivitiesEnabled": true]).status == 200)
            for _ in 0..<5 { #expect(try await f.call("GET", "/v1/app", key: "isle_backend_wrong").status == 401) }
            let throttled = try await f.call("GET", "/v1/app", key: "isle_backend_wrong")
            #expect(throttled.status == 429 && throttled.retryAfter != nil, "\(throttled.json.jsonString)")
            f.clock.advance(by: 2)
            #expect(try await f.call("GET", "/v1/app", key: "isle_backend_wrong").status == 401)
        }
        try await ServerFixture.with(server: { $0.deviceAddressLimit = RateLimit(perSecond: 1, burst: 4) }) { f in
            var answers: [Int] = []
            for i in 0..<6 { answers.append(try await f.call("PUT", "/v1/installations/a-\(i)", key: f.deviceKey, body: ["liveActivitiesEnabled": true]).status) }
            #expect(answers == [200, 200, 200, 200, 429, 429], "\(answers)")
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).status == 200, "the backend key is not limited per address")
        }
    }

    @Test("unstorable and unbounded input is refused naming the field: NUL in a body (422) or a path id (400), over-long path keys")
    func unstorable() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "nul")
            let body = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, raw: #"{"contentState":{"driverName":"a\u0000b","deliveryTimer":[1,2]}}"#)
            #expect(body.status == 422 && body.json["error"]?["code"] == "unstorable" && body.json["error"]?["field"] == "contentState.driverName", "\(body.json.jsonString)")
            let path = try await f.call("GET", "/v1/activities/by-key/a%00b", key: f.backendKey)
            #expect(path.status == 400 && path.json["error"]?["field"] == "key", "\(path.json.jsonString)")
            let long = try await f.call("GET", "/v1/activities/by-key/\(String(repeating: "k", count: 300))", key: f.backendKey)
            #expect(long.status == 400 && long.json["error"]?["field"] == "key", "\(long.json.jsonString)")
            let topic = try await f.call("POST", "/v1/topics/\(String(repeating: "t", count: 200))/update", key: f.backendKey, body: ["contentState": Pizza.state("x")])
            #expect(topic.status == 400 && topic.json["error"]?["field"] == "topic", "\(topic.json.jsonString)")
        }
    }
}

enum RegistrationTicketTestSupport {
    static func base64url(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
}
