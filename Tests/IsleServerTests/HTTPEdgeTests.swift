import AsyncHTTPClient
import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Logging
import NIOCore
import ServiceLifecycle
import Testing

/// The HTTP edge in Hummingbird's seams (docs/server.md): the caller in the request context, idempotency
/// committed with the work for every write, one error envelope with the simulator, one ServiceGroup.
@Suite("HTTP edge")
struct HTTPEdgeTests {
    @Test("registering an activity with one Idempotency-Key from many racing requests creates one activity; every answer is that one or 'in use'")
    func registrationIsAtomicWithItsKey() async throws {
        try await ServerFixture.with { f in
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                    contentState: Pizza.state("Bill James"))
            // One ticket in one body: a repeat is the same request.
            let body: JSONValue = ["attributesType": "PizzaDeliveryAttributes", "token": .string(try await f.sim.world.waitForPushToken(activityID: a.id, on: f.device)), "externalKey": "race-order",
                                   "attributes": Pizza.attributes, "contentState": Pizza.state("Bill James"), "ticket": .string(f.ticket(key: "race-order"))]
            try await f.installation()
            let answers = try await withThrowingTaskGroup(of: ServerFixture.Answer.self) { group in
                for _ in 0..<16 { group.addTask { try await f.register(body, headers: [("Idempotency-Key", "register-1")]) } }
                return try await group.reduce(into: [ServerFixture.Answer]()) { $0.append($1) }
            }
            #expect(answers.allSatisfy { $0.status == 201 || ($0.status == 409 && $0.json["error"]?["code"] == "idempotencyKeyInUse") }, "\(answers.map { "\($0.status) \($0.json.jsonString)" })")
            let created = Set(answers.filter { $0.status == 201 }.compactMap { $0.json["id"]?.stringValue })
            #expect(created.count == 1, "every 201 is the one activity: \(created)")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.liveActivities(bundleID: Pizza.bundleID, externalKey: "race-order").count == 1)
            // A later repeat is the first answer, marked as a replay; the same key with another body is refused.
            let again = try await f.register(body, headers: [("Idempotency-Key", "register-1")])
            #expect(again.status == 201 && again.json["id"]?.stringValue == created.first)
            var fields = body.objectValue!
            fields["externalKey"] = "another-order"
            fields["ticket"] = .string(f.ticket(key: "another-order"))
            let other = JSONValue.object(fields)
            let reused = try await f.register(other, headers: [("Idempotency-Key", "register-1")])
            #expect(reused.status == 409 && reused.json["error"]?["code"] == "idempotencyKeyReused" && reused.json["error"]?["field"] == "Idempotency-Key")
            // Without a shared key, racing registrations of one external key from eight installations
            // (each with a valid ticket): one takes it, the others are refused without learning who holds it.
            // (Tokens the server has not seen; the phone allows few activities per app, and nothing is sent here.)
            let tokens = (0..<8).map { i in String(repeating: "ab", count: 31) + String(format: "%02x", i) }
            for i in tokens.indices { try await f.installation("racer-\(i)") }
            let racing = try await withThrowingTaskGroup(of: ServerFixture.Answer.self) { group in
                for (i, token) in tokens.enumerated() {
                    group.addTask {
                        try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "externalKey": "contested"], installation: "racer-\(i)")
                    }
                }
                return try await group.reduce(into: [ServerFixture.Answer]()) { $0.append($1) }
            }
            #expect(racing.filter { $0.status == 201 }.count == 1, "\(racing.map(\.status))")
            #expect(racing.filter { $0.status == 409 }.allSatisfy { $0.json["error"]?["code"] == "externalKeyInUse" && $0.json["error"]?["field"] == "externalKey" })
            #expect(!racing.filter { $0.status != 201 }.contains { $0.json.jsonString.contains("act_") }, "a refusal never names another installation's activity")
            #expect(try await store.liveActivities(bundleID: Pizza.bundleID, externalKey: "contested").count == 1)
        }
    }

    @Test("an installation's registration and a report commit with their idempotency record; a replay never carries the installation secret")
    func registryWritesReplay() async throws {
        try await ServerFixture.with { f in
            let body: JSONValue = ["liveActivitiesEnabled": true]
            let first = try await f.call("PUT", "/v1/installations/inst-edge", key: f.deviceKey, body: body, headers: [("Idempotency-Key", "inst-1")])
            #expect(first.status == 200 && first.json["installationSecret"]?.stringValue?.hasPrefix("isle_inst_") == true, "\(first.json.jsonString)")
            let replay = try await f.call("PUT", "/v1/installations/inst-edge", key: f.deviceKey, body: body, headers: [("Idempotency-Key", "inst-1")])
            #expect(replay.status == 200 && replay.json["id"] == "inst-edge" && replay.json["installationSecret"] == nil, "\(replay.json.jsonString)")
            // A refused write stores no answer: the same key is free for the corrected request.
            let refused = try await f.call("PUT", "/v1/installations/inst-edge", key: f.deviceKey, body: ["frequentPushesEnabled": true], headers: [("Idempotency-Key", "inst-2")])
            #expect(refused.status == 403 && refused.json["error"]?["code"] == "installationSecretRequired")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.idempotencyRecord(bundleID: Pizza.bundleID, key: "device:inst-2") == nil)
            // A dismissal with a key: replayed, not applied twice.
            let (_, id) = try await f.appStartsActivity(key: "edge-dismiss")
            let dismissed = try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: [("Idempotency-Key", "d-1")] + f.secretHeader())
            let repeated = try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, headers: [("Idempotency-Key", "d-1")] + f.secretHeader())
            #expect(dismissed.status == 200 && repeated.status == 200 && dismissed.json == repeated.json)
            #expect(try await store.idempotencyRecord(bundleID: Pizza.bundleID, key: "device:d-1")?.body == dismissed.json.jsonString)
        }
    }

    @Test("environment: a wrong value is refused by name and changes nothing; development is the sandbox; a later report moves the installation")
    func environmentField() async throws {
        try await ServerFixture.with { f in
            let first = try await f.call("PUT", "/v1/installations/inst-env", key: f.deviceKey, body: ["environment": "development"])
            #expect(first.status == 200 && first.json["environment"] == "sandbox", "\(first.json.jsonString)")
            let secret = try #require(first.json["installationSecret"]?.stringValue)
            let headers = [("Isle-Installation-Secret", secret)]
            for bad: JSONValue in ["staging", "Production", 1, ["sandbox"]] {
                let r = try await f.call("PUT", "/v1/installations/inst-env", key: f.deviceKey, body: ["environment": bad, "liveActivitiesEnabled": false], headers: headers)
                #expect(r.status == 400 && r.json["error"]?["field"] == "environment", "\(bad.jsonString): \(r.json.jsonString)")
            }
            let store = try SQLiteStore(path: f.databasePath)
            let kept = try #require(try await store.installation(bundleID: Pizza.bundleID, id: "inst-env"))
            #expect(kept.environment == .sandbox && kept.liveActivitiesEnabled)
            // Unsaid keeps it; said moves it (a TestFlight build over a debug one keeps its Keychain).
            #expect(try await f.call("PUT", "/v1/installations/inst-env", key: f.deviceKey, body: ["frequentPushesEnabled": true], headers: headers).json["environment"] == "sandbox")
            #expect(try await f.call("PUT", "/v1/installations/inst-env", key: f.deviceKey, body: ["environment": "production"], headers: headers).json["environment"] == "production")
            // An activity takes its installation's environment unless it says; a bad one is refused.
            let token = String(repeating: "ab", count: 32)
            let bad = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "installationID": "inst-env", "environment": "prod"], headers: headers)
            #expect(bad.status == 400 && bad.json["error"]?["field"] == "environment", "\(bad.json.jsonString)")
            let inherited = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "installationID": "inst-env"], headers: headers)
            #expect(inherited.status == 201 && inherited.json["environment"] == "production", "\(inherited.json.jsonString)")
            let unsaid = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "cd", count: 32))], installation: "inst-unsaid")
            #expect(unsaid.status == 201 && unsaid.json["environment"] == .null, "\(unsaid.json.jsonString)")
            let channel = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["environment": "qa"])
            #expect(channel.status == 400 && channel.json["error"]?["field"] == "environment", "\(channel.json.jsonString)")
            // Created in the server's default (sandbox here), and recorded as such.
            let made = try await f.call("POST", "/v1/channels", key: f.backendKey, body: [:])
            #expect(made.status == 201 && made.json["environment"] == "sandbox", "\(made.json.jsonString)")
        }
    }

    @Test("who is calling is settled once, before any route: no key 401, an unknown key 401 even on a route that does not exist, a key of the other scope 403")
    func callerInContext() async throws {
        try await ServerFixture.with { f in
            let none = try await f.call("GET", "/v1/app")
            #expect(none.status == 401 && none.json["error"]?["code"] == "unauthenticated")
            let unknown = try await f.call("GET", "/v1/app", key: "isle_backend_0000")
            #expect(unknown.status == 401 && unknown.json["error"]?["message"]?.stringValue?.contains("unknown or revoked") == true)
            let basic = try await f.call("GET", "/v1/app", headers: [("Authorization", "Basic Zm9vOmJhcg==")])
            #expect(basic.status == 401)
            let scope = try await f.call("GET", "/v1/app", key: f.deviceKey)
            #expect(scope.status == 403 && scope.json["error"]?["code"] == "wrongScope")
            #expect(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "running")
            // Outside /v1 no key is asked for.
            #expect(try await f.call("GET", "/health", headers: [("Authorization", "Bearer nonsense")]).status == 200)
        }
    }

    @Test("the server and the simulator's control API answer errors in one envelope")
    func oneErrorEnvelope() async throws {
        try await ServerFixture.with { f in
            let server = try await f.call("POST", "/v1/activities", key: f.deviceKey, raw: "{not json")
            var r = HTTPClientRequest(url: await f.sim.controlURL() + "/devices")
            r.method = .POST
            r.body = .bytes(ByteBuffer(string: "{not json"))
            let response = try await f.http.execute(r, timeout: .seconds(10))
            let simulator = try JSONParser.parse(Array(buffer: try await response.body.collect(upTo: 1 << 20)))
            #expect(server.status == 400 && response.status.code == 400)
            for answer in [server.json, simulator] {
                #expect(answer["error"]?["code"] == "invalidJSON", "\(answer.jsonString)")
                let keys = Set(answer["error"]?.objectValue?.keys.map { $0 } ?? [])
                #expect(keys.isSubset(of: ["code", "message", "field"]), "\(answer.jsonString)")
                #expect(answer.objectValue?.keys.count == 1)
            }
        }
    }

    @Test("the server is one service in the caller's ServiceGroup: migrated before it serves, stopped by the group's graceful shutdown")
    func oneServiceGroup() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-edge-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var c = ServerConfiguration()
        c.port = 0
        c.database = dir.appendingPathComponent("isle.sqlite").path
        var logger = Logger(label: "isle.test.edge")
        logger.logLevel = .critical
        // A fresh file, never migrated by the test: the server migrates it before it listens.
        let app = IsleServerApp(configuration: c, store: try SQLiteStore(path: c.database), logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: logger))
        let run = Task { try await group.run() }
        let port = await app.port()
        #expect(port > 0)
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let ready = try await http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/ready"), timeout: .seconds(10))
        #expect(ready.status.code == 200)
        _ = try await ready.body.collect(upTo: 1 << 16)
        await group.triggerGracefulShutdown()
        try await withDeadline(.seconds(20), "the group to stop") { try await run.value }
        await #expect(throws: (any Error).self) { _ = try await http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/health"), timeout: .seconds(5)) }
        try await http.shutdown()
    }
}
