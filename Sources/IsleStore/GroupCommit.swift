import Foundation
import GRDB
import Synchronization

/// Group commit for one SQLite writer: writes that arrive while a transaction is committing wait,
/// then all go in the next transaction together, each in its own savepoint (one failing write
/// rolls back only itself). Every caller returns only after the transaction holding its write is
/// committed (durable with `synchronous=FULL`), so "accepted" still means "on disk" — one fsync
/// serves many requests.
///
/// The batching itself is ``Batcher``'s.
final class GroupCommit: Sendable {
    private let batcher: Batcher<@Sendable (Database) throws -> Void, Void>
    private let pool: DatabasePool

    init(pool: DatabasePool, maximumBatch: Int = 512) {
        self.pool = pool
        batcher = Batcher(maximumBatch: maximumBatch)
    }

    /// Runs `body` inside a committed write transaction shared with other writers.
    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let box = Mutex<T?>(nil)
        let pool = self.pool
        try await batcher.submit({ db in
            let value = try body(db)
            box.withLock { $0 = value }
        }, run: { batch in
            do {
                // Optimistic first: the batch's writes one after the other in one transaction, no
                // savepoints (two statements fewer per write). Writes almost never fail on their
                // own; when one does, the transaction is rolled back and the batch written again,
                // each write in its own savepoint, so only that one fails.
                do {
                    return try await pool.write { db in
                        for (n, work) in batch.enumerated() {
                            do { try work(db) } catch { throw OneWriteFailed(index: n, error: error) }
                        }
                        return batch.map { _ in .success(()) }
                    }
                } catch let failed as OneWriteFailed where batch.count == 1 {
                    return [.failure(failed.error)]
                } catch is OneWriteFailed {
                    return try await pool.write { db in
                        batch.map { work -> Result<Void, any Error> in
                            do {
                                try db.inSavepoint {
                                    try work(db)
                                    return .commit
                                }
                                return .success(())
                            } catch {
                                return .failure(error)
                            }
                        }
                    }
                }
            } catch {
                // The commit itself failed (disk full, locked past the busy timeout, I/O error): every
                // write of the batch failed with it. Said without the SQL.
                throw StoreError(.unavailable, "the database could not commit: \(GroupCommit.describe(error))")
            }
        })
        return box.withLock { $0! }
    }

    /// A write of an optimistic batch failed (the transaction is rolled back with it).
    struct OneWriteFailed: Error {
        var index: Int
        var error: any Error
    }

    static func describe(_ error: any Error) -> String {
        if let e = error as? DatabaseError { return "SQLite error \(e.resultCode.rawValue)\(e.message.map { ": \($0)" } ?? "")" }
        return "\(type(of: error))"
    }
}
