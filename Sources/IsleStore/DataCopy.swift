import Foundation
import IsleDelivery

/// Moving an installation's data between stores (`isle db copy`): every table, row by row, with
/// each value as the source stores it. The tables are copied in this order (references first).
public enum DataCopy {
    public static let tables = ["apps", "api_keys", "installations", "activities", "activity_topics", "channels", "topics", "topic_channels", "renewals", "jobs", "deliveries", "high_priority_sends", "idempotency", "events", "webhooks", "webhook_attempts", "audit_log", "app_pauses", "history"]

    /// One stored value.
    public enum Value: Sendable, Hashable {
        case null
        case int(Int64)
        case double(Double)
        case text(String)
    }

    /// A column as a store declares it: its name, its declared type in that store's dialect, and
    /// whether it may hold NULL. The store contract compares SQLite's and PostgreSQL's.
    public struct Column: Sendable, Hashable {
        public var name: String
        public var type: String
        public var nullable: Bool
        public init(name: String, type: String, nullable: Bool) {
            self.name = name
            self.type = type
            self.nullable = nullable
        }
    }

    /// A table's rows, by column name.
    public struct Table: Sendable {
        public var name: String
        public var columns: [String]
        public var rows: [[Value]]
        public init(name: String, columns: [String], rows: [[Value]]) {
            self.name = name
            self.columns = columns
            self.rows = rows
        }
    }
}
