import Foundation
@testable import IsleCommandLine
import IsleServer
import IsleStore
import IsleDelivery
import Testing

/// What the command line tells a new operator (issue 27): the version, the keys, and what
/// `isle serve` prints once it listens, with the next step when something is missing.
@Suite("isle: guidance for a new operator")
struct GuidanceTests {
    @Test("isle --version prints the version and where the build came from")
    func version() async {
        let r = await IsleCLI.capture(["--version"])
        #expect(r.status == 0 && r.out == IsleVersion.text && r.out.hasPrefix("isle \(IsleVersion.version) ("))
    }

    @Test("isle serve's banner: the API, the console, the database, each environment's APNs hosts, and the next step until an app, a backend key and a console key exist")
    func banner() async throws {
        let store = try SQLiteStore(path: FileManager.default.temporaryDirectory.appendingPathComponent("isle-banner-\(UUID().uuidString).sqlite").path)
        try await store.migrate()
        var c = ServerConfiguration()
        c.host = "127.0.0.1"
        var text = try await ServeCommand.banner(c, port: 8080, store: store, shown: "/tmp/isle.sqlite")
        #expect(text.contains("console:   http://127.0.0.1:8080/console") && text.contains("database:  /tmp/isle.sqlite"))
        #expect(text.contains("APNs sandbox (default): https://api.sandbox.push.apple.com:443   broadcast https://api-broadcast.sandbox.push.apple.com:443   channels https://api-manage-broadcast.sandbox.push.apple.com:2195"))
        #expect(text.contains("APNs production: https://api.push.apple.com:443"))
        #expect(text.contains("Next: add your app: isle app add --database /tmp/isle.sqlite"))
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: Date()))
        text = try await ServeCommand.banner(c, port: 8080, store: store, shown: "/tmp/isle.sqlite")
        #expect(text.contains("Next: a key for com.example.pizza's backend: isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope backend"))
        _ = try await ServerSetup.createKey(store: store, bundleID: "com.example.pizza", scope: .backend)
        text = try await ServeCommand.banner(c, port: 8080, store: store, shown: "/tmp/isle.sqlite")
        #expect(text.contains("Next: a key for the console: isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope admin"))
        _ = try await ServerSetup.createKey(store: store, bundleID: "com.example.pizza", scope: .admin)
        text = try await ServeCommand.banner(c, port: 8080, store: store, shown: "/tmp/isle.sqlite")
        #expect(!text.contains("Next:") && text.contains("apps:      com.example.pizza"))
    }

    @Test("isle key list: ids, apps, scopes and dates, never a secret; revoked keys say so")
    func keyList() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-keys-\(UUID().uuidString).sqlite").path
        let master = FileManager.default.temporaryDirectory.appendingPathComponent("isle-master-\(UUID().uuidString)").path
        let env = ["ISLE_MASTER_KEY_FILE": master]
        try MasterKey.generate().base64.write(toFile: master, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: master)
        // A database that is not there is not made by listing it.
        #expect(await IsleCLI.capture(["key", "list", "--database", path], environment: env).err.contains("does not exist"))
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        #expect(await IsleCLI.capture(["key", "list", "--database", path], environment: env).out.contains("no key yet"))
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: Date()))
        let backend = try await ServerSetup.createKey(store: store, bundleID: "com.example.pizza", scope: .backend)
        let admin = try await ServerSetup.createKey(store: store, bundleID: "com.example.pizza", scope: .serverAdmin)
        _ = try await store.revokeAPIKey(id: admin.id, at: Date())
        let r = await IsleCLI.capture(["key", "list", "--database", path, "--bundle-id", "com.example.pizza"], environment: env)
        #expect(r.status == 0 && r.out.contains("\(backend.id)  com.example.pizza  backend  created") && r.out.contains("\(admin.id)  com.example.pizza  server-admin") && r.out.contains("revoked"))
        #expect(!r.out.contains(backend.secret) && !r.out.contains(admin.secret))
    }

    @Test("the delivery-events settings: --webhook-hosts, --max-event-wait and --keep-events, with bad values named")
    func eventSettings() throws {
        let c = try ServeSettingsTests.settings(["--webhook-hosts", "hooks.example.com, *.internal.example.com", "--max-event-wait", "10", "--keep-events", "3"])
        #expect(c.webhooks.allowedHosts == ["hooks.example.com", "*.internal.example.com"] && c.webhooks.maximumPollWait == 10 && c.retention.events == 3 * 86_400)
        #expect(c.webhooks.allows(host: "a.internal.example.com") && !c.webhooks.allows(host: "internal.example.com") && !c.webhooks.allows(host: "evil.com"))
        #expect(throws: (any Error).self) { try ServeSettingsTests.settings(["--webhook-hosts", "http://x/"]) }
        #expect(throws: (any Error).self) { try ServeSettingsTests.settings(["--max-event-wait", "31"]) }
    }
}
