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
