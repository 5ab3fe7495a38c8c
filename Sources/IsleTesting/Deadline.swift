import Synchronization
/// Waiting for events in tests: the event, or a failure once the deadline passes. Never a sleep
/// that hopes the event has happened.
public struct DeadlineExceeded: Error, CustomStringConvertible {
    public let what: String
    public let after: Duration
    public init(what: String, after: Duration) {
        self.what = what
        self.after = after
    }
    public var description: String { "\(what) did not happen within \(after)" }
}

public func withDeadline<T: Sendable>(_ limit: Duration = .seconds(10), _ what: String = "the event", _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw DeadlineExceeded(what: what, after: limit) }
        return value
    }
}

/// The next value of an async sequence, within a deadline.
public func nextValue<S: AsyncSequence & Sendable>(of sequence: S, within limit: Duration = .seconds(10), _ what: String = "the next value") async throws -> S.Element where S.Element: Sendable {
    try await withDeadline(limit, what) {
        var iterator = sequence.makeAsyncIterator()
        guard let v = try await iterator.next() else { throw DeadlineExceeded(what: "\(what) (the sequence ended)", after: limit) }
        return v
    }
}

/// Waits until `condition` holds, checking every few milliseconds, or fails at the deadline.
/// For state that has no change feed (a server's database); prefer awaiting events where they exist.
public func eventually(within limit: Duration = .seconds(20), _ what: String = "the condition", _ condition: @escaping @Sendable () async throws -> Bool) async throws {
    try await withDeadline(limit, what) {
        while true {
            if try await condition() { return }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}

/// A one-time signal that loops wait on between rounds (a backend's next request, a monitor's next
/// look): each round waits for the signal, up to its pace, and the loop ends the moment it fires
/// rather than after a sleep.
public final class StopSignal: Sendable {
    private struct State {
        var fired = false
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var next: UInt64 = 0
    }
    private let state = Mutex(State())

    public init() {}

    public var fired: Bool { state.withLock { $0.fired } }

    public func fire() {
        let waiting = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.fired = true
            defer { s.waiters = [:] }
            return Array(s.waiters.values)
        }
        for w in waiting { w.resume() }
    }

    /// Waits until the signal fires or `pace` has passed. True when it fired.
    @discardableResult
    public func wait(upTo pace: Duration) async -> Bool {
        let id = state.withLock { s -> UInt64 in s.next += 1; return s.next }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    let now = self.state.withLock { s -> Bool in
                        if s.fired { return true }
                        s.waiters[id] = c
                        return false
                    }
                    if now { c.resume() }
                }
            }
            group.addTask { try? await Task.sleep(for: pace) }
            await group.next()
            // The pace ran out first: the waiter is taken back and answered, so its task ends.
            if let c = self.state.withLock({ $0.waiters.removeValue(forKey: id) }) { c.resume() }
            group.cancelAll()
        }
        return fired
    }
}
