import IsleCore
public import Foundation

/// Ordering and coalescing, as pure rules every store applies the same way.
///
/// Jobs of one *lane* — an activity's pushes, or a broadcast channel's — go out one at a time, in
/// the order they took their place (`seq`): a job is sent only when every earlier job of its lane
/// is finished (sent, superseded, dropped, or failed for good). The first unfinished job of a lane
/// is its *head*; only a head is ever claimed, so a head waiting for a retry holds its lane back —
/// and only its lane. Coalescing: a plain update (no alert) that was not sent yet is superseded by a
/// later job of its lane that carries content; alerts are never dropped; an end without
/// `content-state` carries no content and supersedes nothing. (docs/server.md, "Delivery semantics")
public enum LanePlanner {
    /// The lane a job belongs to: `a:<activity>` or `c:<channel>`; nil = no ordering (widgets).
    public static func lane(kind: PushJobKind, activityID: String?, channelID: String?) -> String? {
        if let activityID { return "a:" + activityID }
        if kind == .broadcast, let channelID { return "c:" + channelID }
        return nil
    }

    /// Scheduled jobs that came due, moved into their lanes per claim (every store, one number):
    /// a large scheduled fan-out comes due over a few claims instead of one long transaction.
    public static let promotionBatch = 5_000

    /// An update without an alert: a later job with content makes it pointless.
    public static func isSupersedable(kind: PushJobKind, payload: JobPayload) -> Bool {
        guard case .liveActivity(let p) = payload, p.alert == nil else { return false }
        switch kind {
        case .update: return true
        case .broadcast: return p.event == .update
        case .start, .end, .widgets, .controls: return false
        }
    }

    /// The job sets the activity's content when it arrives: an update, or an end with `content-state`.
    public static func carriesContent(kind: PushJobKind, payload: JobPayload) -> Bool {
        switch kind {
        case .update: return true
        case .end, .broadcast: return payload.liveActivity?.contentState != nil
        case .start, .widgets, .controls: return false
        }
    }

    /// A lane's first unfinished job, as a store reads it.
    public struct Head: Sendable, Hashable {
        public var id: Int64
        /// Already flagged as the lane's head.
        public var isHead: Bool
        public var claimed: Bool
        public var supersedable: Bool
        public init(id: Int64, isHead: Bool, claimed: Bool, supersedable: Bool) {
            self.id = id
            self.isHead = isHead
            self.claimed = claimed
            self.supersedable = supersedable
        }
    }

    /// Where a job goes as it joins the queue: when it is accepted, and when a scheduled job
    /// comes due. Every store writes exactly this.
    public struct Placement: Sendable, Hashable {
        public var lane: String?
        /// Waiting outside its lane until its time (`scheduled`), or in it (`queued`).
        public var scheduled: Bool
        /// The lane's first unfinished job, or a job without a lane: claimable once due.
        public var isHead: Bool
        public var supersedable: Bool
        public var carriesContent: Bool
        /// The lane's head is a plain update not yet sent that this job makes pointless: the
        /// store lets ``decide(_:)`` run over the lane now rather than at the next claim.
        public var coalescesLane: Bool
    }

    /// Places a job due at `runAt`, at `now`, behind `head` (its lane's first unfinished job,
    /// which the store reads only when the job is due and has a lane; nil for an empty lane).
    public static func place(kind: PushJobKind, activityID: String?, channelID: String?, payload: JobPayload, runAt: Date, now: Date,
                             head: (String) throws -> Head?) rethrows -> Placement {
        let lane = lane(kind: kind, activityID: activityID, channelID: channelID)
        let scheduled = runAt > now
        let carries = carriesContent(kind: kind, payload: payload)
        var joined = Joining(isHead: false, coalescesLane: false)
        if !scheduled { joined = try join(lane: lane, carriesContent: carries, head: head) }
        return Placement(lane: lane, scheduled: scheduled, isHead: joined.isHead, supersedable: isSupersedable(kind: kind, payload: payload),
                         carriesContent: carries, coalescesLane: joined.coalescesLane)
    }

    /// A due job entering its lane (at acceptance, or a scheduled one at promotion).
    public struct Joining: Sendable, Hashable {
        public var isHead: Bool
        public var coalescesLane: Bool
    }

    /// A due job with `lane` enters it behind the lane's first unfinished job (read by `head`):
    /// it is the head if there is none (or it has no lane), and it makes the lane coalesce now if
    /// it carries content and that head is an unsent plain update.
    public static func join(lane: String?, carriesContent: Bool, head: (String) throws -> Head?) rethrows -> Joining {
        guard let lane, let current = try head(lane) else { return Joining(isHead: true, coalescesLane: false) }
        return Joining(isHead: false, coalescesLane: carriesContent && !current.claimed && current.supersedable)
    }

    /// ``place(kind:activityID:channelID:payload:runAt:now:head:)`` for a new job.
    public static func place(_ job: NewPushJob, now: Date, head: (String) throws -> Head?) rethrows -> Placement {
        try place(kind: job.kind, activityID: job.activityID, channelID: job.channelID, payload: job.payload, runAt: job.runAt, now: now, head: head)
    }

    /// One unfinished job of a lane, as the planner needs to see it.
    public struct Entry: Sendable, Hashable {
        public var id: Int64
        public var supersedable: Bool
        public var carriesContent: Bool
        /// Its time has come (not waiting for a retry).
        public var due: Bool
        public var claimed: Bool
        public init(id: Int64, supersedable: Bool, carriesContent: Bool, due: Bool, claimed: Bool = false) {
            self.id = id
            self.supersedable = supersedable
            self.carriesContent = carriesContent
            self.due = due
            self.claimed = claimed
        }
    }

    public struct Decision: Sendable, Hashable {
        /// Jobs to mark superseded, oldest first.
        public var superseded: [Int64] = []
        /// The job to hand to a worker now, if any (the lane's head once `superseded` are gone).
        public var claim: Int64?
    }

    /// Decides over a lane's unfinished jobs, in lane order (the first is the head).
    ///
    /// The newest due job that carries content and stands behind nothing but unsent plain updates
    /// replaces them all: they are superseded and it is claimed. Otherwise the head is claimed if
    /// it is due, and the lane waits if it is not (a retry later, or a job already in flight).
    public static func decide(_ lane: [Entry]) -> Decision {
        guard let head = lane.first, !head.claimed else { return Decision() }
        // Entries 0..<plain are unsent plain updates; `plain` is the first that is not.
        let plain = lane.firstIndex { !$0.supersedable || $0.claimed } ?? lane.count
        var target: Int?
        for i in stride(from: min(plain, lane.count - 1), through: 1, by: -1) where lane[i].due && lane[i].carriesContent && !lane[i].claimed {
            target = i
            break
        }
        if let t = target { return Decision(superseded: lane[0..<t].map(\.id), claim: lane[t].id) }
        return Decision(superseded: [], claim: head.due ? head.id : nil)
    }
}
