public import Foundation
import GRDB
import IsleCore
public import IsleDelivery

// Long-lived activities (docs/server.md, "Activities that outlive 8 hours"), on SQLite.
extension SQLiteStore: RenewalRepository {
    public func putRenewal(_ r: RenewalRecord, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: """
                INSERT INTO renewals (activity_id, bundle_id, renew_until, alert, created_at, successor_id, predecessor_id, attributes, content_state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (activity_id) DO UPDATE SET renew_until = excluded.renew_until, alert = excluded.alert, attributes = excluded.attributes, content_state = excluded.content_state
                """, arguments: [r.activityID, r.bundleID, r.renewUntil.timeIntervalSince1970, r.alert.jsonString, r.createdAt.timeIntervalSince1970, r.successorID, r.predecessorID,
                                 r.attributes?.jsonString, r.contentState?.jsonString])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    static func renewal(_ r: Row) throws -> RenewalRecord {
        let id: String = r["activity_id"]
        return RenewalRecord(activityID: id, bundleID: r["bundle_id"], renewUntil: Date(timeIntervalSince1970: r["renew_until"]),
                             alert: try BadRow.json(r["alert"], table: "renewals", id: id, column: "alert"), createdAt: Date(timeIntervalSince1970: r["created_at"]),
                             successorID: r["successor_id"], predecessorID: r["predecessor_id"],
                             attributes: try (r["attributes"] as String?).map { try BadRow.json($0, table: "renewals", id: id, column: "attributes") },
                             contentState: try (r["content_state"] as String?).map { try BadRow.json($0, table: "renewals", id: id, column: "content_state") })
    }

    public func renewal(activityID: String) async throws -> RenewalRecord? {
        try readNow { db in try Row.fetchOne(db, sql: "SELECT * FROM renewals WHERE activity_id = ?", arguments: [activityID]).map(Self.renewal) }
    }

    public func deleteRenewal(activityID: String, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: "DELETE FROM renewals WHERE activity_id = ?", arguments: [activityID])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    public func dueRenewals(now: Date, lifetime: TimeInterval, lead: TimeInterval, limit: Int) async throws -> [RenewalRecord] {
        try readNow { db in
            try Row.fetchAll(db, sql: """
                SELECT r.* FROM renewals r JOIN activities a ON a.id = r.activity_id
                WHERE a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at + ? <= ? AND a.started_at + ? > ? AND r.renew_until > a.started_at + ?
                  AND (r.successor_id IS NULL OR NOT EXISTS (SELECT 1 FROM activities s WHERE s.id = r.successor_id))
                ORDER BY a.started_at LIMIT ?
                """, arguments: [lifetime - lead, now.timeIntervalSince1970, lifetime, now.timeIntervalSince1970, lifetime, limit]).map(Self.renewal)
        }
    }

    public func setSuccessor(activityID: String, successorID: String) async throws -> String {
        try await writer.write { db in
            try db.execute(sql: "UPDATE renewals SET successor_id = ? WHERE activity_id = ? AND successor_id IS NULL", arguments: [successorID, activityID])
            return try String.fetchOne(db, sql: "SELECT successor_id FROM renewals WHERE activity_id = ?", arguments: [activityID]) ?? successorID
        }
    }
}
