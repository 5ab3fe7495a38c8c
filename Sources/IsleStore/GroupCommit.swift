import Foundation
import IsleDelivery
import GRDB
import Logging
import Synchronization

/// Group commit for one SQLite writer: writes that arrive while a transaction is committing wait,
/// then all go in the next transaction together, each in its own savepoint (one failing write
/// rolls back only itself). Every caller returns only after the transaction holding its write is
/// committed (durable with `synchronous=FULL`), so "accepted" still means "on disk" — one fsync
/// serves many requests.
///
/// A write may be asynchronous (``transaction(_:)``: the queue's procedure reads, decides and
/// writes in steps): the batch's transaction is opened by hand and stays open across its writes'
/// suspensions. Only the batch's leader uses the writer connection meanwhile — every write of the
/// store comes through here — which is why the pool allows a transaction to stay open between
/// two accesses (`allowsUnsafeTransactions`).
///
/// The batching itself is ``Batcher``'s.
final class GroupCommit: Sendable {
    typealias Work = @Sendable (SQLiteWriter) async throws -> Void
    private let batcher: Batcher<Work, Void>
    private let pool: DatabasePool
    private let faults: StoreFaults
    /// Why the last commit failed (a full disk, an I/O error), until one succeeds.
    private let failure = Mutex<String?>(nil)

    /// One line when writes start failing and one when they work again (docs/server.md, "A full disk").
    private let logger: Logger?

    init(pool: DatabasePool, faults: StoreFaults = StoreFaults(), maximumBatch: Int = 512, logger: Logger? = nil) {
        self.pool = pool
        self.faults = faults
        self.logger = logger
        batcher = Batcher(maximumBatch: maximumBatch)
    }

    /// Why the last commit failed, while no commit has succeeded since.
    var lastFailure: String? { failure.withLock { $0 } }

    /// Writes are known to work again: a commit succeeded and the disk has room for new data.
    ///
    /// A commit alone does not say so: on a full disk SQLite can still commit into the space its
    /// log already holds (after a checkpoint the log is written again from its start), so some
    /// commits succeed and the next ones fail. `/ready` would flap between 200 and 503 while the
    /// disk stays full; a file beside the database that must be written and synced first keeps it
    /// at 503 until space really came back.
    func commitSucceeded() {
        guard failure.withLock({ $0 != nil }) else { return }
        guard !faults.take(.diskProbe), SQLiteStore.diskTakesWrites(beside: pool.path) else { return }
        clearFailure()
    }

    /// Writes are known to work again.
    func clearFailure() {
        guard failure.withLock({ f -> Bool in defer { f = nil }; return f != nil }) else { return }
        logger?.notice("the database takes writes again; requests and deliveries resume")
    }

    /// A commit failed: said once, until writes work again. True when it was said before (the
    /// caller's error need not be logged again).
    func recordFailure(_ why: String) -> Bool {
        let news = failure.withLock { f -> Bool in defer { f = why }; return f == nil }
        if news {
            logger?.error("the database cannot take writes (is its disk full?); writes get 503 with Retry-After and /ready says not ready until the disk has room again",
                          metadata: ["reason": "\(why)"])
        }
        return logger != nil
    }

    /// Runs `body` inside a committed write transaction shared with other writers.
    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await transaction { writer in try writer.run(body) }
    }

    /// Runs `body`, which may suspend between its statements, inside a committed write transaction
    /// shared with other writers.
    func transaction<T: Sendable>(_ body: @escaping @Sendable (SQLiteWriter) async throws -> T) async throws -> T {
        let box = Mutex<T?>(nil)
        let pool = self.pool
        let faults = self.faults
        try await batcher.submit({ writer in
            let value = try await body(writer)
            box.withLock { $0 = value }
        }, run: { batch in
            let writer = SQLiteWriter(pool: pool)
            do {
                // Optimistic first: the batch's writes one after the other in one transaction, no
                // savepoints (two statements fewer per write). Writes almost never fail on their
                // own; when one does, the transaction is rolled back and the batch written again,
                // each write in its own savepoint, so only that one fails.
                do {
                    try writer.begin()
                    for (n, work) in batch.enumerated() {
                        do { try await work(writer) } catch {
                            writer.rollback()
                            throw OneWriteFailed(index: n, error: error)
                        }
                    }
                    try faults.check(.commit)
                    try writer.commit()
                    self.commitSucceeded()
                    return batch.map { _ in .success(()) }
                } catch let failed as OneWriteFailed where GroupCommit.isStorageFailure(failed.error) {
                    // The disk, not the write: every write would fail the same way, so the batch
                    // is not tried again write by write (the outer catch records and answers it).
                    throw failed.error
                } catch let failed as OneWriteFailed where batch.count == 1 {
                    return [.failure(failed.error)]
                } catch is OneWriteFailed {
                    try writer.begin()
                    var results: [Result<Void, any Error>] = []
                    for work in batch {
                        try writer.run { db in try db.execute(sql: "SAVEPOINT isle_write") }
                        do {
                            try await work(writer)
                            try writer.run { db in try db.execute(sql: "RELEASE SAVEPOINT isle_write") }
                            results.append(.success(()))
                        } catch {
                            try writer.run { db in try db.execute(sql: "ROLLBACK TO SAVEPOINT isle_write; RELEASE SAVEPOINT isle_write") }
                            results.append(.failure(error))
                        }
                    }
                    try writer.commit()
                    self.commitSucceeded()
                    return results
                }
            } catch {
                // The commit itself failed (disk full, locked past the busy timeout, I/O error): every
                // write of the batch failed with it. Said without the SQL.
                writer.rollback()
                let why = GroupCommit.describe(error)
                let logged = self.recordFailure(why)
                throw StoreError(.unavailable, "the database could not commit: \(why)", alreadyLogged: logged)
            }
        })
        return box.withLock { $0! }
    }

    /// A write of an optimistic batch failed (the transaction is rolled back with it).
    struct OneWriteFailed: Error {
        var index: Int
        var error: any Error
    }

    /// SQLite could not write at all: the disk is full (SQLITE_FULL), the file grew past a limit or
    /// an I/O error (SQLITE_IOERR), or the file is read-only or gone (SQLITE_READONLY, SQLITE_CANTOPEN).
    static func isStorageFailure(_ error: any Error) -> Bool {
        guard let e = error as? DatabaseError else { return false }
        return [ResultCode.SQLITE_FULL, .SQLITE_IOERR, .SQLITE_READONLY, .SQLITE_CANTOPEN].contains(e.resultCode.primaryResultCode)
    }

    static func describe(_ error: any Error) -> String {
        if let e = error as? DatabaseError { return "SQLite error \(e.resultCode.rawValue)\(e.message.map { ": \($0)" } ?? "")" }
        return "\(type(of: error))"
    }
}

/// The writer connection, used by one batch's leader inside the transaction it opened: each call
/// runs on the calling thread (GRDB's synchronous access), never across a suspension.
struct SQLiteWriter: Sendable {
    let pool: DatabasePool

    func run<T>(_ body: (Database) throws -> T) throws -> T {
        try pool.writeWithoutTransaction(body)
    }

    func begin() throws {
        try run { db in try db.execute(sql: "BEGIN IMMEDIATE") }
    }

    func commit() throws {
        try run { db in try db.execute(sql: "COMMIT") }
    }

    /// Rolls back what is open (nothing when the transaction already ended).
    func rollback() {
        try? run { db in if db.isInsideTransaction { try db.execute(sql: "ROLLBACK") } }
    }
}
