public import Foundation
public import IsleCore

/// What happened to an app's pushes and activities, told to its backend (docs/events.md): by
/// signed webhooks and by `GET /v1/events`. An event is written in the same transaction as the
/// fact it tells (a completion, a device's report), so a committed fact always has its event and a
/// crash loses neither; the stores number events in commit order, so a reader that follows the
/// numbers never skips one and sees an activity's events in the order they happened.
public enum EventType: String, Sendable, Hashable, CaseIterable, Codable {
    /// APNs accepted a push (200), with its apns-id.
    case pushDelivered = "push.delivered"
    /// A push failed for good (APNs refused it, or its attempts or time ran out), with why.
    case pushFailed = "push.failed"
    /// APNs said a token is dead (410 `Unregistered`, or `BadDeviceToken` for a token of a confirmed
    /// environment): an activity's update token, or an installation's push-to-start or widget token.
    case tokenRetired = "token.retired"
    /// The device reported that the app ended the activity.
    case activityEnded = "activity.ended"
    /// The device reported that the person dismissed the activity.
    case activityDismissed = "activity.dismissed"
    /// The device handed over a new update token for the activity.
    case activityTokenRotated = "activity.token_rotated"
    /// Isle stopped sending for the app: APNs refused its configuration (`cause`
    /// `configuration`), or keeps failing (`apnsUnavailable`); it probes again at `probeAt`.
    case appPaused = "app.paused"
    /// Isle sends for the app again.
    case appResumed = "app.resumed"
}

/// An event about to be written, with the fact it tells.
public struct NewEvent: Sendable, Hashable {
    public var bundleID: String
    public var type: EventType
    public var activityID: String?
    /// The event's fields beyond its type, activity and time (a JSON object).
    public var data: JSONObject
    public var at: Date

    public init(bundleID: String, type: EventType, activityID: String? = nil, data: JSONObject = [:], at: Date) {
        self.bundleID = bundleID
        self.type = type
        self.activityID = activityID
        self.data = data
        self.at = at
    }
}

/// An event as stored: `seq` is its place in the stream (commit order), its id is `evt_<seq>`.
public struct StoredEvent: Sendable, Hashable {
    public var seq: Int64
    public var event: NewEvent
    public init(seq: Int64, event: NewEvent) {
        self.seq = seq
        self.event = event
    }

    /// The id a backend de-duplicates by: the same for every delivery of the event.
    public var id: String { "evt_\(seq)" }

    /// The event as webhooks and `GET /v1/events` carry it (docs/events.md).
    public var json: JSONValue {
        var o: JSONObject = ["id": .string(id), "type": .string(event.type.rawValue), "app": .string(event.bundleID)]
        if let a = event.activityID { o["activityId"] = .string(a) }
        o["at"] = .int(Int64(event.at.timeIntervalSince1970.rounded(.down)))
        o["data"] = .object(event.data)
        return .object(o)
    }
}

/// Where the events of a completion and of an activity's change come from: pure functions every
/// store calls in the transaction that writes the fact.
public enum Events {
    /// What a completion tells, given what it writes (``JobCompletion/writes(currentToken:)``):
    /// a push delivered or failed for good, a token retired, and the completion's own events
    /// (the app's circuit: paused, resumed).
    public static func of(_ c: JobCompletion, _ w: JobCompletion.Writes) -> [NewEvent] {
        let job = c.claim.job
        let at = c.delivery?.at ?? c.claim.job.runAt
        var base: JSONObject = ["jobId": .int(job.id), "kind": .string(job.kind.rawValue), "attempts": .int(Int64(job.attempts))]
        if let ch = job.channelID { base["channelId"] = .string(ch) }
        if let i = job.installationID { base["installationId"] = .string(i) }
        var events: [NewEvent] = []
        if case .finish(let state, let reason) = w.job {
            switch state {
            case .sent:
                var d = base
                if let delivery = w.delivery {
                    if let id = delivery.apnsID { d["apnsId"] = .string(id) }
                    if let u = delivery.apnsUniqueID { d["apnsUniqueId"] = .string(u) }
                    d["priority"] = .int(Int64(delivery.priority.rawValue))
                    if delivery.downgraded { d["downgraded"] = .bool(true) }
                }
                events.append(NewEvent(bundleID: job.bundleID, type: .pushDelivered, activityID: job.activityID, data: d, at: at))
            case .failed:
                var d = base
                d["reason"] = .string(reason ?? "failed")
                if let delivery = w.delivery {
                    d["status"] = .int(Int64(delivery.status))
                    if let r = delivery.reason { d["apnsReason"] = .string(r) }
                }
                events.append(NewEvent(bundleID: job.bundleID, type: .pushFailed, activityID: job.activityID, data: d, at: at))
            default: break
            }
        }
        // A token APNs answered for (a 4xx with a delivery), not a plan's refusal; a start job's
        // dead token is its installation's push-to-start token (below).
        let answeredDead = (w.delivery.map { (400..<500).contains($0.status) } ?? false)
        if let u = w.activity?.unreachable, answeredDead, job.kind != .start, let activityID = job.activityID {
            var d: JSONObject = ["token": .string("update"), "reason": .string(u.reason)]
            if let r = w.delivery?.reason { d["apnsReason"] = .string(r) }
            events.append(NewEvent(bundleID: job.bundleID, type: .tokenRetired, activityID: activityID, data: d, at: at))
        }
        if let p = w.installation, answeredDead {
            if let (type, _) = p.deadPushToStartToken {
                events.append(NewEvent(bundleID: p.bundleID, type: .tokenRetired, data: [
                    "token": .string("pushToStart"), "attributesType": .string(type), "installationId": .string(p.installationID),
                    "apnsReason": w.delivery?.reason.map(JSONValue.string) ?? .null,
                ], at: at))
            }
            if p.deadWidgetToken != nil {
                events.append(NewEvent(bundleID: p.bundleID, type: .tokenRetired, data: [
                    "token": .string("widget"), "installationId": .string(p.installationID),
                    "apnsReason": w.delivery?.reason.map(JSONValue.string) ?? .null,
                ], at: at))
            }
        }
        return events + c.events
    }

    /// Who changed an activity, for the events of the change (``activityChanged(from:to:by:)``).
    public struct Source: Sendable, Hashable {
        /// `device` (the app's report), `installationDeleted`, …: the event's `source` field.
        public var name: String
        public var at: Date
        public init(_ name: String, at: Date) {
            self.name = name
            self.at = at
        }
    }

    /// What an activity's change tells: ended, dismissed, or a rotated token (never the token
    /// itself: the backend has no use for it and it is a secret of the device).
    public static func activityChanged(from old: ActivityRecord, to new: ActivityRecord, by source: Source) -> [NewEvent] {
        var events: [NewEvent] = []
        let d: JSONObject = ["source": .string(source.name)]
        if new.updateToken != old.updateToken, new.updateToken != nil {
            events.append(NewEvent(bundleID: new.bundleID, type: .activityTokenRotated, activityID: new.id, data: d, at: source.at))
        }
        if new.state != old.state {
            switch new.state {
            case .ended: events.append(NewEvent(bundleID: new.bundleID, type: .activityEnded, activityID: new.id, data: d, at: new.endedAt ?? source.at))
            case .dismissed: events.append(NewEvent(bundleID: new.bundleID, type: .activityDismissed, activityID: new.id, data: d, at: new.dismissedAt ?? source.at))
            default: break
            }
        }
        return events
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
