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
    /// APNs refused a push with an answer Isle retries (a `BadDeviceToken` it keeps, a 429, a
    /// 5xx): told once per push, at the first such answer, with the answer and the next try. The
    /// push ends later in `push.delivered` or `push.failed`.
    case pushRetrying = "push.retrying"
    /// A push to a push-started activity has waited 10 minutes for the phone to hand over the
    /// activity's update token: ActivityKit may have refused the start (APNs accepted it), or
    /// the phone is offline. Told once per push, with why and until when it waits; the push ends
    /// later in `push.delivered` (the token came) or `push.failed` (its deadline passed).
    case pushWaiting = "push.waiting"
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
    /// A webhook stopped receiving events: it kept failing for too long (`source` `failures`),
    /// or the backend or an operator disabled it (`api`, `console`).
    case webhookDisabled = "webhook.disabled"
}

/// An event about to be written, with the fact it tells.
public struct NewEvent: Sendable, Hashable {
    public var bundleID: String
    public var type: EventType
    public var activityID: String?
    /// The backend's own names for what the event is about, as they were when it happened: the
    /// activity's `externalKey` (the order, the match), its installation and that installation's
    /// user. A backend acts on an event without looking the activity up.
    public var externalKey: String?
    public var installationID: String?
    public var userID: String?
    /// The event's fields beyond its type, subject and time (a JSON object).
    public var data: JSONObject
    public var at: Date

    public init(bundleID: String, type: EventType, activityID: String? = nil, externalKey: String? = nil, installationID: String? = nil, userID: String? = nil,
                data: JSONObject = [:], at: Date) {
        self.bundleID = bundleID
        self.type = type
        self.activityID = activityID
        self.externalKey = externalKey
        self.installationID = installationID
        self.userID = userID
        self.data = data
        self.at = at
    }

    /// The installation whose user the event should name, when it names an installation but no
    /// user yet.
    public var installationForUser: InstallationKey? {
        guard userID == nil, let installationID else { return nil }
        return InstallationKey(bundleID: bundleID, id: installationID)
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
}

/// Where the events of a completion and of an activity's change come from: pure functions every
/// store calls in the transaction that writes the fact.
public enum Events {
    /// What a completion tells, given what it writes (``JobCompletion/writes(currentToken:)``):
    /// a push delivered or failed for good, a token retired, and the completion's own events
    /// (the app's circuit: paused, resumed).
    ///
    /// Each event about an activity names it as the backend knows it: its `externalKey` and
    /// installation as the claim read them (the installation's user is filled in by the procedure,
    /// in the same transaction). `attempts` counts the requests APNs received for the push; a
    /// failed push carries APNs' last answer even when the attempt that gave up sent nothing (a
    /// token retired by an earlier answer), and its time is when it failed, not when it was accepted.
    public static func of(_ c: JobCompletion, _ w: JobCompletion.Writes) -> [NewEvent] {
        let job = c.claim.job
        let at = c.delivery?.at ?? c.at ?? job.runAt
        let answered = w.delivery.flatMap(APNsAnswer.init(delivery:))
        let answer = answered ?? job.lastAnswer
        let requests = job.apnsRequests + (answered == nil ? 0 : 1)
        var base: JSONObject = ["jobID": .int(job.id), "kind": .string(job.kind.rawValue), "attempts": .int(Int64(requests))]
        if let ch = job.channelID { base["channelID"] = .string(ch) }
        let activity = c.claim.activity.flatMap { $0.id == job.activityID ? $0 : nil }
        let installationID = job.installationID ?? activity?.installationID
        func event(_ type: EventType, _ data: JSONObject, activityID: String? = job.activityID, installation: String? = installationID) -> NewEvent {
            NewEvent(bundleID: job.bundleID, type: type, activityID: activityID, externalKey: activityID == nil ? nil : activity?.externalKey,
                     installationID: installation, data: data, at: at)
        }
        var events: [NewEvent] = []
        if case .finish(let state, let reason) = w.job {
            switch state {
            case .sent:
                var d = base
                if let delivery = w.delivery {
                    if let id = delivery.apnsID { d["apnsID"] = .string(id.text) }
                    if let u = delivery.apnsUniqueID { d["apnsUniqueID"] = .string(u) }
                    d["priority"] = .int(Int64(delivery.priority.rawValue))
                    if delivery.downgraded { d["downgraded"] = .bool(true) }
                }
                events.append(event(.pushDelivered, d))
            case .failed:
                var d = base
                d["reason"] = .string(reason ?? "failed")
                if let answer {
                    d["status"] = .int(Int64(answer.status))
                    if let r = answer.reason { d["apnsReason"] = .string(r) }
                }
                events.append(event(.pushFailed, d))
            default: break
            }
        }
        // The first answer Isle retries (never silently): APNs refused the push and it goes back
        // to its lane — not a dead token's wait for a rotated one (that is token.retired).
        if case .requeue(let retryAt, let reason) = w.job, let d = w.delivery, d.status >= 400, job.apnsRequests == 0, w.activity?.unreachable == nil {
            var data = base
            data["reason"] = .string(reason)
            data["status"] = .int(Int64(d.status))
            if let r = d.reason { data["apnsReason"] = .string(r) }
            data["retryAt"] = .int(Int64(retryAt.timeIntervalSince1970.rounded(.up)))
            events.append(event(.pushRetrying, data))
        }
        // A push-started activity the phone has not confirmed: told once, when the wait's reason
        // first says so.
        if case .requeue(let until, let reason) = w.job, w.delivery == nil, reason.hasPrefix(DeliveryPlanner.unconfirmedStartReason),
           job.lastError?.hasPrefix(DeliveryPlanner.unconfirmedStartReason) != true {
            var data = base
            data["reason"] = .string(reason)
            data["nextLookAt"] = .int(Int64(until.timeIntervalSince1970.rounded(.up)))
            events.append(event(.pushWaiting, data))
        }
        // A token APNs answered for (a 4xx with a delivery), not a plan's refusal; a start job's
        // dead token is its installation's push-to-start token (below).
        let answeredDead = (w.delivery.map { (400..<500).contains($0.status) } ?? false)
        if let u = w.activity?.unreachable, answeredDead, job.kind != .start, let activityID = job.activityID {
            var d: JSONObject = ["token": .string("update"), "reason": .string(u.reason)]
            if let r = w.delivery?.reason { d["apnsReason"] = .string(r) }
            events.append(event(.tokenRetired, d, activityID: activityID))
        }
        if let p = w.installation, answeredDead {
            if let (type, _) = p.deadPushToStartToken {
                events.append(event(.tokenRetired, [
                    "token": .string("pushToStart"), "attributesType": .string(type), "installationID": .string(p.installationID),
                    "apnsReason": w.delivery?.reason.map(JSONValue.string) ?? .null,
                ], activityID: nil, installation: p.installationID))
            }
            if p.deadWidgetToken != nil {
                events.append(event(.tokenRetired, [
                    "token": .string("widget"), "installationID": .string(p.installationID),
                    "apnsReason": w.delivery?.reason.map(JSONValue.string) ?? .null,
                ], activityID: nil, installation: p.installationID))
            }
            if p.deadControlsToken != nil {
                events.append(event(.tokenRetired, [
                    "token": .string("controls"), "installationID": .string(p.installationID),
                    "apnsReason": w.delivery?.reason.map(JSONValue.string) ?? .null,
                ], activityID: nil, installation: p.installationID))
            }
        }
        return events + c.events
    }

    /// Who changed an activity, for the events of the change (``activityChanged(from:to:by:)``).
    public struct Source: Sendable, Hashable {
        /// `device` (the app's report), `installationDeleted`, …: the event's `source` field.
        public var name: String
        public var at: Date
        /// The user to name when the change's own read cannot: an installation being deleted is
        /// unbound from its user before its activities end.
        public var userID: String?
        public init(_ name: String, at: Date, userID: String? = nil) {
            self.name = name
            self.at = at
            self.userID = userID
        }
    }

    /// What an activity's change tells: ended, dismissed, or a rotated token (never the token
    /// itself: the backend has no use for it and it is a secret of the device).
    /// `userID`: the user of the activity's installation now, read in the change's transaction.
    public static func activityChanged(from old: ActivityRecord, to new: ActivityRecord, by source: Source, userID: String?) -> [NewEvent] {
        var events: [NewEvent] = []
        let d: JSONObject = ["source": .string(source.name)]
        func event(_ type: EventType, at: Date) -> NewEvent {
            NewEvent(bundleID: new.bundleID, type: type, activityID: new.id, externalKey: new.externalKey, installationID: new.installationID, userID: userID, data: d, at: at)
        }
        if new.updateToken != old.updateToken, new.updateToken != nil {
            events.append(event(.activityTokenRotated, at: source.at))
        }
        if new.state != old.state {
            switch new.state {
            case .ended: events.append(event(.activityEnded, at: new.endedAt ?? source.at))
            case .dismissed: events.append(event(.activityDismissed, at: new.dismissedAt ?? source.at))
            default: break
            }
        }
        return events
    }
}

