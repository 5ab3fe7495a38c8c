import Foundation
import IsleCore
import IsleStore
import IsleDelivery
import Logging
public import ServiceLifecycle
import Synchronization

/// Counts each completion this process writes into per-minute counters per app, and writes them to
/// the store every few seconds (a `Service`; it writes what is left when the server stops). A crash
/// loses at most those few seconds of counts; deliveries themselves are never lost.
public final class HistoryRecorder: Service {
    private let counts = Mutex<[HistoryKey: Int64]>([:])
    let store: any HistoryRepository
    let flushEvery: Duration
    let logger: Logger

    struct HistoryKey: Hashable {
        var bundleID: String
        var minute: Date
        var metric: String
    }

    init(store: any HistoryRepository, flushEvery: Duration = .seconds(5), logger: Logger) {
        self.store = store
        self.flushEvery = flushEvery
        self.logger = logger
    }

    static func minute(_ d: Date) -> Date { Date(timeIntervalSince1970: (d.timeIntervalSince1970 / 60).rounded(.down) * 60) }

    func add(_ bundleID: String, _ metric: String, at: Date, _ n: Int64 = 1) {
        counts.withLock { $0[HistoryKey(bundleID: bundleID, minute: Self.minute(at), metric: metric), default: 0] += n }
    }

    /// What one written completion tells the history.
    func record(_ c: JobCompletion, now: Date) {
        let app = c.claim.job.bundleID
        let at = c.delivery?.at ?? now
        switch c.result {
        case .finished(.sent, _):
            add(app, HistoryMetric.delivered, at: at)
            if c.delivery?.downgraded == true { add(app, HistoryMetric.downgraded, at: at) }
            add(app, HistoryMetric.queue(max(0, now.timeIntervalSince(c.claim.job.createdAt))), at: at)
        case .finished(.failed, _): add(app, HistoryMetric.failed, at: at)
        case .finished(.dropped, _), .finished(.superseded, _): add(app, HistoryMetric.dropped, at: at)
        case .finished: break
        case .retry: if c.delivery != nil { add(app, HistoryMetric.retried, at: at) }
        case .deadToken: add(app, HistoryMetric.tokenRetired, at: at)
        }
        if let d = c.delivery {
            if d.status != 0 { add(app, HistoryMetric.latency(d.latencyMS), at: at) }
            if d.status != 200 { add(app, HistoryMetric.reason(d.reason, status: d.status), at: at) }
        }
    }

    /// Writes what was counted; on failure the counts are kept for the next try.
    func flush() async {
        let points = counts.withLock { c -> [HistoryPoint] in
            defer { c.removeAll() }
            return c.map { HistoryPoint(bundleID: $0.key.bundleID, minute: $0.key.minute, metric: $0.key.metric, count: $0.value) }
        }
        guard !points.isEmpty else { return }
        do {
            try await store.addHistory(points)
        } catch {
            logger.log(level: .forStoreFailure(.warning, error), "writing the delivery history failed; keeping the counts for the next try", metadata: ["error": "\(error)"])
            counts.withLock { c in for p in points { c[HistoryKey(bundleID: p.bundleID, minute: p.minute, metric: p.metric), default: 0] += p.count } }
        }
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try? await Task.sleep(for: self.flushEvery)
                await self.flush()
            }
        }
        await flush()
    }
}
