import Synchronization

/// The priority-10 sends an engine has decided and not yet seen in a claim's count.
///
/// A claim reads an installation's priority-10 sends of the hour from the store, but pushes of one
/// phone claimed together — or while others of that phone are in flight — are decided before any
/// of them is written: each would see the same count, and together they would spend more than the
/// phone allows (the day run found three sent in one minute past the budget). So the decision is
/// made here, one at a time per engine: the store's count, plus the sends this engine decided that
/// the count cannot hold (in flight, or written after the claim read it), is what the planner
/// sees; a send it decides at priority 10 is added before the next decision.
///
/// Instances sharing a database each know only their own decisions: two claiming pushes of one
/// phone in the same moment can still overrun by one, which the installation's one in hand absorbs
/// (docs/server.md, "The priority-10 budget").
public final class PriorityReservations: Sendable {
    struct Entry {
        var key: String
        /// The mark after its result was written; nil while in flight.
        var written: UInt64?
        var writtenAt: ContinuousClock.Instant?
    }

    struct State {
        var mark: UInt64 = 0
        var entries: [Int64: Entry] = [:]
        var byKey: [String: Set<Int64>] = [:]
    }

    private let state = Mutex(State())
    /// How long a written send is kept after it was written: longer than any claim takes from
    /// reading the counts to deciding.
    let keepWritten: Duration

    public init(keepWritten: Duration = .seconds(120)) {
        self.keepWritten = keepWritten
    }

    /// Taken just before a claim reads the counts.
    public func mark() -> UInt64 {
        state.withLock { s in
            s.mark += 1
            return s.mark
        }
    }

    /// Decides with `decide`, given the sends of `key` (an installation's budget key) this engine
    /// decided that a claim read at `mark` does not count; when `sendsAtTen` says the decision
    /// spends a priority-10 push, it is recorded for `job` before the next decision.
    public func decide<Decision>(key: String?, job: Int64, mark: UInt64, _ decide: (_ uncounted: Int) -> Decision, sendsAtTen: (Decision) -> Bool) -> Decision {
        guard let key else { return decide(0) }
        return state.withLock { s in
            let now = ContinuousClock.now
            var uncounted = 0
            for id in s.byKey[key] ?? [] {
                guard let e = s.entries[id] else { continue }
                if let at = e.writtenAt, now - at > keepWritten {
                    s.entries[id] = nil
                    s.byKey[key]?.remove(id)
                    continue
                }
                if e.written.map({ $0 > mark }) ?? true { uncounted += 1 }
            }
            if s.byKey[key]?.isEmpty == true { s.byKey[key] = nil }
            let decision = decide(uncounted)
            if sendsAtTen(decision) {
                s.entries[job] = Entry(key: key, written: nil, writtenAt: nil)
                s.byKey[key, default: []].insert(job)
            }
            return decision
        }
    }

    /// The job's result is written: a send that went at priority 10 is now in the store's count
    /// for claims that read after this; one that did not is forgotten.
    public func written(job: Int64, sentAtTen: Bool) {
        state.withLock { s in
            guard var e = s.entries[job] else { return }
            guard sentAtTen else {
                s.entries[job] = nil
                s.byKey[e.key]?.remove(job)
                if s.byKey[e.key]?.isEmpty == true { s.byKey[e.key] = nil }
                return
            }
            s.mark += 1
            e.written = s.mark
            e.writtenAt = .now
            s.entries[job] = e
        }
    }

    /// Sends in flight or kept, for tests.
    public var count: Int { state.withLock { $0.entries.count } }
}
