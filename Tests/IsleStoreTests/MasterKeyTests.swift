import Foundation
import GRDB
@testable import IsleStore
import IsleDelivery
import Testing

@Suite("MasterKey: .p8 keys sealed at rest (AES-256-GCM)")
struct MasterKeyTests {
    static let pem = "-----BEGIN PRIVATE KEY-----\nMIGTAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBHkwdwIBAQQg\n-----END PRIVATE KEY-----\n"

    @Test("seal and open round-trip; another bundle id, another key or a changed byte does not open")
    func roundTrip() throws {
        let key = MasterKey.generate()
        let sealed = key.seal(Self.pem, bundleID: "com.example.pizza")
        #expect(sealed.hasPrefix(MasterKey.sealedPrefix) && !sealed.contains("PRIVATE KEY"))
        #expect(sealed != key.seal(Self.pem, bundleID: "com.example.pizza"), "a fresh nonce every time")
        #expect(try key.open(sealed, bundleID: "com.example.pizza") == Self.pem)
        #expect(throws: StoreError.self) { try key.open(sealed, bundleID: "com.example.other") }
        #expect(throws: StoreError.self) { try MasterKey.generate().open(sealed, bundleID: "com.example.pizza") }
        var bytes = Array(sealed.utf8)
        bytes[bytes.count - 5] = bytes[bytes.count - 5] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(throws: StoreError.self) { try key.open(String(decoding: bytes, as: UTF8.self), bundleID: "com.example.pizza") }
        #expect(try MasterKey(base64: key.base64).open(sealed, bundleID: "com.example.pizza") == Self.pem)
        #expect(throws: StoreError.self) { try MasterKey(base64: "not a key") }
    }

    @Test("the SQLite store refuses a key in clear, creates its file 0600, and seals keys an older database holds in clear")
    func sqliteStore() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-mk-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("isle.sqlite").path
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        #expect((FilePermissions.mode(of: path) ?? 0) & 0o777 == 0o600)
        #expect(FilePermissions.problem(withDatabase: path) == nil)
        await #expect(throws: StoreError.self) {
            try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: Self.pem, createdAt: Date()))
        }
        // A row written before keys were sealed.
        try await store.pool.write { db in
            try db.execute(sql: "INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at) VALUES ('com.example.old', 'T', 'K', ?, 0, '[]', 0)",
                           arguments: [Self.pem])
        }
        let key = MasterKey.generate()
        #expect(try await store.sealPlaintextKeys(with: key) == ["com.example.old"])
        let app = try #require(try await store.app("com.example.old"))
        #expect(MasterKey.isSealed(app.keyPEM))
        #expect(try MasterKey.openKey(of: app, with: key) == Self.pem)
        #expect(throws: StoreError.self) { try MasterKey.openKey(of: app, with: nil) }
        chmod(path, 0o640)
        #expect(FilePermissions.problem(withDatabase: path)?.contains("chmod 600") == true)
    }
}
