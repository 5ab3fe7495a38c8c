import Foundation
import IsleCore
import IsleDelivery
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// Keys per APNs environment (docs/server.md, "Keys per environment"): Apple lets a key be scoped to
/// the sandbox or to production, and refuses it on the other host with `BadEnvironmentKeyIdInToken`.
/// The simulator models the scope; the server signs each push with its environment's own key.
@Suite("A key per environment: each push signed with its environment's key")
struct EnvironmentKeyTests {
    @Test("a key scoped to the other environment pauses the app with the remedy; the environment's own key resumes it, and the app's key still signs the other environment")
    func environmentScopedKeys() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-env")
            // The app's key becomes production-only, as a key scoped in the developer account is; the
            // simulator is APNs' sandbox.
            var own = try #require(f.sim.apns.registeredKey(TestProviderKey.keyID))
            own.environment = .production
            try f.sim.apns.register(own)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: DeliveryCoreRegressionTests.alerted("scoped away")).status == 202)
            try await eventually("the app is paused for its key's environment") { try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["state"] == "paused" }
            let reason = try #require(try await f.call("GET", "/v1/app", key: f.backendKey).json["delivery"]?["reason"]?.stringValue)
            #expect(reason.contains("BadEnvironmentKeyIdInToken") && reason.contains("isle app environment-key set") && reason.contains("key \(TestProviderKey.keyID)"), "\(reason)")

            // The sandbox gets a key of its own, scoped to it, under another key id.
            let sandboxKey = TestProviderKey(keyID: "SBXKEY0001")
            try f.sim.apns.register(RegisteredKey(keyID: sandboxKey.keyID, teamID: sandboxKey.teamID, publicKeyPEM: sandboxKey.publicKeyPEM, environment: .sandbox))
            let store = try SQLiteStore(path: f.databasePath)
            var app = try #require(try await store.app(Pizza.bundleID))
            app.environmentKeys = [EnvironmentKey(environment: .sandbox, keyID: sandboxKey.keyID, teamID: sandboxKey.teamID,
                                                  keyPEM: ServerFixture.masterKey.seal(sandboxKey.privateKeyPEM, bundleID: Pizza.bundleID), createdAt: f.clock.now)]
            try await store.upsertApp(app)
            #expect(try await store.app(Pizza.bundleID)?.environmentKeys.map(\.keyID) == ["SBXKEY0001"], "the store keeps it")
            try await eventually("delivered with the sandbox's own key") {
                _ = try await f.call("POST", "/v1/app/resume", key: f.backendKey)
                return try f.deviceActivity(a.id)?.contentState["driverName"] == "scoped away"
            }
            let stored = try #require(try await store.app(Pizza.bundleID))
            #expect(stored.signingKey(for: .sandbox).keyID == "SBXKEY0001" && stored.signingKey(for: .sandbox).environment == .sandbox)
            #expect(stored.signingKey(for: .production).keyID == TestProviderKey.keyID && stored.signingKey(for: .production).environment == nil,
                    "production keeps the app's own key")
        }
    }

    @Test("the store keeps each environment's key sealed, and refuses one in clear")
    func storedSealed() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-envkeys-\(UUID().uuidString).sqlite").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        let key = TestProviderKey(keyID: "PRDKEY0001")
        var app = AppRecord(bundleID: "com.example.env", teamID: TestProviderKey.teamID, keyID: TestProviderKey.keyID,
                            keyPEM: ServerFixture.masterKey.seal(TestProviderKey().privateKeyPEM, bundleID: "com.example.env"), createdAt: Date(timeIntervalSince1970: 1_790_000_000))
        app.environmentKeys = [EnvironmentKey(environment: .production, keyID: key.keyID, teamID: key.teamID, keyPEM: key.privateKeyPEM, createdAt: app.createdAt)]
        await #expect(throws: StoreError.self) { try await store.upsertApp(app) }
        app.environmentKeys[0].keyPEM = ServerFixture.masterKey.seal(key.privateKeyPEM, bundleID: "com.example.env")
        try await store.upsertApp(app)
        let back = try #require(try await store.app("com.example.env"))
        #expect(back.environmentKeys == app.environmentKeys)
        #expect(try MasterKey.openKey(back.signingKey(for: .production).keyPEM, bundleID: back.bundleID, with: ServerFixture.masterKey) == key.privateKeyPEM)
    }
}
