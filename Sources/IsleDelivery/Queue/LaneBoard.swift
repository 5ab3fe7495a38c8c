public import Foundation

/// The lanes a step of the queue's procedure touches, held in memory while it decides: the open
/// jobs read from the store (their first ``QueueProcedure/window``), and the jobs the step adds
/// (new ones at enqueue, scheduled ones at promotion). Joining, coalescing and removing a job
/// follow ``LanePlanner``; what changed for the stored jobs — superseded, new heads — and the fate
/// of each added job are then written in one batch.
public struct LaneBoard: Sendable {
    /// A job on the board: stored, or the `n`th job the step adds.
    public enum Ref: Sendable, Hashable {
        case stored(Int64)
        case added(Int)
    }

    struct Slot: Sendable {
        var ref: Ref
        var job: LaneJob
    }

    private var lanes: [String: [Slot]]
    /// Stored jobs superseded, in the order decided.
    public private(set) var supersededStored: [Int64] = []
    public private(set) var supersededAdded: Set<Int> = []
    /// Stored jobs that become their lane's head (they were not flagged).
    public private(set) var newHeadsStored: [Int64] = []
    public private(set) var headsAdded: Set<Int> = []

    public init(windows: [String: [LaneJob]]) {
        lanes = windows.mapValues { $0.map { Slot(ref: .stored($0.id), job: $0) } }
    }

    /// A due job enters the end of its lane (a job without a lane is claimable at once): the head
    /// if its lane is empty; a job carrying content behind an unsent plain update makes the lane
    /// coalesce now rather than at the next claim.
    public mutating func join(_ ref: Ref, lane: String?, supersedable: Bool, carriesContent: Bool, runAt: Date, now: Date) {
        let joining = LanePlanner.join(lane: lane, carriesContent: carriesContent) { l in
            lanes[l]?.first.map { LanePlanner.Head(id: 0, isHead: $0.job.isHead, claimed: $0.job.claimed, supersedable: $0.job.supersedable) }
        }
        guard let lane else {
            markHead(ref)
            return
        }
        lanes[lane, default: []].append(Slot(ref: ref, job: LaneJob(id: 0, isHead: false, claimed: false, supersedable: supersedable, carriesContent: carriesContent, runAt: runAt)))
        if joining.isHead { setHead(lane) }
        if joining.coalescesLane { coalesce(lane, now: now) }
    }

    /// ``LanePlanner/decide(_:)`` over the lane's first ``QueueProcedure/window`` jobs: what it
    /// supersedes leaves the lane, the first job left becomes the head; answers the job to hand
    /// out now (nil: none).
    @discardableResult
    public mutating func coalesce(_ lane: String, now: Date) -> Ref? {
        let slots = lanes[lane] ?? []
        let window = slots.prefix(QueueProcedure.window)
        let entries = window.enumerated().map { i, s in
            LanePlanner.Entry(id: Int64(i), supersedable: s.job.supersedable, carriesContent: s.job.carriesContent, due: s.job.runAt <= now, claimed: s.job.claimed)
        }
        let decision = LanePlanner.decide(entries)
        let claim = decision.claim.map { slots[Int($0)].ref }
        guard !decision.superseded.isEmpty else { return claim }
        let gone = Set(decision.superseded.map(Int.init))
        for i in gone.sorted() {
            switch slots[i].ref {
            case .stored(let id): supersededStored.append(id)
            case .added(let n): supersededAdded.insert(n)
            }
            unmarkHead(slots[i].ref)
        }
        lanes[lane] = slots.enumerated().filter { !gone.contains($0.offset) }.map(\.element)
        setHead(lane)
        return claim
    }

    /// The job leaves its lane without being sent (dropped, or a row that does not decode): the
    /// next job becomes the head.
    public mutating func remove(_ ref: Ref, lane: String) {
        unmarkHead(ref)
        lanes[lane]?.removeAll { $0.ref == ref }
        setHead(lane)
    }

    /// The lane's first open job is flagged as its head.
    private mutating func setHead(_ lane: String) {
        guard var first = lanes[lane]?.first, !first.job.isHead else { return }
        first.job.isHead = true
        lanes[lane]![0] = first
        markHead(first.ref)
    }

    private mutating func markHead(_ ref: Ref) {
        switch ref {
        case .stored(let id): if !newHeadsStored.contains(id) { newHeadsStored.append(id) }
        case .added(let n): headsAdded.insert(n)
        }
    }

    private mutating func unmarkHead(_ ref: Ref) {
        switch ref {
        case .stored(let id): newHeadsStored.removeAll { $0 == id }
        case .added(let n): headsAdded.remove(n)
        }
    }
}
