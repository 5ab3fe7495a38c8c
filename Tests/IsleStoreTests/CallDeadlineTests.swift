import Foundation
@testable import IsleStore
import IsleDelivery
import IsleTesting
import Logging
import Synchronization
import Testing

/// Every PostgreSQL store call ends by its deadline (statement timeout + 5 s), kept by one shared
/// watcher rather than a timer task per call.
@Suite("PostgreSQL call deadlines")
struct CallDeadlineTests {
    @Test("a call past its deadline expires once; a call removed in time never does; the watcher stops when idle and starts again")
    func deadlines() async throws {
        let deadlines = CallDeadlines()
        let fired = Mutex<[String]>([])
        let kept = deadlines.add(after: .milliseconds(50)) { _ in fired.withLock { $0.append("kept") } }
        let removed = deadlines.add(after: .milliseconds(50)) { _ in fired.withLock { $0.append("removed") } }
        deadlines.remove(removed)
        _ = kept
        try await eventually("the call past its deadline expired") { fired.withLock { $0 } == ["kept"] }
        // Idle now: a new call starts the watcher again. (Deadlines only catch a hang: a loaded
        // machine can hold a task back for seconds.)
        _ = deadlines.add(after: .milliseconds(10)) { _ in fired.withLock { $0.append("later") } }
        try await eventually("a later call expired too") { fired.withLock { $0 } == ["kept", "later"] }
    }

    @Test("a store call that never answers is answered unavailable at statement timeout + 5 s, and its work is cancelled")
    func stuckCall() async throws {
        let store = PostgresStore(settings: try PostgresSettings(url: "postgres://isle@127.0.0.1:1/isle?statement_timeout=1", environment: [:]), logger: Logger(label: "test"))
        let cancelled = Mutex(false)
        // The stuck work waits here, cancelled or not, until the test lets it go.
        let gate = Mutex<CheckedContinuation<Void, Never>?>(nil)
        defer { gate.withLock { $0?.resume(); $0 = nil } }
        let start = ContinuousClock.now
        do {
            _ = try await store.bounded { () async throws -> Int in
                await withTaskCancellationHandler {
                    // Ignores cancellation, as a call stuck on a dropped connection can.
                    await withCheckedContinuation { c in gate.withLock { $0 = c } }
                    return 0
                } onCancel: { cancelled.withLock { $0 = true } }
            }
            Issue.record("the stuck call answered")
        } catch let e as StoreError {
            #expect(e.code == .unavailable && e.message.contains("did not answer"), "\(e.message)")
        }
        let took = ContinuousClock.now - start
        // Not before the deadline; the upper bound only says "bounded" (a loaded machine stretches it).
        #expect(took >= .seconds(6) && took < .seconds(30), "\(took)")
        try await eventually("the stuck work was cancelled") { cancelled.withLock { $0 } }
    }
}
