/// Isle's tables, written once: SQLite's and PostgreSQL's DDL are both rendered from this.
///
/// - A new database is created from ``tables`` in its store's dialect, at ``version(of:)``.
/// - A database made by an earlier Isle is brought forward by its store's frozen steps (the
///   numbered migrations each store kept before this definition existed, never edited), then by
///   ``changes``, which are rendered from this definition for both stores.
/// - The store contract builds a database both ways, on both stores, and checks that each matches
///   this definition column by column and index by index (`SchemaTests`).
///
/// The kinds say what a column holds; each dialect picks its type (see ``Kind``). Where the
/// dialects differ by design, a column or index names the one dialect it belongs to.
public enum Schema {
    public enum Dialect: String, Sendable, CaseIterable {
        case sqlite, postgres
    }

    /// What a column holds, and its type in each dialect.
    public enum Kind: Sendable {
        /// Text. The `aps` of a job is text in both stores, not JSON: it holds the exact bytes APNs
        /// gets, checked against the 4 KB limit when accepted, and `jsonb` would re-format them.
        case text
        /// A 64-bit integer.
        case integer
        /// A double.
        case real
        /// True or false: SQLite's 0/1, PostgreSQL's `BOOLEAN`.
        case flag
        /// A moment: seconds since 1970 as SQLite's `REAL`, PostgreSQL's `TIMESTAMPTZ`.
        case time
        /// A JSON document Isle wrote whose objects' key order means nothing: SQLite's `TEXT`,
        /// PostgreSQL's `JSONB` (which stores objects with their keys sorted).
        case json
        /// A JSON document whose objects' key order is part of what it says (an app's schemas list
        /// each type's fields in their declaration order): SQLite's `TEXT`, PostgreSQL's `JSON`
        /// (checked as JSON, kept as written).
        case orderedJSON
        /// A row number given by the database: SQLite's `INTEGER PRIMARY KEY AUTOINCREMENT` (or its
        /// rowid, where the column is PostgreSQL's only), PostgreSQL's `BIGSERIAL`.
        case rowNumber

        public func type(in dialect: Dialect) -> String {
            switch (self, dialect) {
            case (.text, _): "TEXT"
            case (.integer, .sqlite), (.flag, .sqlite), (.rowNumber, .sqlite): "INTEGER"
            case (.integer, .postgres): "BIGINT"
            case (.real, .sqlite), (.time, .sqlite): "REAL"
            case (.real, .postgres): "DOUBLE PRECISION"
            case (.flag, .postgres): "BOOLEAN"
            case (.time, .postgres): "TIMESTAMPTZ"
            case (.json, .sqlite), (.orderedJSON, .sqlite): "TEXT"
            case (.orderedJSON, .postgres): "JSON"
            case (.json, .postgres): "JSONB"
            case (.rowNumber, .postgres): "BIGSERIAL"
            }
        }
    }

    /// A column's default, written the same way in both dialects.
    public enum Default: Sendable, Equatable {
        case integer(Int)
        case flag(Bool)
        case json(String)

        func sql(in dialect: Dialect) -> String {
            switch (self, dialect) {
            case (.integer(let n), _): "\(n)"
            case (.flag(let b), .sqlite): b ? "1" : "0"
            case (.flag(let b), .postgres): b ? "TRUE" : "FALSE"
            case (.json(let j), _): "'\(j)'"
            }
        }
    }

    public struct Column: Sendable {
        public var name: String
        public var kind: Kind
        public var nullable: Bool
        public var primaryKey: Bool
        public var unique: Bool
        public var defaultValue: Default?
        /// `table(column)` this column refers to.
        public var references: String?
        /// The one dialect that has this column (nil: both).
        public var only: Dialect?

        public func sql(in dialect: Dialect) -> String {
            if kind == .rowNumber, primaryKey, dialect == .sqlite { return "\(name) INTEGER PRIMARY KEY AUTOINCREMENT" }
            var s = "\(name) \(kind.type(in: dialect))"
            if primaryKey { s += " PRIMARY KEY" }
            if !nullable, !primaryKey, kind != .rowNumber { s += " NOT NULL" }
            if unique { s += " UNIQUE" }
            if let d = defaultValue { s += " DEFAULT \(d.sql(in: dialect))" }
            if let r = references { s += " REFERENCES \(r)" }
            return s
        }
    }

    public struct Index: Sendable {
        public var name: String
        public var table: String
        public var columns: [String]
        /// The partial index's condition; `flag` columns are written `is_head`, rendered as each dialect tests a flag.
        public var condition: String?
        /// The one dialect that has this index (nil: both).
        public var only: Dialect?
        /// No two rows share its columns' values.
        public var unique = false

        public func sql(in dialect: Dialect) -> String {
            var s = "CREATE \(unique ? "UNIQUE " : "")INDEX \(name) ON \(table)(\(columns.joined(separator: ", ")))"
            if var c = condition {
                // SQLite uses a partial index only when the query's WHERE has the index's terms as
                // written, and Isle's SQLite queries test flags as `= 1`.
                if dialect == .sqlite { c = c.replacingOccurrences(of: "is_head AND", with: "is_head = 1 AND") }
                s += " WHERE \(c)"
            }
            return s
        }
    }

    public struct Table: Sendable {
        public var name: String
        public var columns: [Column]
        /// A primary key of several columns (nil: a column's own, or none).
        public var primaryKey: [String]?

        public func columns(in dialect: Dialect) -> [Column] { columns.filter { $0.only == nil || $0.only == dialect } }

        public func sql(in dialect: Dialect) -> String {
            var parts = columns(in: dialect).map { $0.sql(in: dialect) }
            if let pk = primaryKey { parts.append("PRIMARY KEY (\(pk.joined(separator: ", ")))") }
            return "CREATE TABLE \(name) (\(parts.joined(separator: ", ")))"
        }
    }

    // MARK: The definition

    static func c(_ name: String, _ kind: Kind, null: Bool = false, pk: Bool = false, unique: Bool = false, default d: Default? = nil,
                  references: String? = nil, only: Dialect? = nil) -> Column {
        Column(name: name, kind: kind, nullable: null, primaryKey: pk, unique: unique, defaultValue: d, references: references, only: only)
    }

    /// Every table, references first (the order ``DataCopy`` copies them in).
    public static let tables: [Table] = [
        Table(name: "apps", columns: [
            c("bundle_id", .text, pk: true), c("team_id", .text), c("key_id", .text), c("key_pem", .text), c("frequent_updates", .flag),
            c("schemas", .orderedJSON), c("created_at", .time), c("ticket_keys", .json, default: .json("[]")),
            c("environment_keys", .json, default: .json("[]")),
        ]),
        Table(name: "api_keys", columns: [
            c("id", .text, pk: true), c("bundle_id", .text, references: "apps(bundle_id)"), c("scope", .text), c("secret_hash", .text, unique: true),
            c("created_at", .time), c("revoked_at", .time, null: true),
        ]),
        Table(name: "installations", columns: [
            c("id", .text), c("bundle_id", .text), c("user_id", .text, null: true), c("push_to_start_tokens", .json), c("widget_token", .text, null: true),
            c("live_activities_enabled", .flag), c("frequent_pushes_enabled", .flag), c("updated_at", .time), c("secret_hash", .text, null: true),
            c("environment", .text, null: true), c("controls_token", .text, null: true),
            // What the app reported: the system has broadcast channels (iOS 18); the topics it follows for starts.
            c("broadcast_channels", .flag, null: true), c("topics", .json, null: true),
        ], primaryKey: ["bundle_id", "id"]),
        Table(name: "activities", columns: [
            c("id", .text, pk: true),
            // Registration order for PostgreSQL's listings; SQLite has its rowid.
            c("ord", .rowNumber, only: .postgres),
            c("bundle_id", .text), c("external_key", .text, null: true), c("installation_id", .text, null: true), c("attributes_type", .text),
            c("attributes", .json, null: true), c("content", .json, null: true), c("state", .text), c("update_token", .text, null: true),
            c("channel_id", .text, null: true), c("relevance_score", .real, null: true), c("stale_date", .time, null: true), c("started_at", .time),
            c("ended_at", .time, null: true), c("dismissed_at", .time, null: true), c("last_timestamp", .integer, null: true),
            c("state_reason", .text, null: true), c("environment", .text, null: true),
        ]),
        Table(name: "activity_topics", columns: [
            c("activity_id", .text, references: "activities(id)"), c("bundle_id", .text), c("topic", .text),
        ], primaryKey: ["activity_id", "topic"]),
        Table(name: "channels", columns: [
            c("id", .text, pk: true), c("bundle_id", .text), c("storage_policy", .integer), c("created_at", .time),
            c("last_timestamp", .integer, null: true), c("environment", .text, null: true),
        ]),
        // Topics a backend opened as audiences (docs/server.md, "Topics as audiences"), and the
        // broadcast channel each has per APNs environment (a row of `channels` too).
        Table(name: "topics", columns: [
            c("bundle_id", .text), c("topic", .text), c("storage_policy", .integer), c("close_after_idle", .integer), c("created_at", .time),
            c("ended_at", .time, null: true), c("last_push_at", .time, null: true),
            // The content of its last update sent now (not scheduled): a follower that registers later catches up to it.
            c("last_content", .json, null: true),
        ], primaryKey: ["bundle_id", "topic"]),
        Table(name: "topic_channels", columns: [
            c("channel_id", .text, pk: true), c("bundle_id", .text), c("topic", .text), c("environment", .text), c("created_at", .time), c("last_used_at", .time),
        ]),
        // Long-lived activities (docs/server.md, "Activities that outlive 8 hours"): renewed by a
        // successor started before the system's 8-hour end, until renew_until.
        Table(name: "renewals", columns: [
            c("activity_id", .text, pk: true), c("bundle_id", .text), c("renew_until", .time), c("alert", .json), c("created_at", .time),
            c("successor_id", .text, null: true), c("predecessor_id", .text, null: true),
            // The backend's attributes and content for the successor, when the server has none of
            // the activity's own (IsleClient never sends them: ActivityKit keeps them).
            c("attributes", .json, null: true), c("content_state", .json, null: true),
        ]),
        Table(name: "jobs", columns: [
            c("id", .rowNumber, pk: true), c("bundle_id", .text), c("kind", .text), c("activity_id", .text, null: true),
            c("installation_id", .text, null: true), c("channel_id", .text, null: true), c("aps", .text), c("has_alert", .flag),
            c("requested_priority", .integer, null: true), c("run_at", .time), c("state", .text), c("attempts", .integer, default: .integer(0)),
            c("claimed_by", .text, null: true), c("claimed_until", .time, null: true), c("last_error", .text, null: true), c("created_at", .time),
            c("push_timestamp", .integer, null: true), c("apns_id", .text, null: true), c("lane", .text, null: true), c("seq", .integer, null: true),
            c("is_head", .flag, default: .flag(false)), c("supersedable", .flag, default: .flag(false)), c("carries_content", .flag, default: .flag(false)),
            // The W3C traceparent of the request that queued the job, when the server traces.
            c("trace_parent", .text, null: true),
            // The requests APNs received for the job, and its last answer (docs/events.md, `push.failed`).
            c("apns_requests", .integer, default: .integer(0)), c("last_status", .integer, null: true), c("last_apns_reason", .text, null: true),
        ]),
        Table(name: "deliveries", columns: [
            c("id", .rowNumber, pk: true), c("job_id", .integer), c("activity_id", .text, null: true), c("apns_id", .text, null: true),
            c("apns_unique_id", .text, null: true), c("status", .integer), c("reason", .text, null: true), c("latency_ms", .real),
            c("priority", .integer), c("downgraded", .flag), c("at", .time),
            // The app, so its deliveries are found after their jobs are pruned (a broadcast's and a
            // widget push's have no activity). Null only in rows older than the column.
            c("bundle_id", .text, null: true),
            // What the device did with an accepted push, when the APNs says (isle sim does; Apple never).
            c("device_note", .text, null: true),
        ]),
        // One row per priority-10 push for each budget it spends: the activity's (its id) and its
        // installation's (`inst:<bundle id>/<installation id>`; a broadcast: each installation on the channel).
        Table(name: "high_priority_sends", columns: [
            c("id", .rowNumber, pk: true, only: .postgres), c("activity_id", .text), c("at", .time),
        ]),
        Table(name: "idempotency", columns: [
            c("bundle_id", .text), c("key", .text), c("request_hash", .text), c("status", .integer), c("body", .text), c("created_at", .time),
        ], primaryKey: ["bundle_id", "key"]),
        // An app's events in commit order (`seq`), and the webhooks that receive them (docs/events.md).
        // `id` is the insert's order; `seq` the place in the stream, given once the row is committed
        // (SQLite: in the insert's transaction, one writer; PostgreSQL: by readers, in commit order).
        Table(name: "events", columns: [
            c("id", .rowNumber, pk: true), c("seq", .integer, null: true, unique: true), c("bundle_id", .text), c("type", .text), c("activity_id", .text, null: true), c("data", .json), c("at", .time),
            // What the event is about, as the backend names it, when it happened.
            c("external_key", .text, null: true), c("installation_id", .text, null: true), c("user_id", .text, null: true),
        ]),
        Table(name: "webhooks", columns: [
            c("id", .text, pk: true), c("bundle_id", .text), c("url", .text), c("secret", .text), c("created_at", .time), c("cursor", .integer),
            c("delivered", .integer, default: .integer(0)), c("last_success_at", .time, null: true), c("last_failure_at", .time, null: true),
            c("last_status", .integer, null: true), c("last_error", .text, null: true), c("failing_since", .time, null: true),
            c("next_attempt_at", .time, null: true), c("attempts", .integer, default: .integer(0)),
            c("held_by", .text, null: true), c("held_until", .time, null: true),
            // The API key that made it (nil: the console, or before keys were recorded): it stops
            // when that key is revoked (docs/events.md).
            c("key_id", .text, null: true),
            // Webhooks managed (docs/events.md): its event types (a JSON array; null: every type),
            // disabled, the secret before the last rotation, the settings' revision.
            c("event_types", .text, null: true), c("disabled_at", .time, null: true), c("disabled_reason", .text, null: true),
            c("previous_secret", .text, null: true), c("previous_secret_until", .time, null: true), c("revision", .integer, default: .integer(0)),
        ]),
        // Each webhook's recent requests: when, the answer, how long, which events.
        Table(name: "webhook_attempts", columns: [
            c("id", .rowNumber, pk: true), c("webhook_id", .text), c("bundle_id", .text), c("at", .time), c("status", .integer), c("latency_ms", .real),
            c("error", .text, null: true), c("events", .integer), c("first_event", .integer, null: true), c("last_event", .integer, null: true), c("kind", .text),
        ]),
        // What operators did in the console: who (the admin key), what, when (docs/server.md).
        Table(name: "audit_log", columns: [
            c("id", .rowNumber, pk: true), c("bundle_id", .text), c("key_id", .text), c("action", .text), c("target", .text, null: true),
            c("detail", .text, null: true), c("at", .time),
        ]),
        // Per-minute delivery counters per app (the console's history).
        Table(name: "history", columns: [
            c("bundle_id", .text), c("minute", .time), c("metric", .text), c("count", .integer),
        ], primaryKey: ["bundle_id", "minute", "metric"]),
        // Apps an operator paused by hand (the console).
        Table(name: "app_pauses", columns: [
            c("bundle_id", .text, pk: true), c("key_id", .text), c("reason", .text), c("at", .time),
        ]),
    ]

    public static let indexes: [Index] = [
        Index(name: "installations_user", table: "installations", columns: ["bundle_id", "user_id"]),
        Index(name: "installations_updated", table: "installations", columns: ["updated_at"]),
        Index(name: "activities_key", table: "activities", columns: ["bundle_id", "external_key"]),
        Index(name: "activities_token", table: "activities", columns: ["bundle_id", "update_token"]),
        Index(name: "activities_installation", table: "activities", columns: ["bundle_id", "installation_id", "state"]),
        // GET /v1/activities: an app's activities, newest first, paged.
        Index(name: "activities_listed", table: "activities", columns: ["bundle_id", "started_at", "id"]),
        Index(name: "webhook_attempts_hook", table: "webhook_attempts", columns: ["webhook_id", "id"]),
        Index(name: "activities_finished", table: "activities", columns: ["started_at"], condition: "state IN ('ended', 'dismissed', 'unreachable')"),
        // Live activities nothing was pushed to (the sweep's unused-activity retention).
        Index(name: "activities_unpushed", table: "activities", columns: ["started_at"], condition: "last_timestamp IS NULL AND state IN ('starting', 'active')"),
        Index(name: "activities_channel", table: "activities", columns: ["channel_id"]),
        Index(name: "activity_topics_lookup", table: "activity_topics", columns: ["bundle_id", "topic"]),
        Index(name: "channels_app", table: "channels", columns: ["bundle_id"]),
        Index(name: "topic_channels_topic", table: "topic_channels", columns: ["bundle_id", "topic", "environment"], unique: true),
        Index(name: "topic_channels_used", table: "topic_channels", columns: ["last_used_at"]),
        Index(name: "jobs_ready", table: "jobs", columns: ["run_at", "seq"], condition: "is_head AND state = 'queued'"),
        Index(name: "jobs_lane_open", table: "jobs", columns: ["lane", "seq"], condition: "state IN ('queued', 'claimed')"),
        Index(name: "jobs_scheduled", table: "jobs", columns: ["run_at", "id"], condition: "state = 'scheduled'"),
        Index(name: "jobs_claimed", table: "jobs", columns: ["claimed_until"], condition: "state = 'claimed'"),
        Index(name: "jobs_seq", table: "jobs", columns: ["seq"], only: .sqlite),
        Index(name: "jobs_finished", table: "jobs", columns: ["created_at"], condition: "state IN ('sent', 'failed', 'superseded', 'dropped')"),
        Index(name: "jobs_unsent", table: "jobs", columns: ["activity_id", "created_at"], condition: "state IN ('superseded', 'dropped')"),
        Index(name: "jobs_failed", table: "jobs", columns: ["activity_id", "created_at"], condition: "state = 'failed'"),
        Index(name: "deliveries_activity", table: "deliveries", columns: ["activity_id", "id"]),
        Index(name: "deliveries_apns", table: "deliveries", columns: ["apns_id"]),
        Index(name: "deliveries_at", table: "deliveries", columns: ["at"]),
        Index(name: "high_priority_sends_activity", table: "high_priority_sends", columns: ["activity_id", "at"]),
        Index(name: "high_priority_sends_at", table: "high_priority_sends", columns: ["at"]),
        Index(name: "idempotency_created", table: "idempotency", columns: ["created_at"]),
        Index(name: "events_app", table: "events", columns: ["bundle_id", "seq"]),
        Index(name: "events_at", table: "events", columns: ["at"]),
        Index(name: "events_pending", table: "events", columns: ["id"], condition: "seq IS NULL"),
        Index(name: "webhooks_app", table: "webhooks", columns: ["bundle_id"]),
        Index(name: "audit_log_app", table: "audit_log", columns: ["bundle_id", "id"]),
        Index(name: "history_minute", table: "history", columns: ["minute"]),
    ]

    /// Which rows of each table belong to an app, for `isle app remove` (docs/server.md, "Removing
    /// an app"): every table, rows that refer to others first, `apps` last. `{app}` is the bundle id's
    /// one parameter (SQLite's `?1`, PostgreSQL's `$1`). `AppRemovalTests` checks that no table is left out.
    public static let appRows: [(table: String, condition: String)] = [
        // A delivery names its app; one written before that column, its job or its activity.
        ("deliveries", "bundle_id = {app} OR (bundle_id IS NULL AND (job_id IN (SELECT id FROM jobs WHERE bundle_id = {app}) OR activity_id IN (SELECT id FROM activities WHERE bundle_id = {app})))"),
        // Keyed by an activity id, or by an installation's budget key `inst:<bundle id>/<installation>`.
        ("high_priority_sends", "activity_id IN (SELECT id FROM activities WHERE bundle_id = {app}) OR activity_id IN (SELECT 'inst:' || bundle_id || '/' || id FROM installations WHERE bundle_id = {app})"),
        ("activity_topics", "bundle_id = {app}"),
        ("jobs", "bundle_id = {app}"),
        ("activities", "bundle_id = {app}"),
        ("topic_channels", "bundle_id = {app}"),
        ("topics", "bundle_id = {app}"),
        ("renewals", "bundle_id = {app}"),
        ("channels", "bundle_id = {app}"),
        ("installations", "bundle_id = {app}"),
        ("idempotency", "bundle_id = {app}"),
        ("events", "bundle_id = {app}"),
        ("webhook_attempts", "bundle_id = {app}"),
        ("webhooks", "bundle_id = {app}"),
        ("audit_log", "bundle_id = {app}"),
        ("history", "bundle_id = {app}"),
        ("app_pauses", "bundle_id = {app}"),
        ("api_keys", "bundle_id = {app}"),
        ("apps", "bundle_id = {app}"),
    ]

    /// ``appRows``' conditions in `dialect`.
    public static func appRows(in dialect: Dialect) -> [(table: String, condition: String)] {
        let parameter = dialect == .sqlite ? "?1" : "$1"
        return appRows.map { ($0.table, $0.condition.replacingOccurrences(of: "{app}", with: parameter)) }
    }

    /// Sequences outside any table: PostgreSQL's job order across instances (SQLite numbers jobs by
    /// their `id` as one writer inserts them).
    static let postgresSequences = ["job_seq"]

    public static func table(_ name: String) -> Table? { tables.first { $0.name == name } }

    /// The statements that create the whole schema in `dialect`.
    public static func create(in dialect: Dialect) -> [String] {
        (dialect == .postgres ? postgresSequences.map { "CREATE SEQUENCE \($0)" } : [])
            + tables.map { $0.sql(in: dialect) }
            + indexes.filter { $0.only == nil || $0.only == dialect }.map { $0.sql(in: dialect) }
    }

    // MARK: Changes after the frozen steps

    /// A change to the schema, rendered for both stores. Append only; each store records it as
    /// its frozen steps' count plus its place here.
    public struct Change: Sendable {
        public var name: String
        public var statements: @Sendable (Dialect) -> [String]
    }

    public static let changes: [Change] = [
        // PostgreSQL keeps moments as TIMESTAMPTZ and Isle's JSON documents as JSONB (they were
        // DOUBLE PRECISION seconds and TEXT); SQLite's types already are the definition's.
        Change(name: "typed moments and JSON") { dialect in
            guard dialect == .postgres else { return [] }
            return tables.filter { !addedByLaterChanges.contains($0.name) }.flatMap { table in
                table.columns(in: .postgres).filter { !(columnsAddedLater[table.name] ?? []).contains($0.name) }.flatMap { column -> [String] in
                    let alter = "ALTER TABLE \(table.name) ALTER COLUMN \(column.name)"
                    switch column.kind {
                    case .time: return ["\(alter) TYPE TIMESTAMPTZ USING to_timestamp(\(column.name))"]
                    case .json:
                        // A default cannot be cast with the column: dropped, then set again as JSON.
                        let reset = column.defaultValue.map { _ in ["\(alter) DROP DEFAULT"] } ?? []
                        let restore = column.defaultValue.map { ["\(alter) SET DEFAULT \($0.sql(in: .postgres))"] } ?? []
                        return reset + ["\(alter) TYPE JSONB USING \(column.name)::jsonb"] + restore
                    case .orderedJSON: return ["\(alter) TYPE JSON USING \(column.name)::json"]
                    default: return []
                    }
                }
            }
        },
        // Events and webhooks (docs/events.md), as the definition has them.
        Change(name: "events and webhooks") { dialect in newTables(["events", "webhooks"], dialect) },
        Change(name: "audit log") { dialect in newTables(["audit_log"], dialect) },
        Change(name: "operator pauses") { dialect in newTables(["app_pauses"], dialect) },
        Change(name: "history") { dialect in newTables(["history"], dialect) },
        Change(name: "trace context") { _ in ["ALTER TABLE jobs ADD COLUMN trace_parent TEXT"] },
        Change(name: "deliveries by app") { _ in
            ["ALTER TABLE deliveries ADD COLUMN bundle_id TEXT",
             """
             UPDATE deliveries SET bundle_id = COALESCE((SELECT j.bundle_id FROM jobs j WHERE j.id = deliveries.job_id),
                                                        (SELECT a.bundle_id FROM activities a WHERE a.id = deliveries.activity_id))
             """]
        },
        Change(name: "unpushed activities and webhook keys") { dialect in
            [indexes.first { $0.name == "activities_unpushed" }!.sql(in: dialect), "ALTER TABLE webhooks ADD COLUMN key_id TEXT"]
        },
        // The console shows an activity's pushes that were never sent (superseded, cancelled).
        Change(name: "unsent jobs by activity") { dialect in [indexes.first { $0.name == "jobs_unsent" }!.sql(in: dialect)] },
        Change(name: "device notes") { _ in ["ALTER TABLE deliveries ADD COLUMN device_note TEXT"] },
        // Events name the order, installation and user; a failed push's event APNs' last answer;
        // GET /v1/activities pages an app's activities newest first.
        Change(name: "event subjects, job answers, activities listed") { dialect in
            let integer = dialect == .postgres ? "BIGINT" : "INTEGER"
            return ["ALTER TABLE events ADD COLUMN external_key TEXT", "ALTER TABLE events ADD COLUMN installation_id TEXT", "ALTER TABLE events ADD COLUMN user_id TEXT",
                    "ALTER TABLE jobs ADD COLUMN apns_requests \(integer) NOT NULL DEFAULT 0", "ALTER TABLE jobs ADD COLUMN last_status \(integer)",
                    "ALTER TABLE jobs ADD COLUMN last_apns_reason TEXT", indexes.first { $0.name == "activities_listed" }!.sql(in: dialect)]
        },
        // Webhooks managed: filters, disable, secret rotation, replay, a log of attempts.
        Change(name: "webhooks managed") { dialect in
            let time = dialect == .postgres ? "TIMESTAMPTZ" : "REAL"
            let integer = dialect == .postgres ? "BIGINT" : "INTEGER"
            return ["ALTER TABLE webhooks ADD COLUMN event_types TEXT", "ALTER TABLE webhooks ADD COLUMN disabled_at \(time)", "ALTER TABLE webhooks ADD COLUMN disabled_reason TEXT",
                    "ALTER TABLE webhooks ADD COLUMN previous_secret TEXT", "ALTER TABLE webhooks ADD COLUMN previous_secret_until \(time)",
                    "ALTER TABLE webhooks ADD COLUMN revision \(integer) NOT NULL DEFAULT 0"] + newTables(["webhook_attempts"], dialect)
        },
        // A key per APNs environment (Apple's environment-scoped keys), beside the app's own.
        Change(name: "keys per environment") { dialect in
            ["ALTER TABLE apps ADD COLUMN \(tables.first { $0.name == "apps" }!.columns.first { $0.name == "environment_keys" }!.sql(in: dialect))"]
        },
        // An installation's control push token (iOS 18 controls pushes).
        Change(name: "control push tokens") { _ in ["ALTER TABLE installations ADD COLUMN controls_token TEXT"] },
        // Topics as audiences: a broadcast channel per topic and environment.
        // (PostgreSQL had the index of activities by channel already.)
        Change(name: "topic channels") { dialect in
            newTables(["topics", "topic_channels"], dialect) + (dialect == .sqlite ? [indexes.first { $0.name == "activities_channel" }!.sql(in: dialect)] : [])
        },
        // Starts for an audience: the installation's broadcast channels (iOS 18) and followed topics.
        Change(name: "installation capabilities and topics") { dialect in
            ["ALTER TABLE installations ADD COLUMN broadcast_channels \(Kind.flag.type(in: dialect))", "ALTER TABLE installations ADD COLUMN topics \(Kind.json.type(in: dialect))"]
        },
        // Activities renewed past the system's 8 hours.
        Change(name: "renewals") { dialect in newTables(["renewals"], dialect) },
        // A topic's latest content, for followers that register after an update.
        Change(name: "topic content") { dialect in ["ALTER TABLE topics ADD COLUMN last_content \(Kind.json.type(in: dialect))"] },
        // What an activity's failed pushes carried, for its next token (ActivityController.refresh).
        Change(name: "failed jobs by activity") { dialect in [indexes.first { $0.name == "jobs_failed" }!.sql(in: dialect)] },
    ]

    /// Tables a later change creates, which the changes before it must not touch.
    static let addedByLaterChanges: Set<String> = ["events", "webhooks", "audit_log", "app_pauses", "history", "webhook_attempts", "topics", "topic_channels", "renewals"]

    /// Columns a later change adds to a table an earlier change created: that change leaves them out.
    static let columnsAddedLater: [String: Set<String>] = [
        "apps": ["environment_keys"],
        "installations": ["controls_token", "broadcast_channels", "topics"],
        "topics": ["last_content"],
        "webhooks": ["key_id", "event_types", "disabled_at", "disabled_reason", "previous_secret", "previous_secret_until", "revision"],
        "events": ["external_key", "installation_id", "user_id"],
    ]

    /// The statements that create `names` (and their indexes) as the definition has them, less
    /// the columns later changes add.
    static func newTables(_ names: [String], _ dialect: Dialect) -> [String] {
        names.compactMap { name in
            table(name).map { t in
                var t = t
                t.columns.removeAll { columnsAddedLater[name]?.contains($0.name) == true }
                return t.sql(in: dialect)
            }
        } + indexes.filter { names.contains($0.table) && ($0.only == nil || $0.only == dialect) }.map { $0.sql(in: dialect) }
    }
}

/// A database's schema version beside the one this binary knows (docs/server.md, "Upgrades and
/// rollbacks"). Version 0: a new, empty database.
public struct SchemaCheck: Sendable, Hashable {
    public var current: Int
    public var known: Int

    public init(current: Int, known: Int) {
        self.current = current
        self.known = known
    }

    /// What is wrong, if anything: a database newer than this binary.
    public var problem: String? {
        guard current > known else { return nil }
        return "its schema is version \(current), written by a newer Isle; this binary knows versions up to \(known). Run the Isle that wrote it (or newer), or restore the backup taken before that upgrade: migrations only go forward"
    }

    /// Refuses a database newer than this binary.
    func refuseNewer() throws {
        if let problem { throw StoreError(.refused, problem) }
    }
}
