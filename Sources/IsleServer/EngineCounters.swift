import Foundation
import Synchronization

/// Delivery counters for /metrics.
public final class EngineCounters: Sendable {
    private let values = Mutex<[String: Int]>([:])
    /// Where every count also goes, for `/metrics`.
    public let metrics: ServerMetrics
    init(metrics: ServerMetrics = ServerMetrics()) { self.metrics = metrics }
    func bump(_ k: String, app: String) {
        values.withLock { $0[k, default: 0] += 1 }
        metrics.delivery(k, app: app)
    }
    func sent(downgraded: Bool, app: String) {
        bump("sent", app: app)
        if downgraded { bump("downgraded", app: app) }
    }
    func failed(app: String) { bump("failed", app: app) }
    func retried(app: String) { bump("retried", app: app) }
    func dropped(app: String) { bump("dropped", app: app) }
    public var snapshot: [String: Int] { values.withLock { $0 } }
}

/// The jobs this process is working on (never taken back by its own sweep).
final class InFlight: Sendable {
    private let jobs = Mutex<Set<Int64>>([])
    func add(_ id: Int64) { _ = jobs.withLock { $0.insert(id) } }
    func remove(_ id: Int64) { _ = jobs.withLock { $0.remove(id) } }
    var count: Int { jobs.withLock { $0.count } }
    var ids: Set<Int64> { jobs.withLock { $0 } }
}
