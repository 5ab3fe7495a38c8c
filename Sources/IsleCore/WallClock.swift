public import Foundation
import Synchronization

/// Wall-clock time, injected wherever a rule depends on the date (JWT age, budgets, stale dates,
/// lifetimes), so tests can drive time by hand — including when work sleeps until a time.
public protocol WallClock: Sendable {
    var now: Date { get }
    /// Suspends until `now` reaches `deadline` on this clock; throws `CancellationError` when the
    /// task is cancelled first.
    func sleep(until deadline: Date) async throws
}

extension WallClock {
    /// A clock that follows real time sleeps in real time.
    public func sleep(until deadline: Date) async throws {
        let seconds = deadline.timeIntervalSince(now)
        guard seconds > 0 else { return try Task.checkCancellation() }
        try await Task.sleep(for: .milliseconds(Int64(min(seconds, 86_400 * 365) * 1000) + 1))
    }
}

/// The system's clock.
public struct SystemWallClock: WallClock {
    public init() {}
    public var now: Date { Date() }
}

/// A clock that moves only when told to. Thread-safe. Sleepers wake when the clock is moved to or
/// past their deadline, never by real time passing.
public final class ManualWallClock: WallClock {
    private struct State {
        var now: Date
        var sleepers: [UInt64: (deadline: Date, continuation: CheckedContinuation<Void, any Error>)] = [:]
        /// Sleepers cancelled before they registered.
        var cancelled: Set<UInt64> = []
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>

    public init(_ start: Date = Date(timeIntervalSince1970: 1_767_225_600)) { state = Mutex(State(now: start)) }

    public var now: Date { state.withLock { $0.now } }

    /// Tasks sleeping on this clock now.
    public var sleepers: Int { state.withLock { $0.sleepers.count } }

    public func advance(by seconds: TimeInterval) { move { $0 += seconds } }
    public func set(_ date: Date) { move { $0 = date } }

    private func move(_ change: (inout Date) -> Void) {
        let due = state.withLock { s -> [CheckedContinuation<Void, any Error>] in
            change(&s.now)
            let now = s.now
            let ready = s.sleepers.filter { $0.value.deadline <= now }
            for id in ready.keys { s.sleepers[id] = nil }
            return ready.values.map(\.continuation)
        }
        for c in due { c.resume() }
    }

    public func sleep(until deadline: Date) async throws {
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                enum Now { case wait, resume, cancel }
                let action = state.withLock { s -> Now in
                    if s.cancelled.remove(id) != nil { return .cancel }
                    if s.now >= deadline { return .resume }
                    s.sleepers[id] = (deadline, c)
                    return .wait
                }
                switch action {
                case .wait: break
                case .resume: c.resume()
                case .cancel: c.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            let c = state.withLock { s -> CheckedContinuation<Void, any Error>? in
                guard let sleeper = s.sleepers.removeValue(forKey: id) else {
                    s.cancelled.insert(id)
                    return nil
                }
                return sleeper.continuation
            }
            c?.resume(throwing: CancellationError())
        }
    }
}
