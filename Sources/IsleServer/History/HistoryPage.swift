import Foundation
import IsleCore
import IsleStore
import IsleDelivery

/// The console's history (`/console/history?range=1h|24h|7d`): deliveries by outcome, APNs
/// latency and time in queue quantiles over time, drawn as SVG by the server (no script, no CDN),
/// and the APNs answers other than 200 by reason with what to do about each.
enum HistoryPage {
    struct Range: Sendable {
        var name: String
        var span: TimeInterval
        var bucket: TimeInterval
        static let all = [Range(name: "1h", span: 3600, bucket: 60), Range(name: "24h", span: 86_400, bucket: 900), Range(name: "7d", span: 7 * 86_400, bucket: 7200)]
        static func named(_ name: String?) -> Range? { all.first { $0.name == (name ?? "1h") } }
    }

    /// The counters of `points` laid out per bucket, from `start` for `count` buckets.
    struct Table {
        var start: Date
        var bucket: TimeInterval
        var count: Int
        var values: [String: [Int64]] = [:]

        init(_ points: [HistoryPoint], start: Date, bucket: TimeInterval, count: Int) {
            self.start = start
            self.bucket = bucket
            self.count = count
            for p in points {
                let i = Int((p.minute.timeIntervalSince(start) / bucket).rounded(.down))
                guard (0..<count).contains(i) else { continue }
                values[p.metric, default: Array(repeating: 0, count: count)][i] += p.count
            }
        }

        func series(_ metric: String) -> [Int64] { values[metric] ?? Array(repeating: 0, count: count) }
        func total(_ metric: String) -> Int64 { series(metric).reduce(0, +) }

        /// A histogram's buckets (`prefix:0`, `prefix:1`, …) in bucket `i`, or over the whole range.
        func histogram(_ prefix: String, bounds: [Double], at i: Int? = nil) -> [Int64] {
            (0...bounds.count).map { b in
                let s = series("\(prefix):\(b)")
                return i.map { s[$0] } ?? s.reduce(0, +)
            }
        }

        func quantiles(_ prefix: String, bounds: [Double], _ q: Double) -> [Double?] {
            (0..<count).map { HistoryMetric.quantile(q, counts: histogram(prefix, bounds: bounds, at: $0), bounds: bounds) }
        }
    }

    static func e(_ s: String) -> String { ConsolePages.e(s) }

    /// `unsent`: the app's jobs superseded and dropped among those accepted in the range (counted
    /// from the jobs themselves: most never reach the delivery engine, whose history counts the rest).
    static func render(_ points: [HistoryPoint], range: Range, now: Date, budget: [(activityID: String, count: Int)], budgetLimit: Int, budgetScope: BudgetScope = .installation, unsent: [PushJobState: Int] = [:]) -> String {
        let count = Int(range.span / range.bucket)
        let end = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / range.bucket).rounded(.down) * range.bucket + range.bucket)
        let start = end.addingTimeInterval(-Double(count) * range.bucket)
        let t = Table(points, start: start, bucket: range.bucket, count: count)
        var h = "<h1>History</h1><nav class=\"ranges\">"
        for r in Range.all {
            h += r.name == range.name ? "<b>\(r.name)</b>" : "<a href=\"/console/history?range=\(r.name)\">\(r.name)</a>"
        }
        h += "</nav>"
        let latencyAll = t.histogram("latency", bounds: HistoryMetric.latencyBounds)
        let queueAll = t.histogram("queue", bounds: HistoryMetric.queueBounds)
        func q(_ v: Double?, _ unit: String) -> String { v.map { "≤ \(plain($0)) \(unit)" } ?? "—" }
        h += "<dl class=\"stats\" id=\"totals\">"
        for (id, label, value) in [("delivered", "Delivered", "\(t.total(HistoryMetric.delivered))"), ("failed", "Failed for good", "\(t.total(HistoryMetric.failed))"),
                                   ("retried", "Retried", "\(t.total(HistoryMetric.retried))"), ("superseded", "Superseded (accepted in range)", "\(unsent[.superseded] ?? 0)"), ("dropped", "Dropped: cancelled or too late (accepted in range)", "\(unsent[.dropped] ?? 0)"),
                                   ("downgraded", "Priority 10 → 5 (budget)", "\(t.total(HistoryMetric.downgraded))"), ("tokens", "Tokens retired", "\(t.total(HistoryMetric.tokenRetired))"),
                                   ("latency-p50", "APNs latency p50", q(HistoryMetric.quantile(0.5, counts: latencyAll, bounds: HistoryMetric.latencyBounds), "ms")),
                                   ("latency-p99", "APNs latency p99", q(HistoryMetric.quantile(0.99, counts: latencyAll, bounds: HistoryMetric.latencyBounds), "ms")),
                                   ("queue-p50", "Time in queue p50", q(HistoryMetric.quantile(0.5, counts: queueAll, bounds: HistoryMetric.queueBounds), "s")),
                                   ("queue-p99", "Time in queue p99", q(HistoryMetric.quantile(0.99, counts: queueAll, bounds: HistoryMetric.queueBounds), "s"))] {
            h += "<div><dt>\(label)</dt><dd id=\"total-\(id)\">\(e(value))</dd></div>"
        }
        h += "</dl>"
        func d(_ s: [Int64]) -> [Double?] { s.map { Double($0) } }
        h += "<h2>Deliveries per \(duration(range.bucket))</h2>" + chart(id: "chart-deliveries", [
            ("delivered", "#1e8449", d(t.series(HistoryMetric.delivered))), ("failed", "#c0392b", d(t.series(HistoryMetric.failed))),
            ("retried", "#d68910", d(t.series(HistoryMetric.retried))),
        ], start: start, bucket: range.bucket, unit: "")
        h += "<h2>APNs latency</h2>" + chart(id: "chart-latency", [
            ("p50", "#0a84ff", t.quantiles("latency", bounds: HistoryMetric.latencyBounds, 0.5)), ("p99", "#8e44ad", t.quantiles("latency", bounds: HistoryMetric.latencyBounds, 0.99)),
        ], start: start, bucket: range.bucket, unit: "ms")
        h += "<h2>Time in queue</h2>" + chart(id: "chart-queue", [
            ("p50", "#0a84ff", t.quantiles("queue", bounds: HistoryMetric.queueBounds, 0.5)), ("p99", "#8e44ad", t.quantiles("queue", bounds: HistoryMetric.queueBounds, 0.99)),
        ], start: start, bucket: range.bucket, unit: "s")

        // Errors by reason, with Isle's advice for each.
        let reasons = t.values.keys.filter { $0.hasPrefix("reason:") || $0.hasPrefix("status:") }.map { ($0, t.total($0)) }.filter { $0.1 > 0 }.sorted { $0.1 > $1.1 }
        h += "<h2>APNs answers other than 200</h2>"
        if reasons.isEmpty { h += "<p class=\"muted\" id=\"no-errors\">None in this range.</p>" } else {
            h += "<table class=\"list\" id=\"reasons\"><thead><tr><th>Answer</th><th>Count</th><th>What it means, what to do</th></tr></thead><tbody>"
            for (key, n) in reasons {
                let text: String
                let label: String
                if key.hasPrefix("reason:") {
                    let reason = APNsReason(String(key.dropFirst("reason:".count)))
                    label = reason.rawValue
                    text = reason.explanation(status: reason.info?.status ?? 400)
                } else {
                    let status = Int(key.dropFirst("status:".count)) ?? 0
                    label = status == 0 ? "no answer" : "HTTP \(status)"
                    text = status == 0 ? "APNs could not be reached (connection, TLS or timeout). Isle retries with backoff; check the network and the APNs host." : APNsReason.advice(APNsReason.remedy(forStatus: status))
                }
                h += "<tr><td class=\"reason\"><code>\(e(label))</code></td><td>\(n)</td><td>\(e(text))</td></tr>"
            }
            h += "</tbody></table>"
        }
        h += "<h2>Priority-10 budget, last hour</h2>"
        if budget.isEmpty { h += "<p class=\"muted\" id=\"budget-empty\">No priority-10 push in the last hour.</p>" } else {
            let total = budget.reduce(0) { $0 + $1.count }
            let whose = budgetScope == .installation
                ? "Isle counts the budget for the app on each phone, all its activities (and channels) together, as a phone may (isle serve --budget-per installation, the default): each activity's page shows its phone's count"
                : "Isle counts the budget for each activity alone (isle serve --budget-per activity); a phone that counts it per app throttles the app's activities together once they reach it"
            h += "<p id=\"budget-total\">\(total) priority-10 pushes to \(budget.count) activities, \(budgetLimit) an hour allowed (more with NSSupportsLiveActivitiesFrequentUpdates), after which Isle sends priority 5. \(whose).</p>"
            h += "<table class=\"list\" id=\"budget\"><thead><tr><th>Activity</th><th>Priority 10 in the last hour</th></tr></thead><tbody>"
            for b in budget.prefix(20) {
                h += "<tr><td><a href=\"/console/activities/\(e(b.activityID))\">\(e(b.activityID))</a></td><td>\(b.count) of \(budgetLimit)</td></tr>"
            }
            h += "</tbody></table>"
        }
        return h
    }

    static func plain(_ v: Double) -> String { v == v.rounded() ? String(Int(v)) : String(format: "%g", v) }

    static func duration(_ s: TimeInterval) -> String { s < 3600 ? "\(Int(s / 60)) min" : "\(plain(s / 3600)) h" }

    /// A line chart as inline SVG: one polyline per series (broken where a value is missing), a
    /// zero line and a top line with their values, the first, middle and last times, a legend.
    static func chart(id: String, _ series: [(name: String, color: String, values: [Double?])], start: Date, bucket: TimeInterval, unit: String) -> String {
        let w = 720.0, hgt = 180.0, left = 56.0, right = 12.0, top = 12.0, bottom = 26.0
        let n = series.first?.values.count ?? 0
        let maxValue = series.flatMap { $0.values.compactMap { $0 } }.max() ?? 0
        let top_ = niceCeiling(maxValue)
        func x(_ i: Int) -> Double { left + (n <= 1 ? 0 : Double(i) / Double(n - 1) * (w - left - right)) }
        func y(_ v: Double) -> Double { top + (hgt - top - bottom) * (1 - (top_ == 0 ? 0 : v / top_)) }
        var s = "<figure class=\"chart\"><svg id=\"\(id)\" viewBox=\"0 0 \(Int(w)) \(Int(hgt))\" role=\"img\" aria-label=\"\(e(series.map(\.name).joined(separator: ", "))) per \(e(duration(bucket)))\">"
        s += "<line x1=\"\(left)\" y1=\"\(y(0))\" x2=\"\(w - right)\" y2=\"\(y(0))\" class=\"axis\"/><line x1=\"\(left)\" y1=\"\(y(top_))\" x2=\"\(w - right)\" y2=\"\(y(top_))\" class=\"grid\"/>"
        s += "<text x=\"\(left - 6)\" y=\"\(y(0) + 4)\" text-anchor=\"end\">0</text><text x=\"\(left - 6)\" y=\"\(y(top_) + 4)\" text-anchor=\"end\">\(e(plain(top_)))\(unit.isEmpty ? "" : " " + unit)</text>"
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = bucket >= 3600 ? "MM-dd HH:mm" : "HH:mm"
        if n > 0 {
            for (i, anchor) in [(0, "start"), (n / 2, "middle"), (n - 1, "end")] {
                s += "<text x=\"\(x(i))\" y=\"\(hgt - 8)\" text-anchor=\"\(anchor)\">\(formatter.string(from: start.addingTimeInterval(Double(i) * bucket)))</text>"
            }
        }
        for (index, (name, color, values)) in series.enumerated() {
            // Series that share a line (several at zero) stay visible: the first drawn is the widest,
            // each later one narrower and dashed on top of it.
            let width = 2 + 1.5 * Double(series.count - 1 - index)
            let dash = index == 0 ? "" : " stroke-dasharray=\"\(4 + 2 * index) 3\""
            var segment: [String] = []
            func flush() {
                if segment.count == 1 { s += "<circle cx=\"\(segment[0].split(separator: ",")[0])\" cy=\"\(segment[0].split(separator: ",")[1])\" r=\"\(plain(width))\" fill=\"\(color)\"/>" }
                if segment.count > 1 { s += "<polyline class=\"series\" data-series=\"\(e(name))\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"\(plain(width))\" stroke-linejoin=\"round\"\(dash) points=\"\(segment.joined(separator: " "))\"/>" }
                segment = []
            }
            for (i, v) in values.enumerated() {
                if let v { segment.append(String(format: "%.1f,%.1f", x(i), y(v))) } else { flush() }
            }
            flush()
        }
        s += "</svg><figcaption>"
        for (name, color, values) in series {
            let known = values.compactMap { $0 }
            let last: Double? = known.last
            // Counts say their total over the range too: a series hidden under another still reads.
            let total = unit.isEmpty ? ", total \(plain(known.reduce(0, +)))" : ""
            s += "<span class=\"key\"><i style=\"background:\(color)\"></i>\(e(name))\(last.map { " (latest \(plain($0))\(unit.isEmpty ? "" : " " + unit)\(total))" } ?? "")</span>"
        }
        return s + "</figcaption></figure>"
    }

    /// 1, 2, 5 × 10ⁿ at or above `v` (0 for 0).
    static func niceCeiling(_ v: Double) -> Double {
        guard v > 0 else { return 0 }
        let p = pow(10, (log10(v)).rounded(.down))
        for m in [1.0, 2, 5, 10] where m * p >= v { return m * p }
        return 10 * p
    }
}
