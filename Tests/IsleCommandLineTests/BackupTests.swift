import Foundation
@testable import IsleCommandLine
import IsleCore
import IsleStore
import IsleDelivery
import Testing

/// `isle db backup`: a consistent copy of a SQLite database while it is being written.
@Suite("isle db backup")
struct BackupTests {
    static func temp(_ name: String) -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("isle-backup-\(UUID().uuidString)-\(name)").path
    }

    @Test("a backup taken while jobs are being written opens, passes SQLite's integrity check and holds what was committed before it; it is 0600 and never overwrites")
    func online() async throws {
        let path = Self.temp("live.sqlite")
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        let t0 = Date(timeIntervalSince1970: 1_767_225_600)
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: t0))
        try await store.insertActivity(ActivityRecord(id: "a0", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok", startedAt: t0))
        func job() -> NewPushJob { NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: "a0", payload: .update([:], alert: LiveActivityAlert(title: "T", body: "B"), at: t0), runAt: t0) }
        for _ in 0..<200 { try await store.enqueue([job()], idempotency: nil, now: t0) }
        let before = try await store.jobCounts().values.reduce(0, +)
        // Writers keep going while the backup runs.
        let writer = Task { for _ in 0..<300 { _ = try? await store.enqueue([job()], idempotency: nil, now: t0) } }
        let target = Self.temp("copy.sqlite")
        let r = await IsleCLI.capture(["db", "backup", "--database", path, "--to", target])
        _ = await writer.value
        #expect(r.status == 0 && r.out.contains("integrity check ok"), "\(r.err)")
        #expect((try FileManager.default.attributesOfItem(atPath: target)[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let copy = try SQLiteStore(path: target)
        let copied = try await copy.jobCounts().values.reduce(0, +)
        #expect(copied >= before && copied <= before + 300)
        #expect(try await copy.activity(id: "a0")?.updateToken == "tok")
        let again = await IsleCLI.capture(["db", "backup", "--database", path, "--to", target])
        #expect(again.status == ExitStatus.usage && again.err.contains("exists"))
        #expect(await IsleCLI.capture(["db", "backup", "--database", Self.temp("none.sqlite"), "--to", Self.temp("x")]).status == ExitStatus.configuration)
    }
}
