import Foundation
import IsleCore
import IsleStore
import IsleDelivery
import CoreMetrics
import Metrics
public import Prometheus
import Synchronization

/// The server's metrics, through swift-metrics into a Prometheus registry of its own (not the
/// process-wide bootstrap: several servers may share a process, as in tests). Served at
/// `/metrics`. Labels never carry an id, a token or a key; APNs reasons are Apple's documented set
/// (anything else is `other`), so a peer cannot grow the label space.
public final class ServerMetrics: Sendable {
    public let registry: PrometheusCollectorRegistry
    let factory: PrometheusMetricsFactory

    public init() {
        registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = [
            .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10),
            .seconds(30), .seconds(60), .seconds(300), .seconds(900), .seconds(3600),
        ]
        self.factory = factory
        apnsTime = Timer(label: "isle_apns_response_seconds", factory: factory)
        queueTime = Timer(label: "isle_time_in_queue_seconds", factory: factory)
    }

    // Handles are made once per label set and kept: making one takes the registry's lock and
    // builds its labels, which the hot paths (every delivery, every API write) must not pay.
    private let apnsTime: Timer
    private let queueTime: Timer
    private let counters = Mutex<[String: CoreMetrics.Counter]>([:])
    private let timers = Mutex<[String: Timer]>([:])
    private let statementsSeen = Mutex<Int>(0)

    private func counter(_ label: String, _ dimensions: [(String, String)]) -> CoreMetrics.Counter {
        let key = label + dimensions.map { "|\($0.0)=\($0.1)" }.joined()
        return counters.withLock { c in
            if let existing = c[key] { return existing }
            let made = CoreMetrics.Counter(label: label, dimensions: dimensions, factory: factory)
            c[key] = made
            return made
        }
    }

    /// A finished delivery attempt: sent, retried, failed, dropped, downgraded.
    func delivery(_ outcome: String) {
        counter("isle_deliveries_total", [("outcome", outcome)]).increment()
    }

    /// APNs' answer to a push (status 0: not reached) and how long it took.
    func apnsResponse(status: Int, reason: String?, milliseconds: Double) {
        let known = reason.flatMap { APNsReason(rawValue: $0).isKnown ? $0 : "other" } ?? "none"
        counter("isle_apns_responses_total", [("status", String(status)), ("reason", known)]).increment()
        apnsTime.recordNanoseconds(Int64(saturating: max(0, milliseconds) * 1_000_000))
    }

    /// From accepted to sent.
    func timeInQueue(_ seconds: TimeInterval) {
        queueTime.recordNanoseconds(Int64(saturating: max(0, seconds) * 1_000_000_000))
    }

    /// An API write answered (202/200/201 or an error), and how long it took.
    func accepted(status: Int, duration: Duration) {
        let (s, atto) = duration.components
        let statusClass = String(status / 100) + "xx"
        let timer = timers.withLock { t in
            if let existing = t[statusClass] { return existing }
            let made = Timer(label: "isle_api_write_seconds", dimensions: [("status", statusClass)], factory: factory)
            t[statusClass] = made
            return made
        }
        timer.recordNanoseconds(s * 1_000_000_000 + atto / 1_000_000_000)
    }

    /// The open jobs, counted when scraped.
    func openJobs(_ counts: [PushJobState: Int]) {
        for state in [PushJobState.scheduled, .queued, .claimed] {
            Gauge(label: "isle_jobs", dimensions: [("state", state.rawValue)], factory: factory).record(counts[state] ?? 0)
        }
    }

    /// An app paused (`configuration`: APNs refused its set-up; `apnsUnavailable`: a back-off;
    /// `operator`: by hand).
    func appPaused(cause: String) {
        counter("isle_app_pauses_total", [("cause", cause)]).increment()
    }

    /// Apps whose pushes wait now, by cause, counted when scraped: `configuration` (APNs refused
    /// the app's set-up), `apnsUnavailable` (backing off) and `operator` (paused by hand).
    func pausedApps(_ counts: [String: Int]) {
        for cause in ["configuration", "apnsUnavailable", "operator"] {
            Gauge(label: "isle_apps_paused", dimensions: [("cause", cause)], factory: factory).record(counts[cause] ?? 0)
        }
    }

    /// SQL statements sent to the database so far (``StoreStatements``), counted when scraped.
    func storeStatements(_ total: Int) {
        let delta = statementsSeen.withLock { seen -> Int in
            defer { seen = max(seen, total) }
            return max(0, total - seen)
        }
        if delta > 0 { counter("isle_store_statements_total", []).increment(by: delta) }
    }

    /// The Prometheus text exposition.
    public func text() -> [UInt8] { registry.emitToBuffer() }
}
