public import Foundation
import IsleCore

/// Every change of an activity's record after it is registered, as one pure function: what the
/// device reports (a rotated token, a dismissal, an end), what a push did (new content, an end,
/// the 8-hour limit), what APNs said of its token (unreachable), and a push-started activity
/// receiving its update token. Controllers and stores apply these events and nothing else changes
/// an activity's state; the SQL stores write the same rules set-based (``pushChangesStates``), and
/// the store contract suite checks them against this function on random event sequences.
///
/// The states follow ActivityKit's `ActivityState` (docs/protocol.md §5): pushes change an
/// activity only while it is live (`starting` or `active`); an ended or dismissed activity never
/// comes back; a dead token (`unreachable`) is revived by a new token from the device.
public enum ActivityLifecycle {
    public enum Event: Sendable, Hashable {
        /// The device handed over a new update token (`PUT /v1/activities/{id}/token`).
        case tokenRotated(String)
        /// The device reports the person dismissed the activity, at this time.
        case dismissed(at: Date)
        /// The device reports the app ended the activity, at this time.
        case endedByApp(at: Date)
        /// A push to the activity was delivered (or the planner applied a rule of the system,
        /// such as the 8-hour life): what it changes.
        case pushed(ActivityPatch)
        /// A push-started activity's update token arrived from the device, with its topics.
        case startLinked(token: String, topics: [String])
    }

    /// An event the activity's state does not allow, with the API's error code.
    public struct Refusal: Error, Sendable, Hashable, CustomStringConvertible {
        public var code: String
        public var message: String
        public var description: String { message }
    }

    /// The states in which a push changes the record (what ``ActivityRecordState/acceptsPushes``
    /// says), for the stores' set-based writes.
    public static let pushChangesStates: [ActivityRecordState] = ActivityRecordState.allCases.filter(\.acceptsPushes)

    /// The record as the phone has it at `now`: a live activity past its 8-hour life has been
    /// ended by the system (docs/protocol.md §10.4), whether or not a push has told the record
    /// yet — a push-started one whose app never handed over its token, say. What the API shows.
    public static func asOf(_ a: ActivityRecord, now: Date) -> ActivityRecord {
        let end = a.startedAt.addingTimeInterval(DeliveryPlanner.activityLifetime)
        guard a.state.acceptsPushes, now >= end else { return a }
        var shown = a
        shown.state = .ended
        shown.endedAt = end
        shown.stateReason = "the system ends a Live Activity after 8 hours"
        return shown
    }

    /// Applies `event` to `a`. Events the device may repeat (a report, a push that arrives after
    /// the end) change nothing rather than fail; only a token for a finished activity is refused.
    public static func apply(_ event: Event, to a: inout ActivityRecord) throws(Refusal) {
        switch event {
        case .tokenRotated(let token):
            // A token rotated on the device may reach us after APNs answered 410 for the old one:
            // a new token brings an unreachable activity back.
            guard a.state.acceptsPushes || a.state == .unreachable else {
                throw Refusal(code: "activityEnded", message: "the activity is \(a.state.rawValue); its token is no longer used")
            }
            a.updateToken = token
            if a.state == .starting || a.state == .unreachable {
                a.state = .active
                a.stateReason = nil
            }
        case .dismissed(let at):
            if a.endedAt == nil { a.endedAt = at }
            a.state = .dismissed
            a.dismissedAt = at
            a.stateReason = "the person dismissed it"
        case .endedByApp(let at):
            if a.endedAt == nil { a.endedAt = at }
            if a.state.acceptsPushes {
                a.state = .ended
                a.stateReason = "the app ended it"
            }
        case .pushed(let p):
            guard a.state.acceptsPushes else { return }
            if let content = p.content { a.content = content }
            if let score = p.relevanceScore { a.relevanceScore = score }
            if p.setsStaleDate { a.staleDate = p.staleDate }
            if let e = p.end {
                a.state = .ended
                if a.endedAt == nil { a.endedAt = e.at }
                if let d = e.dismissAt { a.dismissedAt = d }
                if let r = e.reason { a.stateReason = r }
            } else if let u = p.unreachable, u.ifToken == nil || a.updateToken == u.ifToken {
                a.state = .unreachable
                a.stateReason = u.reason
            }
        case .startLinked(let token, let topics):
            guard a.state == .starting else {
                throw Refusal(code: "activityNotStarting", message: "the activity is \(a.state.rawValue), not waiting for its first token")
            }
            a.updateToken = token
            a.state = .active
            a.topics = Array(Set(a.topics + topics)).sorted()
        }
    }
}
