import GRDB
import Synchronization

/// Connections for the one-statement reads of a request (``SQLiteStore/readOne(_:)``: its key, app,
/// activity and idempotency record), outside GRDB's reader pool. The pool runs
/// `PRAGMA schema_version` before every read, to notice a schema changed by another connection;
/// that doubled the statements of those reads (docs/performance.md, "Statements by kind"). Isle's
/// schema changes only when it migrates, before it serves, and SQLite itself prepares a cached
/// statement again if the schema did change under it.
///
/// A connection is taken for one read, on the calling thread, and given back at once; a read that
/// finds none free opens one, up to `limit`, and past that uses the pool.
final class SingleReadConnections: Sendable {
    private let free = Mutex<(idle: [DatabaseQueue], opened: Int)>(([], 0))
    private let path: String
    private let configuration: Configuration
    private let limit: Int

    init(path: String, configuration: Configuration, limit: Int) {
        self.path = path
        self.configuration = configuration
        self.limit = limit
    }

    private enum Take { case idle(DatabaseQueue), open, none }

    /// Runs `body` on a connection of its own; nil when none is free and no more may be opened
    /// (or one could not be opened): the caller reads through the pool instead.
    func read<T>(_ body: (Database) throws -> T) throws -> T? {
        let take = free.withLock { f -> Take in
            if let q = f.idle.popLast() { return .idle(q) }
            guard f.opened < limit else { return .none }
            f.opened += 1
            return .open
        }
        let queue: DatabaseQueue
        switch take {
        case .idle(let q): queue = q
        case .none: return nil
        case .open:
            do { queue = try DatabaseQueue(path: path, configuration: configuration) } catch {
                free.withLock { $0.opened -= 1 }
                return nil
            }
        }
        defer { free.withLock { $0.idle.append(queue) } }
        return try queue.unsafeRead(body)
    }
}
