import Foundation
import Logging
import PostgresNIO
import Synchronization

/// Whether PostgreSQL answers, as this process last saw it (docs/server.md, "When PostgreSQL is
/// away"). While it is away every store call fails at once with `.unavailable` — a 503 with
/// `Retry-After` at the API, a not-ready `/ready` — instead of waiting on a pool that cannot
/// connect; in-flight calls are answered the moment it is seen to be away. One log line when it
/// goes, one when it is back.
final class PostgresAvailability: Sendable {
    struct Away: Sendable {
        var since: ContinuousClock.Instant
        var at: Date
        var reason: String
    }

    private let away = Mutex<Away?>(nil)
    private let logger: Logger

    init(logger: Logger) { self.logger = logger }

    /// Nil while PostgreSQL answers.
    var current: Away? { away.withLock { $0 } }

    /// Seen away (a probe failed, or a call lost its connection). True when this is news.
    @discardableResult
    func markAway(_ reason: String) -> Bool {
        let news = away.withLock { a -> Bool in
            guard a == nil else { return false }
            a = Away(since: .now, at: Date(), reason: reason)
            return true
        }
        if news { logger.error("PostgreSQL is unavailable; requests get 503 with Retry-After and deliveries pause until it answers", metadata: ["reason": "\(reason)"]) }
        return news
    }

    /// Answers again. True when it was away.
    @discardableResult
    func markBack() -> Bool {
        guard let was = away.withLock({ a -> Away? in defer { a = nil }; return a }) else { return false }
        let seconds = Double((ContinuousClock.now - was.since).components.seconds)
        logger.notice("PostgreSQL answers again; requests and deliveries resume", metadata: ["away.seconds": "\(Int(seconds))"])
        return true
    }

    /// Errors that say the database (not one statement) is away: a lost or refused connection,
    /// the pool's circuit breaker, PostgreSQL shutting down or out of connections.
    static func saysAway(_ error: any Error) -> Bool {
        // The pool's own errors (its circuit breaker after 15 s of failed connects) are of a type
        // postgres-nio does not export (`_ConnectionPoolModule.ConnectionPoolError`).
        if String(describing: type(of: error)) == "ConnectionPoolError" { return true }
        if let e = error as? PSQLError {
            switch e.code {
            case .connectionError, .serverClosedConnection, .uncleanShutdown, .poolClosed: return true
            case .server:
                let state = e.serverInfo?[.sqlState] ?? ""
                return state.hasPrefix("57P") || state.hasPrefix("08") || state == "53300"
            default: return false
            }
        }
        return false
    }
}

/// The connection pool, replaced when PostgreSQL comes back: a pool that failed to connect for a
/// while backs off for seconds between attempts (up to a minute); a new one connects at once.
final class PostgresPools: Sendable {
    private struct Current {
        var client: PostgresClient
        var runner: Task<Void, Never>?
        /// Pools replaced while running: they keep running (a call may still be on one, such as a
        /// long migration) until the store stops; idle, they close their connections.
        var retired: [Task<Void, Never>] = []
    }
    private let current: Mutex<Current>
    private let make: @Sendable () -> PostgresClient

    init(make: @escaping @Sendable () -> PostgresClient) {
        self.make = make
        current = Mutex(Current(client: make(), runner: nil))
    }

    var client: PostgresClient { current.withLock { $0.client } }

    /// Starts the pool before the store's first call: a store run again (a second `withRunning`)
    /// gets a new pool, since a pool runs once. Returns once the pool's run has begun, so no call
    /// can reach a pool that has stopped or not started.
    func start() async {
        let fresh = current.withLock { c -> PostgresClient? in c.runner == nil ? nil : make() }
        let client = fresh ?? self.client
        let started = Atomic<Bool>(false)
        let runner = Task {
            started.store(true, ordering: .sequentiallyConsistent)
            await client.run()
        }
        while !started.load(ordering: .sequentiallyConsistent) { await Task.yield() }
        current.withLock { c in
            c.client = client
            c.runner = runner
        }
    }

    /// Keeps the pool (and each that replaces it) running until cancelled; then stops them all.
    func run() async {
        await withTaskCancellationHandler {
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        } onCancel: {
            self.current.withLock { c in
                c.runner?.cancel()
                for r in c.retired { r.cancel() }
                c.retired = []
            }
        }
    }

    /// A new pool takes the calls from now on (once it runs); the old one is retired.
    func replace() async {
        let fresh = make()
        let started = Atomic<Bool>(false)
        let runner = Task {
            started.store(true, ordering: .sequentiallyConsistent)
            await fresh.run()
        }
        // Calls go to the new pool once its run has begun (a pool leased before it runs warns).
        while !started.load(ordering: .sequentiallyConsistent) { await Task.yield() }
        current.withLock { c in
            if let old = c.runner { c.retired.append(old) }
            c.client = fresh
            c.runner = runner
        }
    }
}

extension PostgresStore {
    /// How often the database is looked at while it answers (through the pool) and while it is
    /// away (with a connection of its own, so a pool backing off does not delay the news).
    /// A call waiting on a pool that cannot connect is answered when the watcher sees it: within
    /// `up` + ``probeLimit`` (+ a refused connect), well inside the 2 s a client is promised.
    static let probeEvery = (up: Duration.milliseconds(300), away: Duration.milliseconds(250))
    /// A probe through the pool that takes longer than this is checked with a connection of its
    /// own, which gets ``confirmLimit``: a loaded machine (or a busy pool) is not an absent
    /// database, and costs one extra connection per look.
    static let probeLimit = Duration.milliseconds(500)
    static let confirmLimit = Duration.seconds(2)

    /// Watches PostgreSQL until cancelled: marks it away when a probe fails and back when one
    /// succeeds (with a fresh pool).
    func watchAvailability() async {
        while !Task.isCancelled {
            if availability.current == nil {
                try? await Task.sleep(for: Self.probeEvery.up)
                if Task.isCancelled { return }
                do { try await probeThroughPool() } catch {
                    // A busy pool, or a loaded machine, is not an absent database: away only when
                    // a connection of its own is refused or cut (PostgreSQL stopped, restarting,
                    // unreachable). One that is merely slow is left to the calls' own deadlines.
                    if !Task.isCancelled, case .refused(let why) = await probeDirectly(limit: Self.confirmLimit) { goneAway(why) }
                }
            } else {
                try? await Task.sleep(for: Self.probeEvery.away)
                if Task.isCancelled { return }
                // A longer limit delays no answer; it only keeps a slow machine from missing one.
                if case .answered = await probeDirectly(limit: Self.confirmLimit) {
                    await pools.replace()
                    availability.markBack()
                }
            }
        }
    }

    /// PostgreSQL is away: said once, and every call waiting on it is answered now.
    func goneAway(_ reason: String) {
        if availability.markAway(reason) { deadlines.expireAll(because: "PostgreSQL is unavailable (\(reason.prefix(120)))") }
    }

    func probeThroughPool() async throws {
        let log = logger
        let client = pools.client
        _ = try await bounded(limit: Self.probeLimit, gated: false) {
            do { return try await client.withConnection { conn in try await conn.rows("SELECT 1", logger: log).count } } catch let e as PSQLError { throw PG.storeError(e) }
        }
    }

    enum Probe { case answered, refused(String), slow }

    /// One connection outside the pool, `SELECT 1`, closed: answered in time, refused or cut
    /// (an error), or slow (no answer within `limit`).
    func probeDirectly(limit: Duration) async -> Probe {
        let settings = self.settings
        let log = logger
        do {
            _ = try await bounded(limit: limit, gated: false) { () async throws -> Int in
                // A refusal comes at once; a slow connect is judged by `limit`, not by a timeout of its own.
                let configuration = try PostgresStore.connectionConfiguration(settings, connectTimeout: .seconds(10))
                let connection = try await PostgresConnection.connect(configuration: configuration, id: 1, logger: log)
                defer { Task { try? await connection.close() } }
                return try await connection.query("SELECT 1", logger: log).collect().count
            }
            return .answered
        } catch let e as StoreError where e.message.hasPrefix("PostgreSQL did not answer within") {
            return .slow
        } catch {
            return .refused("a connection of its own to \(settings.host):\(settings.port) failed: \(PG.describe(error))")
        }
    }
}
