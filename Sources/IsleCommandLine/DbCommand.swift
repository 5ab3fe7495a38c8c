import ArgumentParser
import Foundation
import IsleStore
import IsleDelivery
import Logging

/// `isle db copy`: move an installation's data from its SQLite file to PostgreSQL.
struct DbCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "db", abstract: "Database tools.", subcommands: [Copy.self, Backup.self])

    struct Backup: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Back up a SQLite database to a new file while isle serve keeps running (SQLite's online backup), and check the copy.",
            discussion: "To restore: stop isle serve, remove the database's -wal and -shm files, copy the backup over the database, start isle serve (with the same master key). PostgreSQL: use pg_dump."
        )
        @Option(help: ArgumentHelp("The SQLite file to back up.", valueName: "path")) var database: String
        @Option(help: ArgumentHelp("The new file to write (never overwritten).", valueName: "path")) var to: String

        func run() async throws {
            guard !PostgresSettings.isPostgresURL(database) else { throw CLIError("--database: isle db backup copies a SQLite file; for PostgreSQL use pg_dump") }
            guard FileManager.default.fileExists(atPath: database) else { throw CLIError.configuration("--database: no file \(database)") }
            let store: SQLiteStore
            do { store = try SQLiteStore(path: database) } catch { throw CLIError.configuration("--database: cannot open \(database): \(error)") }
            let started = Date()
            let bytes: Int64
            do { bytes = try store.backup(to: to) } catch let e as StoreError {
                throw e.code == .conflict ? CLIError("--to: \(e.message)") : CLIError.configuration(e.message)
            }
            say(String(format: "backed up %@ to %@ (%.1f MB in %.1f s; integrity check ok)", database, to, Double(bytes) / 1e6, Date().timeIntervalSince(started)))
        }
    }

    struct Copy: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Copy everything (apps, keys, installations, activities, queued jobs, delivery history) from a SQLite file to PostgreSQL.",
            discussion: "Stop isle serve on the SQLite file first. The target is migrated, then filled table by table; a target that already holds Isle data is refused unless --replace is given (which empties it first). The apps' .p8 keys stay sealed: serve the copy with the same master key."
        )
        @Option(help: ArgumentHelp("The SQLite file to copy from.", valueName: "path")) var from: String
        @Option(help: ArgumentHelp("The PostgreSQL database to copy to: postgres://user@host:port/database.", valueName: "url")) var to: String
        @Flag(help: "Empty a target that already holds Isle data before copying into it.") var replace = false

        func run() async throws {
            guard !PostgresSettings.isPostgresURL(from) else { throw CLIError("--from: give the SQLite file to copy from (copies go from SQLite to PostgreSQL)") }
            guard PostgresSettings.isPostgresURL(to) else { throw CLIError("--to: give a postgres://user@host:port/database URL") }
            if let problem = DatabaseOption.passwordProblem(to, source: "--to") { throw CLIError(problem) }
            guard FileManager.default.fileExists(atPath: from) else { throw CLIError("--from: no file \(from)") }
            let source: SQLiteStore
            do { source = try SQLiteStore(path: from) } catch { throw CLIError("--from: cannot open \(from): \(error)") }
            let hold: any ServingHold
            do { hold = try source.holdForServing() } catch { throw CLIError("--from: \(error); stop isle serve on it first so the copy is complete") }
            defer { hold.release() }
            try await source.migrate()
            var logger = Logger(label: "isle.db.copy")
            logger.logLevel = .warning
            let settings: PostgresSettings
            do { settings = try PostgresSettings(url: to) } catch let e as StoreError { throw CLIError("--to: \(e.message)") }
            let target = PostgresStore(settings: settings, logger: logger)
            let replace = replace
            let counts = try await target.withRunning { () -> [(String, Int)] in
                try await target.migrate()
                let existing = try await target.copiedRowCount()
                if existing > 0, !replace {
                    throw CLIError("--to: \(settings.redacted) already holds \(existing) rows of Isle data; give --replace to empty it first")
                }
                var counts: [(String, Int)] = []
                for (i, name) in DataCopy.tables.enumerated() {
                    let table = try await source.exportTable(name)
                    try await target.importTable(table, replacing: replace && i == 0)
                    counts.append((name, table.rows.count))
                }
                try await target.resetSequences()
                return counts
            }
            for (name, n) in counts { say("\(name): \(n)") }
            say("copied \(from) to \(settings.redacted)")
        }
    }
}
