import Foundation
import IsleCommandLine
import IsleCore
import IsleStore
import IsleDelivery
import Logging
import Testing

/// `isle db copy` (docs/server.md, "Scale out"): the demo's database, copied to PostgreSQL, reads the same there.
@Suite("isle db copy")
struct DbCopyTests {
    @Test("the demo's data copied to PostgreSQL: every row, equal on both sides; a target with data is refused unless --replace")
    func demoRoundTrip() async throws {
        guard let base = ProcessInfo.processInfo.environment["ISLE_TEST_POSTGRES_URL"], !base.isEmpty else {
            print("note: the isle db copy test is skipped: ISLE_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL server and sets it)")
            return
        }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-copy-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let kept = dir.appendingPathComponent("demo.sqlite").path
        let demo = await IsleCLI.capture(["demo", "--json", "--speed", "1e9", "--keep-database", kept])
        #expect(demo.status == 0, "\(demo.err)")

        var logger = Logger(label: "isle.test.copy")
        logger.logLevel = .critical
        let url = try await PostgresStore.createDatabase(on: try PostgresSettings(url: base), prefix: "isle_copy", logger: logger).url

        let copy = await IsleCLI.capture(["db", "copy", "--from", kept, "--to", url])
        #expect(copy.status == 0, "\(copy.err)")
        #expect(copy.out.contains("jobs: ") && copy.out.contains("deliveries: "), "\(copy.out)")
        #expect(!copy.out.contains("postgres://postgres:"), "no password is printed")

        let source = try SQLiteStore(path: kept)
        let target = PostgresStore(settings: try PostgresSettings(url: url), logger: logger)
        try await target.withRunning {
            var rows = 0
            for table in DataCopy.tables { rows += try await source.exportTable(table).rows.count }
            #expect(try await target.copiedRowCount() == rows)
            #expect(rows > 20, "the demo leaves apps, keys, installations, activities, jobs and deliveries")
            // PostgreSQL keeps moments to the microsecond (TIMESTAMPTZ); SQLite keeps the double.
            let copiedApps = try await target.apps(), sourceApps = try await source.apps()
            #expect(copiedApps.count == sourceApps.count)
            for (copied, original) in zip(copiedApps, sourceApps) {
                #expect(abs(copied.createdAt.timeIntervalSince(original.createdAt)) < 0.000_002, "\(original.bundleID)")
                var same = copied
                same.createdAt = original.createdAt
                #expect(same == original)
            }
            #expect(try await target.jobCounts() == source.jobCounts())
            let activities = try await source.exportTable("activities")
            let idColumn = try #require(activities.columns.firstIndex(of: "id"))
            for row in activities.rows {
                guard case .text(let id) = row[idColumn] else { continue }
                #expect(try await target.activity(id: id) == source.activity(id: id), "activity \(id)")
                #expect(try await target.deliveries(activityID: id) == source.deliveries(activityID: id), "deliveries of \(id)")
            }
            let installations = try await source.exportTable("installations")
            for row in installations.rows {
                guard case .text(let id) = row[0], case .text(let bundleID) = row[1] else { continue }
                #expect(try await target.installation(bundleID: bundleID, id: id) == source.installation(bundleID: bundleID, id: id), "installation \(id)")
            }
            // Queued work continues after the copied rows: new jobs get new ids.
            let next = try await target.enqueue([NewPushJob(bundleID: "com.example.pizza", kind: .widgets, installationID: "x", payload: .widgets(WidgetPayload()), runAt: Date())],
                                                idempotency: nil, now: Date())
            let maxCopied = try await source.exportTable("jobs").rows.count
            #expect(next.first.map { $0 > Int64(maxCopied) } == true)
        }

        let again = await IsleCLI.capture(["db", "copy", "--from", kept, "--to", url])
        #expect(again.status == ExitStatus.usage && again.err.contains("--replace"), "\(again.err)")
        let replaced = await IsleCLI.capture(["db", "copy", "--from", kept, "--to", url, "--replace"])
        #expect(replaced.status == 0, "\(replaced.err)")
        try? FileManager.default.removeItem(at: dir)
    }
}
