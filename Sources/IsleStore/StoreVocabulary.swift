public import Foundation
public import IsleCore
public import IsleDelivery

// What storage, the HTTP API and their operators speak of, beside the delivery model: keys and
// their scopes, webhooks, the audit log and the console's history, idempotent answers, retention
// and the stores' errors.

public enum APIKeyScope: String, Sendable, Hashable, Codable, CaseIterable {
    /// The app's backend: start, update, end, fan out, read.
    case backend
    /// The app on a device: register tokens and report state.
    case device
    /// An operator: the web console (`/console`) only, never the API.
    case admin
    /// An operator of the whole server: the console for every app, with an app switcher. Created
    /// on one app (the one the console opens on); never the API.
    case serverAdmin = "server-admin"
    /// An operator who only looks: every console page of its app, and no action (nothing sent,
    /// ended, cancelled, retried, paused or resumed, no webhook added or deleted) — for people on
    /// call or in support who must see what happened without being able to change it. Never the API.
    case viewer

    /// A key that signs in to the console.
    public var isConsole: Bool { self == .admin || self == .serverAdmin || self == .viewer }
    /// A console key that may act, not only look: every console key but a viewer.
    public var actsInConsole: Bool { self == .admin || self == .serverAdmin }
}

/// An API key, stored as a SHA-256 hash of the secret.
public struct APIKeyRecord: Sendable, Hashable {
    public var id: String
    public var bundleID: String
    public var scope: APIKeyScope
    public var secretHash: String
    public var createdAt: Date
    public var revokedAt: Date?
    public init(id: String, bundleID: String, scope: APIKeyScope, secretHash: String, createdAt: Date, revokedAt: Date? = nil) {
        self.id = id
        self.bundleID = bundleID
        self.scope = scope
        self.secretHash = secretHash
        self.createdAt = createdAt
        self.revokedAt = revokedAt
    }
}

/// A backend's webhook endpoint: where an app's events are POSTed, signed with its secret, in
/// order, each batch until the endpoint answers 2xx (docs/events.md).
public struct WebhookRecord: Sendable, Hashable {
    public var id: String
    public var bundleID: String
    public var url: String
    /// The signing secret as stored (sealed with the master key when there is one).
    public var secret: String
    public var createdAt: Date
    /// The last event the endpoint acknowledged (its `seq`); the next batch starts after it.
    public var cursor: Int64
    public var delivered: Int64
    public var lastSuccessAt: Date?
    public var lastFailureAt: Date?
    /// The endpoint's last failing answer (0: no answer at all), and what went wrong.
    public var lastStatus: Int?
    public var lastError: String?
    /// Failing since (nil while it answers).
    public var failingSince: Date?
    public var nextAttemptAt: Date?
    public var attempts: Int
    /// The API key that made it: the webhook stops when that key is revoked (nil: made in the
    /// console, or before keys were recorded; it belongs to the app).
    public var keyID: String?
    /// The event types it receives; nil: every type. Others are skipped (its cursor moves past them).
    public var eventTypes: [EventType]?
    /// Disabled (by the API, the console, or after failing too long): nothing is sent until enabled.
    public var disabledAt: Date?
    public var disabledReason: String?
    /// The secret before the last rotation (stored as ``secret`` is), still signing until then.
    public var previousSecret: String?
    public var previousSecretUntil: Date?
    /// Bumped by every change of its settings (``EventRepository/changeWebhook(_:replayFrom:resetFailure:events:)``):
    /// a sender's progress is saved only under the revision it read, so a replay or a disable is
    /// never undone by a round that was under way.
    public var revision: Int64 = 0

    /// Whether the webhook receives events of `type`.
    public func receives(_ type: EventType) -> Bool { eventTypes?.contains(type) ?? true }

    /// ``eventTypes`` as stored: a JSON array of names, or nil.
    public var eventTypesText: String? { eventTypes.map { JSONValue.array($0.map { .string($0.rawValue) }).jsonString } }

    /// The record with its management columns read back (an unknown type name is left out: a
    /// newer Isle's filter read by an older one receives fewer types, never more).
    public func managed(eventTypes text: String?, disabledAt: Date?, disabledReason: String?, previousSecret: String?, previousSecretUntil: Date?, revision: Int64) -> WebhookRecord {
        var w = self
        w.eventTypes = text.flatMap { try? JSONParser.parse($0) }?.arrayValue.map { $0.compactMap { $0.stringValue.flatMap(EventType.init(rawValue:)) } }
        w.disabledAt = disabledAt
        w.disabledReason = disabledReason
        w.previousSecret = previousSecret
        w.previousSecretUntil = previousSecretUntil
        w.revision = revision
        return w
    }

    public init(id: String, bundleID: String, url: String, secret: String, createdAt: Date, cursor: Int64, delivered: Int64 = 0, lastSuccessAt: Date? = nil,
                lastFailureAt: Date? = nil, lastStatus: Int? = nil, lastError: String? = nil, failingSince: Date? = nil, nextAttemptAt: Date? = nil, attempts: Int = 0,
                keyID: String? = nil) {
        self.keyID = keyID
        self.id = id
        self.bundleID = bundleID
        self.url = url
        self.secret = secret
        self.createdAt = createdAt
        self.cursor = cursor
        self.delivered = delivered
        self.lastSuccessAt = lastSuccessAt
        self.lastFailureAt = lastFailureAt
        self.lastStatus = lastStatus
        self.lastError = lastError
        self.failingSince = failingSince
        self.nextAttemptAt = nextAttemptAt
        self.attempts = attempts
    }

    /// After the endpoint acknowledged the events up to `seq` (`count` of them).
    public mutating func acknowledged(through seq: Int64, count: Int, at now: Date) {
        cursor = max(cursor, seq)
        delivered += Int64(count)
        lastSuccessAt = now
        failingSince = nil
        nextAttemptAt = nil
        attempts = 0
    }

    /// After a failed attempt: the next one waits 1 s, 2 s, 4 s, … up to `maximumBackoff`.
    public mutating func failed(status: Int, error: String, at now: Date, maximumBackoff: TimeInterval = 300) {
        attempts += 1
        lastFailureAt = now
        lastStatus = status
        lastError = error
        if failingSince == nil { failingSince = now }
        nextAttemptAt = now.addingTimeInterval(min(maximumBackoff, pow(2, Double(min(attempts - 1, 20)))))
    }
}

/// One request to a webhook endpoint, for its log of recent attempts (`GET /v1/webhooks/{id}/attempts`).
public struct WebhookAttempt: Sendable, Hashable {
    /// Attempts kept per webhook (the oldest go as new ones are written).
    public static let kept = 100
    public var webhookID: String
    public var bundleID: String
    public var at: Date
    /// The endpoint's status (0: no answer).
    public var status: Int
    public var latencyMS: Double
    /// What went wrong, as the API says it (never the endpoint's body); nil for a 2xx.
    public var error: String?
    /// The events the request carried, and the first and last of them.
    public var events: Int
    public var firstEvent: Int64?
    public var lastEvent: Int64?
    /// `delivery` (the stream) or `redelivery` (one event sent again on request).
    public var kind: String
    public var id: Int64?
    public init(webhookID: String, bundleID: String, at: Date, status: Int, latencyMS: Double, error: String?, events: Int, firstEvent: Int64?, lastEvent: Int64?,
                kind: String, id: Int64? = nil) {
        self.webhookID = webhookID
        self.bundleID = bundleID
        self.at = at
        self.status = status
        self.latencyMS = latencyMS
        self.error = error
        self.events = events
        self.firstEvent = firstEvent
        self.lastEvent = lastEvent
        self.kind = kind
        self.id = id
    }
}

/// One operator action in the console, for the audit log: who (the admin key's id), what, when.
public struct AuditEntry: Sendable, Hashable {
    public var bundleID: String
    public var keyID: String
    /// `job.cancel`, `job.retry`, `activity.end`, `activity.push`, `app.pause`, `app.resume`,
    /// `webhook.create`, `webhook.delete`, `signIn`.
    public var action: String
    public var target: String?
    public var detail: String?
    public var at: Date
    /// The store's id (set when read).
    public var id: Int64?
    public init(bundleID: String, keyID: String, action: String, target: String? = nil, detail: String? = nil, at: Date, id: Int64? = nil) {
        self.bundleID = bundleID
        self.keyID = keyID
        self.action = action
        self.target = target
        self.detail = detail
        self.at = at
        self.id = id
    }
}

/// Per-minute counters of an app's deliveries, kept with a retention for the console's history
/// (docs/server.md): outcomes, APNs reasons, priority downgrades, and histograms of APNs latency
/// and time in queue (quantiles are read from the summed buckets).
public struct HistoryPoint: Sendable, Hashable {
    public var bundleID: String
    /// The minute (or, when read back, the start of the bucket).
    public var minute: Date
    public var metric: String
    public var count: Int64
    public init(bundleID: String, minute: Date, metric: String, count: Int64) {
        self.bundleID = bundleID
        self.minute = minute
        self.metric = metric
        self.count = count
    }
}

public enum HistoryMetric {
    public static let delivered = "delivered"
    public static let failed = "failed"
    public static let retried = "retried"
    public static let dropped = "dropped"
    public static let downgraded = "downgraded"
    public static let tokenRetired = "tokenRetired"
    /// An APNs answer other than 200: its reason, or its status when it gave none (`status:0`: no answer).
    public static func reason(_ reason: String?, status: Int) -> String { reason.map { "reason:" + $0 } ?? "status:\(status)" }
    /// Upper bounds of the APNs latency buckets, in milliseconds (the last bucket is open).
    public static let latencyBounds: [Double] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
    /// Upper bounds of the time-in-queue buckets, in seconds.
    public static let queueBounds: [Double] = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600]

    public static func latency(_ ms: Double) -> String { "latency:\(bucket(ms, latencyBounds))" }
    public static func queue(_ seconds: Double) -> String { "queue:\(bucket(seconds, queueBounds))" }

    static func bucket(_ v: Double, _ bounds: [Double]) -> Int { bounds.firstIndex { v <= $0 } ?? bounds.count }

    /// The `q` quantile of a histogram (`counts[i]` in bucket i), as the bucket's upper bound;
    /// nil when empty; the open last bucket answers its lower bound.
    public static func quantile(_ q: Double, counts: [Int64], bounds: [Double]) -> Double? {
        let total = counts.reduce(0, +)
        guard total > 0 else { return nil }
        let rank = max(1, Int64((Double(total) * q).rounded(.up)))
        var seen: Int64 = 0
        for (i, c) in counts.enumerated() {
            seen += c
            if seen >= rank { return i < bounds.count ? bounds[i] : bounds.last }
        }
        return bounds.last
    }
}

/// An idempotent write's record, whose answer is made from what the write produced (the stored
/// record), inside the write's transaction: the work and its answer commit together or not at all.
public struct IdempotentAnswer<Record>: Sendable {
    public var pending: IdempotencyRecord
    public var answer: @Sendable (Record) -> (status: Int, body: String)
    public init(_ pending: IdempotencyRecord, answer: @escaping @Sendable (Record) -> (status: Int, body: String)) {
        self.pending = pending
        self.answer = answer
    }
    /// The record to store for `record`.
    public func record(for record: Record) -> IdempotencyRecord {
        var r = pending
        (r.status, r.body) = answer(record)
        return r
    }
}

/// How long finished work is kept before the engine's sweep prunes it.
public struct Retention: Sendable, Hashable {
    /// Sent, failed, superseded and dropped jobs.
    public var finishedJobs: TimeInterval = 7 * 86_400
    /// The delivery history (every APNs answer).
    public var deliveries: TimeInterval = 30 * 86_400
    /// Priority-10 sends older than this no longer count against any budget.
    public var highPrioritySends: TimeInterval = 2 * 3600
    /// Ended, dismissed and unreachable activities (with their topics), after they ended.
    public var endedActivities: TimeInterval = 30 * 86_400
    /// Installations that reported nothing for this long and hold no live activity.
    public var staleInstallations: TimeInterval = 180 * 86_400
    /// Live activities nothing was ever pushed to, this long after they started. A Live Activity
    /// lives at most 12 hours on the phone (8 active, 4 more on the Lock Screen), so one past that
    /// which never received a push and was never reported ended was never useful: it is deleted,
    /// not kept as ended (docs/security.md, "Retention").
    public var unusedActivities: TimeInterval = 86_400
    /// Installations with no user bound and no activity, that reported nothing for this long (the
    /// app reports at every launch and daily): registrations that never became useful.
    public var unusedInstallations: TimeInterval = 7 * 86_400
    /// Events (docs/events.md): a webhook that stays down longer misses the oldest. The newest
    /// event is kept whatever its age, so the stream's numbers never start again.
    public var events: TimeInterval = 7 * 86_400
    /// The console's per-minute history (its longest chart is 7 days).
    public var history: TimeInterval = 8 * 86_400
    public init() {}
}

public struct StoreError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case conflict, notFound, unavailable
        /// The database refused this server's credentials or has no such database: retrying will
        /// not help (a wrong password, an unknown user or database).
        case refused
        /// Another request with the same `Idempotency-Key` committed first: this one changed nothing.
        case idempotencyKeyTaken
    }
    public var code: Code
    public var message: String
    /// The store has said so in the log already (PostgreSQL away: one line when it goes, one when
    /// it is back), so a caller that answers 503 need not log each request again.
    public var alreadyLogged: Bool
    public init(_ code: Code, _ message: String, alreadyLogged: Bool = false) {
        self.code = code
        self.message = message
        self.alreadyLogged = alreadyLogged
    }
    public var description: String { message }
}

extension AppRecord {
    /// The `schemas` column of app `bundleID`, or a ``BadRow`` naming what does not decode.
    public static func storedSchemas(_ text: String, bundleID: String) throws -> [ActivitySchema] {
        guard case .array(let a) = try BadRow.json(text, table: "apps", id: bundleID, column: "schemas") else {
            throw BadRow(table: "apps", id: bundleID, column: "schemas", found: "JSON that is not an array")
        }
        return try a.map { v in
            do { return try ActivitySchema(json: v) } catch { throw BadRow(table: "apps", id: bundleID, column: "schemas", found: "a schema that does not decode (\(error))") }
        }
    }
}


extension TicketKey {
    /// The keys as stored: a JSON array of `{"id", "publicKey", "createdAt"}`.
    public static func encode(_ keys: [TicketKey]) -> String {
        JSONValue.array(keys.map { ["id": .string($0.id), "publicKey": .string($0.publicKeyPEM), "createdAt": .double($0.createdAt.timeIntervalSince1970)] }).jsonString
    }

    /// The `ticket_keys` column of app `bundleID`; a value no version of Isle writes is a
    /// ``BadRow``, never an empty list (which would refuse every ticket without saying why).
    public static func decode(_ text: String?, bundleID: String) throws -> [TicketKey] {
        guard let text else { return [] }
        guard case .array(let a) = try BadRow.json(text, table: "apps", id: bundleID, column: "ticket_keys") else {
            throw BadRow(table: "apps", id: bundleID, column: "ticket_keys", found: "JSON that is not an array")
        }
        return try a.map { v in
            guard let id = v["id"]?.stringValue, let pem = v["publicKey"]?.stringValue, let created = v["createdAt"]?.numberValue?.doubleValue else {
                throw BadRow(table: "apps", id: bundleID, column: "ticket_keys", found: "a key without id, publicKey or createdAt")
            }
            return TicketKey(id: id, publicKeyPEM: pem, createdAt: Date(timeIntervalSince1970: created))
        }
    }
}

extension EnvironmentKey {
    public static func encode(_ keys: [EnvironmentKey]) -> String {
        JSONValue.array(keys.map {
            ["environment": .string($0.environment.rawValue), "keyID": .string($0.keyID), "teamID": .string($0.teamID), "key": .string($0.keyPEM),
             "createdAt": .double($0.createdAt.timeIntervalSince1970)]
        }).jsonString
    }

    /// The `environment_keys` column of app `bundleID`; a value no version of Isle writes is a ``BadRow``.
    public static func decode(_ text: String?, bundleID: String) throws -> [EnvironmentKey] {
        guard let text else { return [] }
        guard case .array(let a) = try BadRow.json(text, table: "apps", id: bundleID, column: "environment_keys") else {
            throw BadRow(table: "apps", id: bundleID, column: "environment_keys", found: "JSON that is not an array")
        }
        return try a.map { v in
            guard let env = v["environment"]?.stringValue.flatMap(PushEnvironment.init(rawValue:)), let keyID = v["keyID"]?.stringValue, let teamID = v["teamID"]?.stringValue,
                  let pem = v["key"]?.stringValue, let created = v["createdAt"]?.numberValue?.doubleValue else {
                throw BadRow(table: "apps", id: bundleID, column: "environment_keys", found: "a key without environment, keyID, teamID, key or createdAt")
            }
            return EnvironmentKey(environment: env, keyID: keyID, teamID: teamID, keyPEM: pem, createdAt: Date(timeIntervalSince1970: created))
        }
    }
}

/// A page of an app's activities (``ActivityRepository/findActivities(_:)``): each filter nil or
/// empty means any; newest first by `startedAt`, then id.
public struct ActivityQuery: Sendable, Hashable {
    /// Where the previous page ended: its last activity.
    public struct Cursor: Sendable, Hashable {
        public var startedAt: Date
        public var id: String
        public init(startedAt: Date, id: String) {
            self.startedAt = startedAt
            self.id = id
        }
    }

    public var bundleID: String
    /// The external key starts with this (a character, never a wildcard).
    public var keyPrefix: String?
    public var installationID: String?
    /// On an installation bound to this user.
    public var userID: String?
    /// In one of these states.
    public var states: [ActivityRecordState]
    /// Following this topic.
    public var topic: String?
    /// Only activities after this one in the order (older, or as old with a smaller id).
    public var after: Cursor?
    public var limit: Int

    public init(bundleID: String, keyPrefix: String? = nil, installationID: String? = nil, userID: String? = nil, states: [ActivityRecordState] = [],
                topic: String? = nil, after: Cursor? = nil, limit: Int) {
        self.bundleID = bundleID
        self.keyPrefix = keyPrefix
        self.installationID = installationID
        self.userID = userID
        self.states = states
        self.topic = topic
        self.after = after
        self.limit = limit
    }
}
