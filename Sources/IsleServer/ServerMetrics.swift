import Foundation
import IsleCore
import IsleStore
public import IsleDelivery
public import Prometheus
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The server's metrics, in a Prometheus registry of its own (not a process-wide bootstrap:
/// several servers may share a process, as in tests), served at `/metrics` (docs/server.md,
/// "Metrics"). Every family has HELP and TYPE (`promtool check metrics` passes, in CI). Labels
/// never carry an id from a request, a token or a key; APNs reasons are Apple's documented set
/// (anything else is `other`); `app` is a bundle id among the first ``AppLabels/limit`` apps seen,
/// then `other`: a peer cannot grow the label space.
public final class ServerMetrics: Sendable {
    public let registry: PrometheusCollectorRegistry
    /// Each family's help text: one place, so a family is never registered twice with two texts.
    static let help: [String: String] = [
        "isle_deliveries_total": "Delivery attempts finished, by app and outcome (sent, retried, failed, dropped; downgraded: sent at priority 5, the priority-10 budget spent).",
        "isle_apns_responses_total": "APNs answers to pushes, by app, HTTP status (0: no answer) and reason (Apple's documented reasons; other; none).",
        "isle_apns_response_seconds": "Time from sending a push to APNs' answer.",
        "isle_time_in_queue_seconds": "Time from a push's acceptance to its delivery.",
        "isle_api_write_seconds": "Time to answer an API write, by status class.",
        "isle_jobs": "Open pushes by state (scheduled: for later; queued: due or waiting behind their lane's head; claimed: being sent), counted at the scrape.",
        "isle_oldest_due_push_age_seconds": "How long the oldest push that is due has waited past its time (0: none waiting), at the scrape: the figure to alert on.",
        "isle_store_statements_total": "SQL statements this process sent to its database.",
        "isle_app_pauses_total": "Apps paused, by cause (configuration: APNs refused the app's set-up; apnsUnavailable: a back-off; operator: by hand).",
        "isle_apps_paused": "Apps whose pushes wait now, by cause, at the scrape.",
        "isle_webhook_failures_total": "Webhook requests that failed (not 2xx, refused, unreachable), by app and webhook id.",
        "isle_webhook_lag_seconds": "Age of the oldest event a webhook has not acknowledged yet (0: caught up), by app and webhook id, at the scrape.",
        "isle_build_info": "The running build: version and commit, as labels; always 1.",
        "isle_priority10_budget": "Priority-10 pushes per rolling hour before Isle sends priority 5, by whose budget it is (per: installation, the app on one phone, all its activities and channels together; or activity) and whether frequent updates are on.",
    ]

    let apps = AppLabels()
    private let apnsTime: DurationHistogram
    private let queueTime: DurationHistogram
    private let counters = Mutex<[String: Counter]>([:])
    private let histograms = Mutex<[String: DurationHistogram]>([:])
    private let gauges = Mutex<[String: Gauge]>([:])
    private let statementsSeen = Mutex<Int>(0)
    static let buckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10),
        .seconds(30), .seconds(60), .seconds(300), .seconds(900), .seconds(3600),
    ]

    public init(version: String = "dev", commit: String = "unknown", budget: (per: BudgetScope, hourly: Int, frequent: Int) = (.installation, 15, 120)) {
        registry = PrometheusCollectorRegistry()
        for (frequent, limit) in [("false", budget.hourly), ("true", budget.frequent)] {
            registry.makeGauge(descriptor: Self.descriptor("isle_priority10_budget"), labels: [("per", budget.per.rawValue), ("frequent", frequent)]).set(Int64(limit))
        }
        apnsTime = registry.makeDurationHistogram(descriptor: Self.descriptor("isle_apns_response_seconds"), labels: [], buckets: Self.buckets)
        queueTime = registry.makeDurationHistogram(descriptor: Self.descriptor("isle_time_in_queue_seconds"), labels: [], buckets: Self.buckets)
        registry.makeGauge(descriptor: Self.descriptor("isle_build_info"), labels: [("version", version), ("commit", commit)]).set(Int64(1))
    }

    static func descriptor(_ name: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help[name] ?? name)
    }

    // Handles are made once per label set and kept: making one takes the registry's lock and
    // builds its labels, which the hot paths (every delivery, every API write) must not pay.
    private func counter(_ name: String, _ labels: [(String, String)]) -> Counter {
        Self.handle(counters, name, labels) { registry.makeCounter(descriptor: Self.descriptor(name), labels: labels) }
    }

    private func gauge(_ name: String, _ labels: [(String, String)]) -> Gauge {
        Self.handle(gauges, name, labels) { registry.makeGauge(descriptor: Self.descriptor(name), labels: labels) }
    }

    private static func handle<H>(_ cache: borrowing Mutex<[String: H]>, _ name: String, _ labels: [(String, String)], make: () -> H) -> H {
        let key = name + labels.map { "|\($0.0)=\($0.1)" }.joined()
        return cache.withLock { c in
            if let existing = c[key] { return existing }
            let made = make()
            c[key] = made
            return made
        }
    }

    /// A finished delivery attempt: sent, retried, failed, dropped, downgraded.
    func delivery(_ outcome: String, app: String) {
        counter("isle_deliveries_total", [("app", apps.label(app)), ("outcome", outcome)]).increment()
    }

    /// APNs' answer to a push (status 0: not reached) and how long it took.
    func apnsResponse(status: Int, reason: String?, milliseconds: Double, app: String) {
        let known = reason.flatMap { APNsReason(rawValue: $0).isKnown ? $0 : "other" } ?? "none"
        counter("isle_apns_responses_total", [("app", apps.label(app)), ("status", String(status)), ("reason", known)]).increment()
        apnsTime.record(.nanoseconds(Int64(saturating: max(0, milliseconds) * 1_000_000)))
    }

    /// From accepted to sent.
    func timeInQueue(_ seconds: TimeInterval) {
        queueTime.record(.nanoseconds(Int64(saturating: max(0, seconds) * 1_000_000_000)))
    }

    /// An API write answered (202/200/201 or an error), and how long it took.
    func accepted(status: Int, duration: Duration) {
        let statusClass = String(status / 100) + "xx"
        let histogram = histograms.withLock { h in
            if let existing = h[statusClass] { return existing }
            let made = registry.makeDurationHistogram(descriptor: Self.descriptor("isle_api_write_seconds"), labels: [("status", statusClass)], buckets: Self.buckets)
            h[statusClass] = made
            return made
        }
        histogram.record(duration)
    }

    /// The open jobs, counted when scraped.
    func openJobs(_ counts: [PushJobState: Int]) {
        for state in [PushJobState.scheduled, .queued, .claimed] {
            gauge("isle_jobs", [("state", state.rawValue)]).set(Int64(counts[state] ?? 0))
        }
    }

    /// How long the oldest due push has waited past its time, at the scrape.
    func oldestDueAge(_ seconds: TimeInterval) {
        gauge("isle_oldest_due_push_age_seconds", []).set(max(0, seconds))
    }

    /// SQL statements sent to the database so far (``StoreStatements``), counted when scraped.
    func storeStatements(_ total: Int) {
        let delta = statementsSeen.withLock { seen -> Int in
            defer { seen = max(seen, total) }
            return max(0, total - seen)
        }
        // Registered at the first scrape even when nothing was sent yet: the family is always there.
        let c = counter("isle_store_statements_total", [])
        if delta > 0 { c.increment(by: Int64(delta)) }
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
            gauge("isle_apps_paused", [("cause", cause)]).set(Int64(counts[cause] ?? 0))
        }
    }

    /// A webhook request that failed.
    func webhookFailed(app: String, webhook: String) {
        counter("isle_webhook_failures_total", [("app", apps.label(app)), ("webhook", webhook)]).increment()
    }

    /// Each webhook's lag, at the scrape; webhooks deleted since the last scrape leave the output.
    func webhookLags(_ lags: [(app: String, webhook: String, seconds: TimeInterval)]) {
        let current = Set(lags.map { "isle_webhook_lag_seconds|app=\(apps.label($0.app))|webhook=\($0.webhook)" })
        let gone = gauges.withLock { g -> [Gauge] in
            let keys = g.keys.filter { $0.hasPrefix("isle_webhook_lag_seconds|") && !current.contains($0) }
            return keys.compactMap { g.removeValue(forKey: $0) }
        }
        for g in gone { registry.unregisterGauge(g) }
        for lag in lags { gauge("isle_webhook_lag_seconds", [("app", apps.label(lag.app)), ("webhook", lag.webhook)]).set(max(0, lag.seconds)) }
    }

    /// The Prometheus text exposition, with the process's own families after the registry's.
    public func text() -> [UInt8] {
        var out = registry.emitToBuffer()
        out += Array(ProcessMetrics.text().utf8)
        return out
    }
}

/// The `app` label's values: a bundle id among the first `limit` seen, `other` after that.
final class AppLabels: Sendable {
    static let limit = 200
    private let seen = Mutex<Set<String>>([])
    func label(_ bundleID: String) -> String {
        seen.withLock { s in
            if s.contains(bundleID) { return bundleID }
            guard s.count < Self.limit else { return "other" }
            s.insert(bundleID)
            return bundleID
        }
    }
}

/// The standard process families (as Prometheus' client libraries name them), read from /proc at
/// the scrape: CPU, memory, file descriptors, start time.
enum ProcessMetrics {
    static func text() -> String {
        var lines: [String] = []
        func family(_ name: String, _ type: String, _ help: String, _ value: Double?) {
            guard let value, value.isFinite else { return }
            lines.append("# HELP \(name) \(help)")
            lines.append("# TYPE \(name) \(type)")
            lines.append("\(name) \(value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value))")
        }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))
        var cpu: Double?, start: Double?, virtual: Double?, resident: Double?
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") {
            // Fields after the command's closing parenthesis: state is field 3; utime 14, stime 15, starttime 22, vsize 23, rss 24.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            func field(_ n: Int) -> Double? { n - 3 < fields.count ? Double(fields[n - 3]) : nil }
            if let u = field(14), let s = field(15), ticks > 0 { cpu = (u + s) / ticks }
            if let st = field(22), ticks > 0, let boot = bootTime() { start = boot + st / ticks }
            virtual = field(23)
            if let pages = field(24) { resident = pages * pageSize }
        }
        family("process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.", cpu)
        family("process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.", resident)
        family("process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.", virtual)
        family("process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch, in seconds.", start)
        family("process_open_fds", "gauge", "Open file descriptors.", (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")).map { Double($0.count) })
        var limit = rlimit()
        family("process_max_fds", "gauge", "The limit of open file descriptors.", getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? Double(limit.rlim_cur) : nil)
        return lines.isEmpty ? "" : lines.joined(separator: "\n") + "\n"
    }

    static func bootTime() -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") { return Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces)) }
        return nil
    }
}
