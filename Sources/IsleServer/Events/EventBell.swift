import Synchronization

/// Rung whenever this process commits events (a completion, a device's report): long polls of
/// `GET /v1/events` and the webhook dispatcher wake at once instead of polling. Events another
/// process commits (several instances on PostgreSQL) are found by the waiters' bounded waits.
public final class EventBell: Sendable {
    private struct State {
        var generation: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextID: UInt64 = 0
    }
    private let state = Mutex(State())

    public init() {}

    /// Changes at every ring: read it before looking for events, wait with it after.
    public var generation: UInt64 { state.withLock { $0.generation } }

    public func ring() {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.generation &+= 1
            defer { s.waiters.removeAll() }
            return Array(s.waiters.values)
        }
        for w in waiters { w.resume() }
    }

    /// Returns once the bell rang after `generation` was read, after `timeout`, or when the task
    /// is cancelled, whichever comes first.
    public func wait(since generation: UInt64, timeout: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await Task.sleep(for: timeout) }
            group.addTask { await self.rung(since: generation) }
            _ = await group.next()
            group.cancelAll()
        }
    }

    private func rung(since generation: UInt64) async {
        let id = state.withLock { s -> UInt64 in
            s.nextID &+= 1
            return s.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let now = state.withLock { s -> Bool in
                    if s.generation != generation || Task.isCancelled { return true }
                    s.waiters[id] = c
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            let c = state.withLock { $0.waiters.removeValue(forKey: id) }
            c?.resume()
        }
    }
}
