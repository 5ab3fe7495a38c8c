public import Foundation
import IsleCore
public import IsleDelivery
import Logging
import PostgresNIO

// Long-lived activities (docs/server.md, "Activities that outlive 8 hours"), on PostgreSQL: one
// successor per activity however many instances sweep at once (setSuccessor takes the first).
extension PostgresStore: RenewalRepository {
    public func putRenewal(_ r: RenewalRecord, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("""
                INSERT INTO renewals (activity_id, bundle_id, renew_until, alert, created_at, successor_id, predecessor_id, attributes, content_state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                ON CONFLICT (activity_id) DO UPDATE SET renew_until = excluded.renew_until, alert = excluded.alert, attributes = excluded.attributes, content_state = excluded.content_state
                """, [.text(r.activityID), .text(r.bundleID), .date(r.renewUntil), .json(r.alert.jsonString), .date(r.createdAt), .text(r.successorID), .text(r.predecessorID),
                      .json(r.attributes?.jsonString), .json(r.contentState?.jsonString)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    static func renewal(_ r: PGRow) throws -> RenewalRecord {
        let id = try r.string("activity_id")
        return RenewalRecord(activityID: id, bundleID: try r.string("bundle_id"), renewUntil: try r.date("renew_until"),
                             alert: try BadRow.json(try r.string("alert"), table: "renewals", id: id, column: "alert"), createdAt: try r.date("created_at"),
                             successorID: try r.optionalString("successor_id"), predecessorID: try r.optionalString("predecessor_id"),
                             attributes: try r.optionalString("attributes").map { try BadRow.json($0, table: "renewals", id: id, column: "attributes") },
                             contentState: try r.optionalString("content_state").map { try BadRow.json($0, table: "renewals", id: id, column: "content_state") })
    }

    public func renewal(activityID: String) async throws -> RenewalRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM renewals WHERE activity_id = $1", [.text(activityID)], logger: log).map(Self.renewal) }
    }

    public func deleteRenewal(activityID: String, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("DELETE FROM renewals WHERE activity_id = $1", [.text(activityID)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    public func dueRenewals(now: Date, lifetime: TimeInterval, lead: TimeInterval, limit: Int) async throws -> [RenewalRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT r.* FROM renewals r JOIN activities a ON a.id = r.activity_id
                WHERE a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at <= $1 AND a.started_at > $2 AND r.renew_until > a.started_at + make_interval(secs => $3)
                  AND (r.successor_id IS NULL OR NOT EXISTS (SELECT 1 FROM activities s WHERE s.id = r.successor_id))
                ORDER BY a.started_at LIMIT $4
                """, [.date(now.addingTimeInterval(-(lifetime - lead))), .date(now.addingTimeInterval(-lifetime)), .double(lifetime), .int(Int64(limit))], logger: log).map(Self.renewal)
        }
    }

    public func setSuccessor(activityID: String, successorID: String) async throws -> String {
        let log = logger
        return try await transaction { conn in
            try await conn.rows("UPDATE renewals SET successor_id = $1 WHERE activity_id = $2 AND successor_id IS NULL", [.text(successorID), .text(activityID)], logger: log)
            return try await conn.row("SELECT successor_id FROM renewals WHERE activity_id = $1", [.text(activityID)], logger: log)?.optionalString("successor_id") ?? successorID
        }
    }
}
