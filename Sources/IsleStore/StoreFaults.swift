import Synchronization

/// Failpoints: named places in a store where a test makes the database misbehave, as a full disk
/// or a dropped connection would — the paths that only show when the database does not
/// cooperate (the engine's bookkeeping retried in process, the API's 503, a lost answer). Armed
/// only by tests (`arm`); disarmed, a point costs one atomic load. Both stores have them, so no
/// test needs a double that forwards the store's every requirement.
public final class StoreFaults: Sendable {
    public enum Point: String, Sendable, Hashable, CaseIterable {
        /// Accepting jobs fails; nothing is written.
        case enqueue
        /// Writing delivery results fails; nothing is written.
        case complete
        /// A device report's write (installation or activity) fails; nothing is written.
        case registry
        /// A device report's write commits, then the call fails: the answer is lost.
        case registryAfterCommit
        /// Reading an installation answers "none" although the row exists.
        case installationMissing
        /// Reading an activity by id answers "none" although the row exists.
        case activityMissing
        /// Pruning fails.
        case prune
        /// SQLite: a batch's commit fails, as on a full disk (``SQLiteStore/ping()`` then checks the disk).
        case commit
        /// SQLite: the disk check (of ``SQLiteStore/ping()``, or after a commit while writes were
        /// failing) fails, as on a full disk.
        case diskProbe
    }

    private let remaining = Mutex<[Point: Int]>([:])
    private let armed = Atomic<Int>(0)
    private let fired = Atomic<Int>(0)

    public init() {}

    /// The next `times` passes through `point` misbehave.
    public func arm(_ point: Point, times: Int) {
        guard times > 0 else { return }
        remaining.withLock { $0[point, default: 0] += times }
        armed.add(times, ordering: .sequentiallyConsistent)
    }

    /// `point` behaves again, however many times it was armed for.
    public func disarm(_ point: Point) {
        let left = remaining.withLock { $0.removeValue(forKey: point) ?? 0 }
        if left > 0 { armed.subtract(left, ordering: .sequentiallyConsistent) }
    }

    /// How many times a point has misbehaved.
    public var injected: Int { fired.load(ordering: .sequentiallyConsistent) }

    /// Whether `point` misbehaves this time (and one fewer time from now on).
    public func take(_ point: Point) -> Bool {
        guard armed.load(ordering: .relaxed) > 0 else { return false }
        let hit = remaining.withLock { r -> Bool in
            guard let n = r[point], n > 0 else { return false }
            r[point] = n - 1
            return true
        }
        if hit {
            armed.subtract(1, ordering: .sequentiallyConsistent)
            fired.add(1, ordering: .sequentiallyConsistent)
        }
        return hit
    }

    /// Throws a store error, as a full disk would, when `point` misbehaves this time.
    public func check(_ point: Point) throws {
        if take(point) { throw StoreError(.unavailable, "injected at \(point.rawValue): the disk is full") }
    }

    /// A device report's write: ``Point/registry`` before it, ``Point/registryAfterCommit`` after.
    public func registryWrite<T>(_ write: () async throws -> T) async throws -> T {
        try check(.registry)
        let written = try await write()
        try check(.registryAfterCommit)
        return written
    }
}
