import Foundation
import GRDB
import Synchronization

/// Group commit for one SQLite writer: writes that arrive while a transaction is committing wait,
/// then all go in the next transaction together, each in its own savepoint (one failing write
/// rolls back only itself). Every caller returns only after the transaction holding its write is
/// committed (durable with `synchronous=FULL`), so "accepted" still means "on disk" — one fsync
/// serves many requests.
///
/// No background task: the caller that finds no transaction under way leads one; when its
/// transaction is done it hands the lead to the first waiter, if any.
final class GroupCommit: Sendable {
    private struct Pending: Sendable {
        let id: Int
        let work: @Sendable (Database) throws -> Void
        let continuation: CheckedContinuation<Role, Never>
    }
    private enum Role: Sendable { case lead, done(Result<Void, any Error>) }
    private struct State {
        var queue: [Pending] = []
        var leading = false
        var nextID = 0
    }

    private let pool: DatabasePool
    private let state = Mutex(State())
    /// At most this many writes in one transaction.
    let maximumBatch: Int

    init(pool: DatabasePool, maximumBatch: Int = 512) {
        self.pool = pool
        self.maximumBatch = maximumBatch
    }

    /// Runs `body` inside a committed write transaction shared with other writers.
    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let box = Mutex<T?>(nil)
        let work: @Sendable (Database) throws -> Void = { db in
            let value = try body(db)
            box.withLock { $0 = value }
        }
        let id = state.withLock { s -> Int in
            s.nextID += 1
            return s.nextID
        }
        let role = await withCheckedContinuation { (c: CheckedContinuation<Role, Never>) in
            let lead = state.withLock { s -> Bool in
                s.queue.append(Pending(id: id, work: work, continuation: c))
                if s.leading { return false }
                s.leading = true
                return true
            }
            if lead { c.resume(returning: .lead) }
        }
        let result: Result<Void, any Error>
        switch role {
        case .done(let r): result = r
        case .lead: result = await lead(own: id)
        }
        try result.get()
        return box.withLock { $0! }
    }

    static func describe(_ error: any Error) -> String {
        if let e = error as? DatabaseError { return "SQLite error \(e.resultCode.rawValue)\(e.message.map { ": \($0)" } ?? "")" }
        return "\(type(of: error))"
    }

    /// Commits one batch: the queued writes (this caller's first among them: a new leader's write
    /// is always at the head of the queue), then hands over.
    private func lead(own: Int) async -> Result<Void, any Error> {
        let batch = state.withLock { s -> [Pending] in
            let n = min(s.queue.count, maximumBatch)
            defer { s.queue.removeFirst(n) }
            return Array(s.queue.prefix(n))
        }
        let results = Mutex<[Int: Result<Void, any Error>]>([:])
        let outcome: Result<Void, any Error>
        do {
            // The batch holds other callers' writes: the leader's cancellation must not cancel
            // them, so the transaction runs in a task that does not inherit it (awaited at once).
            let pool = self.pool
            try await Task {
                try await pool.write { db in
                for p in batch {
                    do {
                        try db.inSavepoint {
                            try p.work(db)
                            return .commit
                        }
                        results.withLock { $0[p.id] = .success(()) }
                    } catch {
                        results.withLock { $0[p.id] = .failure(error) }
                    }
                }
            }
            }.value
            outcome = .success(())
        } catch {
            // The commit itself failed (disk full, locked past the busy timeout, I/O error): every
            // write of the batch failed with it. Said without the SQL.
            outcome = .failure(StoreError(.unavailable, "the database could not commit: \(Self.describe(error))"))
        }
        var mine: Result<Void, any Error> = .success(())
        let done = results.withLock { $0 }
        for p in batch {
            let r: Result<Void, any Error> = switch outcome {
            case .failure(let e): .failure(e)
            case .success: done[p.id] ?? .failure(StoreError(.unavailable, "the write was not run"))
            }
            if p.id == own {
                mine = r
            } else {
                p.continuation.resume(returning: .done(r))
            }
        }
        let next = state.withLock { s -> Pending? in
            guard let first = s.queue.first else {
                s.leading = false
                return nil
            }
            return first
        }
        next?.continuation.resume(returning: .lead)
        return mine
    }
}
