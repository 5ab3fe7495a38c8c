public import Foundation
import IsleCore
public import IsleDelivery
import Logging
import PostgresNIO

// Events and webhooks (docs/events.md). Several processes write events, and a transaction that
// numbered its event first may commit last: a reader that followed insert numbers would step over
// it for good. So writers insert events without a place in the stream (`seq` NULL, no lock on the
// delivery path), and readers give the committed ones their places first, in insert order, under
// one advisory lock held to that commit (``sequenceEvents(_:logger:)``): places only ever grow, and
// an event committed late gets a place after every one already read. An activity's events are
// inserted in the order its writes happened (each write holds the activity's lane or row lock
// while it inserts), so their places keep that order.
extension PostgresStore {
    static func insertEvents(_ conn: PostgresConnection, _ events: [NewEvent], logger: Logger) async throws {
        guard !events.isEmpty else { return }
        let none = "\u{1}"
        try await conn.rows(PG.InsertEvents.self, [.texts(events.map(\.bundleID)), .texts(events.map(\.type.rawValue)), .texts(events.map { $0.activityID ?? none }),
                                                   .jsons(events.map { JSONValue.object($0.data).jsonString }), .dates(events.map(\.at)),
                                                   .texts(events.map { $0.externalKey ?? none }), .texts(events.map { $0.installationID ?? none }), .texts(events.map { $0.userID ?? none })],
                                 logger: logger)
    }

    /// Gives committed events without a place theirs (namespace 2, key 0: the events lock).
    func sequenceEvents() async throws {
        let log = logger
        let pending = try await read { conn in try await conn.row("SELECT id FROM events WHERE seq IS NULL LIMIT 1", logger: log) != nil }
        guard pending else { return }
        try await transaction { conn in
            try await conn.rows("SELECT pg_advisory_xact_lock(2, 0)", logger: log)
            try await conn.rows("""
                WITH base AS (SELECT COALESCE(MAX(seq), 0) AS b FROM events),
                     pending AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events WHERE seq IS NULL ORDER BY id LIMIT 10000)
                UPDATE events AS e SET seq = base.b + pending.n FROM pending, base WHERE e.id = pending.id
                """, logger: log)
        }
    }

    static func event(_ r: PGRow) throws -> StoredEvent {
        let seq = try r.int("seq")
        let id = String(seq)
        guard let data = try BadRow.json(try r.string("data"), table: "events", id: id, column: "data").objectValue else {
            throw BadRow(table: "events", id: id, column: "data", found: "JSON that is not an object")
        }
        return StoredEvent(seq: seq, event: NewEvent(bundleID: try r.string("bundle_id"), type: try BadRow.decode(try r.string("type"), as: EventType.self, table: "events", id: id, column: "type"),
                                                     activityID: try r.optionalString("activity_id"), externalKey: try r.optionalString("external_key"),
                                                     installationID: try r.optionalString("installation_id"), userID: try r.optionalString("user_id"), data: data, at: try r.date("at")))
    }

    public func appendEvents(_ events: [NewEvent]) async throws {
        let log = logger
        try await transaction { conn in try await Self.insertEvents(conn, events, logger: log) }
    }

    public func events(bundleID: String, after seq: Int64, limit: Int) async throws -> [StoredEvent] {
        let log = logger
        try await sequenceEvents()
        return try await read { conn in
            try await conn.rows("SELECT seq, bundle_id, type, activity_id, data::text AS data, at, external_key, installation_id, user_id FROM events WHERE bundle_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                                [.text(bundleID), .int(seq), .int(max(0, limit))], logger: log).map(Self.event)
        }
    }

    public func lastEventSeq(bundleID: String) async throws -> Int64 {
        let log = logger
        try await sequenceEvents()
        return try await read { conn in
            try await conn.row("SELECT COALESCE(MAX(seq), 0) AS n FROM events WHERE bundle_id = $1", [.text(bundleID)], logger: log)?.int("n") ?? 0
        }
    }

    static func webhook(_ r: PGRow) throws -> WebhookRecord {
        WebhookRecord(id: try r.string("id"), bundleID: try r.string("bundle_id"), url: try r.string("url"), secret: try r.string("secret"), createdAt: try r.date("created_at"),
                      cursor: try r.int("cursor"), delivered: try r.int("delivered"), lastSuccessAt: try r.optionalDate("last_success_at"),
                      lastFailureAt: try r.optionalDate("last_failure_at"), lastStatus: try r.optionalInt("last_status").map(Int.init), lastError: try r.optionalString("last_error"),
                      failingSince: try r.optionalDate("failing_since"), nextAttemptAt: try r.optionalDate("next_attempt_at"), attempts: Int(try r.int("attempts")),
                      keyID: try r.optionalString("key_id"))
            .managed(eventTypes: try r.optionalString("event_types"), disabledAt: try r.optionalDate("disabled_at"), disabledReason: try r.optionalString("disabled_reason"),
                     previousSecret: try r.optionalString("previous_secret"), previousSecretUntil: try r.optionalDate("previous_secret_until"),
                     revision: try r.optionalInt("revision") ?? 0)
    }

    public func insertWebhook(_ w: WebhookRecord) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("INSERT INTO webhooks (id, bundle_id, url, secret, created_at, cursor, delivered, attempts, key_id, event_types) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                                [.text(w.id), .text(w.bundleID), .text(w.url), .text(w.secret), .date(w.createdAt), .int(w.cursor), .int(w.delivered), .int(w.attempts),
                                 .text(w.keyID), .text(w.eventTypesText)], logger: log)
        }
    }

    public func webhooks(bundleID: String) async throws -> [WebhookRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM webhooks WHERE bundle_id = $1 ORDER BY created_at, id", [.text(bundleID)], logger: log).map(Self.webhook)
        }
    }

    public func allWebhooks() async throws -> [WebhookRecord] {
        let log = logger
        return try await read { conn in try await conn.rows("SELECT * FROM webhooks ORDER BY created_at, id", logger: log).map(Self.webhook) }
    }

    public func webhook(id: String) async throws -> WebhookRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM webhooks WHERE id = $1", [.text(id)], logger: log).map(Self.webhook) }
    }

    public func deleteWebhook(id: String) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            let deleted = !(try await conn.rows("DELETE FROM webhooks WHERE id = $1 RETURNING id", [.text(id)], logger: log)).isEmpty
            try await conn.rows("DELETE FROM webhook_attempts WHERE webhook_id = $1", [.text(id)], logger: log)
            return deleted
        }
    }

    public func saveWebhookProgress(_ w: WebhookRecord) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            !(try await conn.rows("""
                UPDATE webhooks SET cursor = GREATEST(cursor, $1), delivered = $2, last_success_at = $3, last_failure_at = $4, last_status = $5, last_error = $6,
                    failing_since = $7, next_attempt_at = $8, attempts = $9 WHERE id = $10 AND revision = $11 RETURNING id
                """, [.int(w.cursor), .int(w.delivered), .date(w.lastSuccessAt), .date(w.lastFailureAt), .int(w.lastStatus), .text(w.lastError),
                      .date(w.failingSince), .date(w.nextAttemptAt), .int(w.attempts), .text(w.id), .int(w.revision)], logger: log)).isEmpty
        }
    }

    public func changeWebhook(_ w: WebhookRecord, replayFrom: Int64?, resetFailure: Bool, events: [NewEvent]) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            let changed = !(try await conn.rows("""
                UPDATE webhooks SET url = $1, event_types = $2, disabled_at = $3, disabled_reason = $4, secret = $5, previous_secret = $6, previous_secret_until = $7,
                    cursor = COALESCE($8, cursor), revision = revision + 1,
                    failing_since = CASE WHEN $9 THEN NULL ELSE failing_since END, next_attempt_at = CASE WHEN $9 THEN NULL ELSE next_attempt_at END,
                    attempts = CASE WHEN $9 THEN 0 ELSE attempts END
                WHERE id = $10 AND revision = $11 RETURNING id
                """, [.text(w.url), .text(w.eventTypesText), .date(w.disabledAt), .text(w.disabledReason), .text(w.secret), .text(w.previousSecret),
                      .date(w.previousSecretUntil), .int(replayFrom), .bool(resetFailure), .text(w.id), .int(w.revision)], logger: log)).isEmpty
            guard changed else { return false }
            try await Self.insertEvents(conn, events, logger: log)
            return true
        }
    }

    public func recordWebhookAttempt(_ a: WebhookAttempt) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("""
                INSERT INTO webhook_attempts (webhook_id, bundle_id, at, status, latency_ms, error, events, first_event, last_event, kind)
                SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 WHERE EXISTS (SELECT 1 FROM webhooks WHERE id = $1)
                """, [.text(a.webhookID), .text(a.bundleID), .date(a.at), .int(Int64(a.status)), .double(a.latencyMS), .text(a.error), .int(Int64(a.events)),
                      .int(a.firstEvent), .int(a.lastEvent), .text(a.kind)], logger: log)
            try await conn.rows("""
                DELETE FROM webhook_attempts WHERE webhook_id = $1 AND id <= (SELECT id FROM webhook_attempts WHERE webhook_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)
                """, [.text(a.webhookID), .int(Int64(WebhookAttempt.kept))], logger: log)
        }
    }

    public func webhookAttempts(webhookID: String, limit: Int) async throws -> [WebhookAttempt] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM webhook_attempts WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2", [.text(webhookID), .int(Int64(max(0, limit)))], logger: log).map { r in
                WebhookAttempt(webhookID: try r.string("webhook_id"), bundleID: try r.string("bundle_id"), at: try r.date("at"), status: Int(try r.int("status")),
                               latencyMS: try r.double("latency_ms"), error: try r.optionalString("error"), events: Int(try r.int("events")),
                               firstEvent: try r.optionalInt("first_event"), lastEvent: try r.optionalInt("last_event"), kind: try r.string("kind"), id: try r.int("id"))
            }
        }
    }

    /// Other instances may be sending: a dead one's holds end with their lease.
    public func releaseWebhookHoldsAtStart() async throws -> Int { 0 }

    public func holdWebhook(id: String, worker: String, now: Date, lease: TimeInterval) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            !(try await conn.rows("""
                UPDATE webhooks SET held_by = $1, held_until = $2 WHERE id = $3 AND (held_by IS NULL OR held_by = $1 OR held_until < $4) RETURNING id
                """, [.text(worker), .date(now.addingTimeInterval(lease)), .text(id), .date(now)], logger: log)).isEmpty
        }
    }
}

// The audit log of console actions.
extension PostgresStore {
    public func appendAudit(_ e: AuditEntry) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("INSERT INTO audit_log (bundle_id, key_id, action, target, detail, at) VALUES ($1, $2, $3, $4, $5, $6)",
                                [.text(e.bundleID), .text(e.keyID), .text(e.action), .text(e.target), .text(e.detail), .date(e.at)], logger: log)
        }
    }

    public func auditLog(bundleID: String, before: Int64?, limit: Int) async throws -> [AuditEntry] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM audit_log WHERE bundle_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
                                [.text(bundleID), .int(before ?? Int64.max), .int(max(0, limit))], logger: log).map { r in
                AuditEntry(bundleID: try r.string("bundle_id"), keyID: try r.string("key_id"), action: try r.string("action"), target: try r.optionalString("target"),
                           detail: try r.optionalString("detail"), at: try r.date("at"), id: try r.int("id"))
            }
        }
    }
}

// Operators' pauses.
extension PostgresStore {
    public func pauseApp(_ p: OperatorPause, event: NewEvent) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            // Inserted by this transaction or not: of two racing pauses, one writes the event.
            let inserted = try await conn.row("""
                INSERT INTO app_pauses (bundle_id, key_id, reason, at) VALUES ($1, $2, $3, $4) ON CONFLICT (bundle_id) DO NOTHING RETURNING bundle_id
                """, [.text(p.bundleID), .text(p.keyID), .text(p.reason), .date(p.at)], logger: log) != nil
            if inserted {
                try await Self.insertEvents(conn, [event], logger: log)
            } else {
                try await conn.rows("UPDATE app_pauses SET key_id = $2, reason = $3, at = $4 WHERE bundle_id = $1",
                                    [.text(p.bundleID), .text(p.keyID), .text(p.reason), .date(p.at)], logger: log)
            }
            return inserted
        }
    }

    public func resumeApp(bundleID: String, event: NewEvent) async throws -> OperatorPause? {
        let log = logger
        return try await transaction { conn in
            guard let r = try await conn.row("DELETE FROM app_pauses WHERE bundle_id = $1 RETURNING *", [.text(bundleID)], logger: log) else { return nil }
            try await Self.insertEvents(conn, [event], logger: log)
            return OperatorPause(bundleID: try r.string("bundle_id"), keyID: try r.string("key_id"), reason: try r.string("reason"), at: try r.date("at"))
        }
    }

    public func operatorPauses() async throws -> [OperatorPause] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM app_pauses ORDER BY bundle_id", logger: log).map { r in
                OperatorPause(bundleID: try r.string("bundle_id"), keyID: try r.string("key_id"), reason: try r.string("reason"), at: try r.date("at"))
            }
        }
    }
}

// The console's per-minute history.
extension PostgresStore {
    public func addHistory(_ points: [HistoryPoint]) async throws {
        guard !points.isEmpty else { return }
        let log = logger
        try await transaction { conn in
            try await conn.rows("""
                INSERT INTO history (bundle_id, minute, metric, count)
                SELECT b, m, k, n FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[]) AS t(b, m, k, n)
                WHERE EXISTS (SELECT 1 FROM apps WHERE apps.bundle_id = t.b) ORDER BY b, m, k
                ON CONFLICT (bundle_id, minute, metric) DO UPDATE SET count = history.count + EXCLUDED.count
                """, [.texts(points.map(\.bundleID)), .dates(points.map(\.minute)), .texts(points.map(\.metric)), .ints(points.map(\.count))], logger: log)
        }
    }

    public func history(bundleID: String, from: Date, to: Date, bucket: TimeInterval) async throws -> [HistoryPoint] {
        let log = logger
        let size = max(60, bucket)
        return try await read { conn in
            try await conn.rows("""
                SELECT metric, (floor(extract(epoch FROM minute) / $2) * $2)::float8 AS b, SUM(count)::bigint AS n FROM history
                WHERE bundle_id = $1 AND minute >= $3 AND minute < $4 GROUP BY metric, b ORDER BY b, metric
                """, [.text(bundleID), .double(size), .date(from), .date(to)], logger: log).map { r in
                HistoryPoint(bundleID: bundleID, minute: Date(timeIntervalSince1970: try r.double("b")), metric: try r.string("metric"), count: try r.int("n"))
            }
        }
    }
}

extension PostgresStore {
    public func highPrioritySends(bundleID: String, since: Date, limit: Int) async throws -> [(activityID: String, count: Int)] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT h.activity_id AS id, COUNT(*) AS n FROM high_priority_sends h JOIN activities a ON a.id = h.activity_id
                WHERE a.bundle_id = $1 AND h.at >= $2 GROUP BY h.activity_id ORDER BY n DESC, h.activity_id LIMIT $3
                """, [.text(bundleID), .date(since), .int(max(0, limit))], logger: log).map { (activityID: try $0.string("id"), count: Int(try $0.int("n"))) }
        }
    }
}

// MARK: Prepared statements (PreparedStatements.swift)

extension PG {
    enum InsertEvents: PreparedSQL {
        static let sql = """
            INSERT INTO events (bundle_id, type, activity_id, data, at, external_key, installation_id, user_id)
            SELECT b, t, NULLIF(a, E'\\x01'), d, at, NULLIF(k, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(u, E'\\x01')
            FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::timestamptz[], $6::text[], $7::text[], $8::text[]) WITH ORDINALITY AS e(b, t, a, d, at, k, i, u, n) ORDER BY n
            """
    }
}
