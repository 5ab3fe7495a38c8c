public import Foundation
import GRDB
import IsleCore
public import IsleDelivery
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Events and webhooks (docs/events.md). One process writes a SQLite file, one transaction at a
// time, so the order of the inserts is the commit order: an event's place in the stream (`seq`)
// is its insert's number, given in the same transaction.
extension SQLiteStore {
    static func insertEvents(_ db: Database, _ events: [NewEvent]) throws {
        guard !events.isEmpty else { return }
        try MultiRow.insert(db, into: "events (bundle_id, type, activity_id, data, at, external_key, installation_id, user_id)", events.map {
            [$0.bundleID, $0.type.rawValue, $0.activityID, JSONValue.object($0.data).jsonString, $0.at.timeIntervalSince1970, $0.externalKey, $0.installationID, $0.userID]
        })
        try db.cachedStatement(sql: "UPDATE events SET seq = id WHERE seq IS NULL").execute()
    }

    static func event(_ r: Row) throws -> StoredEvent {
        let seq: Int64 = r["seq"]
        let id = String(seq)
        guard let data = try BadRow.json(r["data"], table: "events", id: id, column: "data").objectValue else {
            throw BadRow(table: "events", id: id, column: "data", found: "JSON that is not an object")
        }
        return StoredEvent(seq: seq, event: NewEvent(bundleID: r["bundle_id"], type: try BadRow.decode(r["type"] as String, as: EventType.self, table: "events", id: id, column: "type"),
                                                     activityID: r["activity_id"], externalKey: r["external_key"], installationID: r["installation_id"], userID: r["user_id"],
                                                     data: data, at: Date(timeIntervalSince1970: r["at"])))
    }

    public func appendEvents(_ events: [NewEvent]) async throws {
        try await writer.write { db in try Self.insertEvents(db, events) }
    }

    public func events(bundleID: String, after seq: Int64, limit: Int) async throws -> [StoredEvent] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT * FROM events WHERE bundle_id = ? AND seq > ? ORDER BY seq LIMIT ?"),
                             arguments: [bundleID, seq, max(0, limit)]).map(Self.event)
        }
    }

    public func lastEventSeq(bundleID: String) async throws -> Int64 {
        try readNow { db in try Int64.fetchOne(db, sql: "SELECT COALESCE(MAX(seq), 0) FROM events WHERE bundle_id = ?", arguments: [bundleID]) ?? 0 }
    }

    static func webhook(_ r: Row) -> WebhookRecord {
        WebhookRecord(id: r["id"], bundleID: r["bundle_id"], url: r["url"], secret: r["secret"], createdAt: Date(timeIntervalSince1970: r["created_at"]),
                      cursor: r["cursor"], delivered: r["delivered"], lastSuccessAt: (r["last_success_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
                      lastFailureAt: (r["last_failure_at"] as Double?).map(Date.init(timeIntervalSince1970:)), lastStatus: r["last_status"], lastError: r["last_error"],
                      failingSince: (r["failing_since"] as Double?).map(Date.init(timeIntervalSince1970:)),
                      nextAttemptAt: (r["next_attempt_at"] as Double?).map(Date.init(timeIntervalSince1970:)), attempts: r["attempts"], keyID: r["key_id"])
            .managed(eventTypes: r["event_types"], disabledAt: (r["disabled_at"] as Double?).map(Date.init(timeIntervalSince1970:)), disabledReason: r["disabled_reason"],
                     previousSecret: r["previous_secret"], previousSecretUntil: (r["previous_secret_until"] as Double?).map(Date.init(timeIntervalSince1970:)),
                     revision: (r["revision"] as Int64?) ?? 0)
    }

    public func insertWebhook(_ w: WebhookRecord) async throws {
        try await writer.write { db in
            try db.execute(sql: "INSERT INTO webhooks (id, bundle_id, url, secret, created_at, cursor, delivered, attempts, key_id, event_types) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           arguments: [w.id, w.bundleID, w.url, w.secret, w.createdAt.timeIntervalSince1970, w.cursor, w.delivered, w.attempts, w.keyID, w.eventTypesText])
        }
    }

    public func webhooks(bundleID: String) async throws -> [WebhookRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM webhooks WHERE bundle_id = ? ORDER BY created_at, id", arguments: [bundleID]).map(Self.webhook) }
    }

    public func allWebhooks() async throws -> [WebhookRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM webhooks ORDER BY created_at, id").map(Self.webhook) }
    }

    public func webhook(id: String) async throws -> WebhookRecord? {
        try readNow { db in try Row.fetchOne(db, sql: "SELECT * FROM webhooks WHERE id = ?", arguments: [id]).map(Self.webhook) }
    }

    public func deleteWebhook(id: String) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: "DELETE FROM webhooks WHERE id = ?", arguments: [id])
            let deleted = db.changesCount > 0
            try db.execute(sql: "DELETE FROM webhook_attempts WHERE webhook_id = ?", arguments: [id])
            return deleted
        }
    }

    public func saveWebhookProgress(_ w: WebhookRecord) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: """
                UPDATE webhooks SET cursor = MAX(cursor, ?), delivered = ?, last_success_at = ?, last_failure_at = ?, last_status = ?, last_error = ?,
                    failing_since = ?, next_attempt_at = ?, attempts = ? WHERE id = ? AND revision = ?
                """, arguments: [w.cursor, w.delivered, w.lastSuccessAt?.timeIntervalSince1970, w.lastFailureAt?.timeIntervalSince1970, w.lastStatus, w.lastError,
                                 w.failingSince?.timeIntervalSince1970, w.nextAttemptAt?.timeIntervalSince1970, w.attempts, w.id, w.revision])
            return db.changesCount > 0
        }
    }

    public func changeWebhook(_ w: WebhookRecord, replayFrom: Int64?, resetFailure: Bool, events: [NewEvent]) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: """
                UPDATE webhooks SET url = ?, event_types = ?, disabled_at = ?, disabled_reason = ?, secret = ?, previous_secret = ?, previous_secret_until = ?,
                    cursor = COALESCE(?, cursor), revision = revision + 1,
                    failing_since = CASE WHEN ? THEN NULL ELSE failing_since END, next_attempt_at = CASE WHEN ? THEN NULL ELSE next_attempt_at END,
                    attempts = CASE WHEN ? THEN 0 ELSE attempts END
                WHERE id = ? AND revision = ?
                """, arguments: [w.url, w.eventTypesText, w.disabledAt?.timeIntervalSince1970, w.disabledReason, w.secret, w.previousSecret,
                                 w.previousSecretUntil?.timeIntervalSince1970, replayFrom, resetFailure, resetFailure, resetFailure, w.id, w.revision])
            guard db.changesCount > 0 else { return false }
            try Self.insertEvents(db, events)
            return true
        }
    }

    public func recordWebhookAttempt(_ a: WebhookAttempt) async throws {
        try await writer.write { db in
            try db.execute(sql: """
                INSERT INTO webhook_attempts (webhook_id, bundle_id, at, status, latency_ms, error, events, first_event, last_event, kind)
                SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM webhooks WHERE id = ?)
                """, arguments: [a.webhookID, a.bundleID, a.at.timeIntervalSince1970, a.status, a.latencyMS, a.error, a.events, a.firstEvent, a.lastEvent, a.kind, a.webhookID])
            try db.execute(sql: """
                DELETE FROM webhook_attempts WHERE webhook_id = ? AND id <= (SELECT id FROM webhook_attempts WHERE webhook_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)
                """, arguments: [a.webhookID, a.webhookID, WebhookAttempt.kept])
        }
    }

    public func webhookAttempts(webhookID: String, limit: Int) async throws -> [WebhookAttempt] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM webhook_attempts WHERE webhook_id = ? ORDER BY id DESC LIMIT ?", arguments: [webhookID, max(0, limit)]).map { r in
                WebhookAttempt(webhookID: r["webhook_id"], bundleID: r["bundle_id"], at: Date(timeIntervalSince1970: r["at"]), status: r["status"], latencyMS: r["latency_ms"],
                               error: r["error"], events: r["events"], firstEvent: r["first_event"], lastEvent: r["last_event"], kind: r["kind"], id: r["id"])
            }
        }
    }

    public func releaseWebhookHoldsAtStart() async throws -> Int {
        try await writer.write { db in
            try db.execute(sql: "UPDATE webhooks SET held_by = NULL, held_until = NULL WHERE held_by IS NOT NULL")
            return db.changesCount
        }
    }

    public func holdWebhook(id: String, worker: String, now: Date, lease: TimeInterval) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: "UPDATE webhooks SET held_by = ?, held_until = ? WHERE id = ? AND (held_by IS NULL OR held_by = ? OR held_until < ?)",
                           arguments: [worker, now.addingTimeInterval(lease).timeIntervalSince1970, id, worker, now.timeIntervalSince1970])
            return db.changesCount > 0
        }
    }
}

// The audit log of console actions.
extension SQLiteStore {
    public func appendAudit(_ e: AuditEntry) async throws {
        try await writer.write { db in
            try db.execute(sql: "INSERT INTO audit_log (bundle_id, key_id, action, target, detail, at) VALUES (?, ?, ?, ?, ?, ?)",
                           arguments: [e.bundleID, e.keyID, e.action, e.target, e.detail, e.at.timeIntervalSince1970])
        }
    }

    public func auditLog(bundleID: String, before: Int64?, limit: Int) async throws -> [AuditEntry] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM audit_log WHERE bundle_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
                             arguments: [bundleID, before ?? Int64.max, max(0, limit)]).map { r in
                AuditEntry(bundleID: r["bundle_id"], keyID: r["key_id"], action: r["action"], target: r["target"], detail: r["detail"],
                           at: Date(timeIntervalSince1970: r["at"]), id: r["id"])
            }
        }
    }
}

// Operators' pauses.
extension SQLiteStore {
    public func pauseApp(_ p: OperatorPause, event: NewEvent) async throws -> Bool {
        try await writer.write { db in
            let was = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_pauses WHERE bundle_id = ?", arguments: [p.bundleID]) == 1
            try db.execute(sql: "INSERT OR REPLACE INTO app_pauses (bundle_id, key_id, reason, at) VALUES (?, ?, ?, ?)",
                           arguments: [p.bundleID, p.keyID, p.reason, p.at.timeIntervalSince1970])
            if !was { try Self.insertEvents(db, [event]) }
            return !was
        }
    }

    public func resumeApp(bundleID: String, event: NewEvent) async throws -> OperatorPause? {
        try await writer.write { db in
            guard let r = try Row.fetchOne(db, sql: "SELECT * FROM app_pauses WHERE bundle_id = ?", arguments: [bundleID]) else { return nil }
            try db.execute(sql: "DELETE FROM app_pauses WHERE bundle_id = ?", arguments: [bundleID])
            try Self.insertEvents(db, [event])
            return OperatorPause(bundleID: r["bundle_id"], keyID: r["key_id"], reason: r["reason"], at: Date(timeIntervalSince1970: r["at"]))
        }
    }

    public func operatorPauses() async throws -> [OperatorPause] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM app_pauses ORDER BY bundle_id").map { r in
                OperatorPause(bundleID: r["bundle_id"], keyID: r["key_id"], reason: r["reason"], at: Date(timeIntervalSince1970: r["at"]))
            }
        }
    }
}

// The console's per-minute history.
extension SQLiteStore {
    public func addHistory(_ points: [HistoryPoint]) async throws {
        guard !points.isEmpty else { return }
        try await writer.write { db in
            let upsert = try db.cachedStatement(sql: """
                INSERT INTO history (bundle_id, minute, metric, count) SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM apps WHERE bundle_id = ?1)
                ON CONFLICT(bundle_id, minute, metric) DO UPDATE SET count = count + excluded.count
                """)
            for p in points { try upsert.execute(arguments: [p.bundleID, p.minute.timeIntervalSince1970, p.metric, p.count]) }
        }
    }

    public func history(bundleID: String, from: Date, to: Date, bucket: TimeInterval) async throws -> [HistoryPoint] {
        let size = max(60, bucket)
        return try readNow { db in
            try Row.fetchAll(db, sql: """
                SELECT metric, CAST(minute / ? AS INTEGER) * ? AS b, SUM(count) AS n FROM history
                WHERE bundle_id = ? AND minute >= ? AND minute < ? GROUP BY metric, b ORDER BY b, metric
                """, arguments: [size, size, bundleID, from.timeIntervalSince1970, to.timeIntervalSince1970]).map { r in
                HistoryPoint(bundleID: bundleID, minute: Date(timeIntervalSince1970: r["b"]), metric: r["metric"], count: r["n"])
            }
        }
    }
}

extension SQLiteStore {
    public func highPrioritySends(bundleID: String, since: Date, limit: Int) async throws -> [(activityID: String, count: Int)] {
        try readNow { db in
            try Row.fetchAll(db, sql: """
                SELECT h.activity_id AS id, COUNT(*) AS n FROM high_priority_sends h JOIN activities a ON a.id = h.activity_id
                WHERE a.bundle_id = ? AND h.at >= ? GROUP BY h.activity_id ORDER BY n DESC, h.activity_id LIMIT ?
                """, arguments: [bundleID, since.timeIntervalSince1970, max(0, limit)]).map { (activityID: $0["id"] as String, count: $0["n"] as Int) }
        }
    }
}

// Online backup (`isle db backup`).
extension SQLiteStore {
    /// Copies the database, as one consistent moment, to a new file at `path` (0600) while the
    /// server keeps serving (SQLite's online backup: readers and the writer go on); then checks the
    /// copy (`PRAGMA integrity_check`). Returns the copy's size in bytes.
    @discardableResult
    public func backup(to path: String) throws -> Int64 {
        try writeBackup(to: path, check: true)
    }

    /// The backup is written to a temporary file beside `path` (0600, a new name), checked, synced
    /// to disk, and only then given its name: a backup killed or failed mid-copy never leaves a
    /// partial file under the name an operator would restore from (and a failed one leaves nothing).
    /// The name is taken without replacing anything: a file that appeared there meanwhile is kept.
    ///
    /// `beforeNaming` runs with the temporary file's path once it is complete (tests stop there).
    func writeBackup(to path: String, check: Bool, beforeNaming: (String) throws -> Void = { _ in }) throws -> Int64 {
        guard !FileManager.default.fileExists(atPath: path) else { throw StoreError(.conflict, "\(path) exists; give a new file (a backup never overwrites)") }
        let temporary = try BackupFile.create(beside: path)
        do {
            let target = try DatabaseQueue(path: temporary)
            do {
                try pool.backup(to: target)
                if check {
                    let result = try target.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") }
                    guard result == ["ok"] else { throw StoreError(.unavailable, "the backup to \(path) fails SQLite's integrity check: \(result.prefix(3).joined(separator: "; "))") }
                }
                try target.close()
            } catch {
                try? target.close()
                throw error
            }
            // Closed, the copy is whole in its one file: a write-ahead log left beside it would be
            // part of the database that naming the file alone would lose.
            if let wal = try? FileManager.default.attributesOfItem(atPath: temporary + "-wal"), ((wal[.size] as? NSNumber)?.int64Value ?? 0) > 0 {
                throw StoreError(.unavailable, "the backup to \(path) was left with a write-ahead log; nothing was written under that name")
            }
            try BackupFile.sync(temporary)
            try beforeNaming(temporary)
            try BackupFile.name(temporary, as: path)
        } catch let e as StoreError {
            BackupFile.remove(temporary)
            throw e
        } catch {
            BackupFile.remove(temporary)
            throw StoreError(.unavailable, "the backup to \(path) failed: \(error)")
        }
        return ((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value) ?? 0
    }
}

/// The file system steps of a backup that must not leave a partial file under the final name.
enum BackupFile {
    /// `code`: `errno`, read before `what` is built.
    static func failure(_ code: Int32, _ what: String) -> StoreError {
        StoreError(.unavailable, "\(what): \(String(cString: strerror(code)))")
    }

    /// A new, empty file (mode 0600, created with O_EXCL: never one that exists) in the directory of
    /// `path`, so that naming it is a link within one file system. Hidden, and named after `path`,
    /// so that one left by a killed process says what it was.
    static func create(beside path: String) throws -> String {
        let url = URL(fileURLWithPath: path)
        let temporary = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).partial-\(UUID().uuidString.prefix(8))").path
        let fd = open(temporary, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure(errno, "cannot create the backup's temporary file \(temporary)") }
        close(fd)
        return temporary
    }

    /// Writes the file's data to disk before it gets its name: after a crash, the name holds the
    /// whole backup or does not exist.
    static func sync(_ path: String) throws {
        let fd = open(path, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw failure(errno, "cannot open \(path) to sync it") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure(errno, "cannot sync \(path) to disk") }
    }

    /// Gives `temporary` the name `path` in one step, never replacing a file there: a hard link
    /// (which fails if the name exists), then the temporary name removed. On a file system
    /// without hard links, `rename` (which would replace, so the name is checked free first).
    static func name(_ temporary: String, as path: String) throws {
        if link(temporary, path) == 0 {
            unlink(temporary)
        } else if errno == EEXIST {
            throw StoreError(.conflict, "\(path) exists; give a new file (a backup never overwrites)")
        } else {
            guard !FileManager.default.fileExists(atPath: path) else {
                throw StoreError(.conflict, "\(path) exists; give a new file (a backup never overwrites)")
            }
            guard rename(temporary, path) == 0 else { throw failure(errno, "cannot name the backup \(path)") }
        }
        // The new name itself to disk (best effort: some file systems cannot sync a directory).
        let directory = open(URL(fileURLWithPath: path).deletingLastPathComponent().path, O_RDONLY | O_CLOEXEC)
        if directory >= 0 {
            _ = fsync(directory)
            close(directory)
        }
    }

    /// The temporary file and any companion SQLite left beside it.
    static func remove(_ temporary: String) {
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(temporary + suffix) }
    }
}
