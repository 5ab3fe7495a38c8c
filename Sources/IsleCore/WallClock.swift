public import Foundation
import Synchronization

/// Wall-clock time, injected wherever a rule depends on the date (JWT age, budgets, stale dates,
/// lifetimes), so tests can drive time by hand.
public protocol WallClock: Sendable {
    var now: Date { get }
}

/// The system's clock.
public struct SystemWallClock: WallClock {
    public init() {}
    public var now: Date { Date() }
}

/// A clock that moves only when told to. Thread-safe.
public final class ManualWallClock: WallClock {
    private let current: Mutex<Date>

    public init(_ start: Date = Date(timeIntervalSince1970: 1_767_225_600)) { current = Mutex(start) }

    public var now: Date { current.withLock { $0 } }

    public func advance(by seconds: TimeInterval) { current.withLock { $0 += seconds } }
    public func set(_ date: Date) { current.withLock { $0 = date } }
}
