import Foundation
import IsleCore

/// What the person running `isle demo` sees: a readable step-by-step view, or JSON lines
/// (`--json`), one object per event, each with a `type`.
final class DemoView: Sendable {
    let json: Bool
    let out: @Sendable (String) -> Void
    static let width = 76

    init(json: Bool, out: @escaping @Sendable (String) -> Void) {
        self.json = json
        self.out = out
    }

    func emit(_ type: String, _ fields: JSONObject) {
        var o: JSONObject = ["type": .string(type)]
        for (k, v) in fields { o[k] = v }
        out(JSONValue.object(o).jsonString)
    }

    func heading(_ n: Int, _ title: String, now: Date) {
        if json { return emit("step", ["step": .int(n), "title": .string(title), "time": .int(Int64(now.timeIntervalSince1970))]) }
        let clock = DateText.text(now, style: .time, now: now) + " UTC (virtual)"
        let head = n == 0 ? "━━ \(title) " : "━━ Step \(n) · \(title) "
        let fill = max(2, Self.width - head.count - clock.count - 1)
        out("")
        out(head + String(repeating: "━", count: fill) + " " + clock)
    }

    func request(actor: String, method: String, path: String, status: Int, says: String, channel: String) {
        if json { return emit("request", ["actor": .string(actor), "to": .string(channel), "method": .string(method), "path": .string(path), "status": .int(status), "says": .string(says)]) }
        let who = "\(actor) → \(channel == "isle" ? "Isle" : "phone")"
        out("  \(who.padding(toLength: 17, withPad: " ", startingAt: 0)) \(says)")
        out("  \(String(repeating: " ", count: 17)) \(method) \(path) → \(status)")
    }

    /// The app calling ActivityKit on the phone (the simulator's `SimulatedActivityKit`).
    func activityKit(_ call: String, says: String) {
        if json { return emit("activityKit", ["call": .string(call), "says": .string(says)]) }
        out("  \("app (ActivityKit)".padding(toLength: 17, withPad: " ", startingAt: 0)) \(says)")
        out("  \(String(repeating: " ", count: 17)) \(call)")
    }

    /// A request IsleClient made on its own: what the app's SDK handed to the server.
    func sdk(report: String, method: String, path: String, status: Int?, outcome: String) {
        if json {
            return emit("sdk", ["report": .string(report), "method": .string(method), "path": .string(Self.redactedPath(path)), "status": status.map { .int(Int64($0)) } ?? .null,
                                "outcome": .string(outcome)])
        }
        let what = switch report {
        case "installation": "reports the installation: push-to-start token, widget token, settings, sandbox"
        case "register" where status == 200: "hands a push-started activity's token over: the server links its starting record"
        case "register": "hands a new activity's update token to the server"
        case "token": "hands a rotated update token to the server"
        case "dismissed": "reports that the activity was dismissed"
        case "ended": "reports that the activity ended"
        default: report
        }
        out("  \("app (IsleClient)".padding(toLength: 17, withPad: " ", startingAt: 0)) \(what)")
        out("  \(String(repeating: " ", count: 17)) \(method) \(Self.redactedPath(path)) → \(status.map(String.init) ?? "no answer")\(outcome == "sent" ? "" : " (\(outcome))")")
    }

    func wire(_ w: WireRecord, compact: String?) {
        if json {
            var f: JSONObject = ["pushType": .string(w.pushType), "priority": .int(w.priority), "apnsID": .string(w.apnsID), "status": .int(w.status), "path": .string(Self.redactedPath(w.path))]
            if let r = w.reason { f["reason"] = .string(r) }
            if let o = w.outcome { f["outcome"] = .string(o) }
            if let s = w.sentence { f["sentence"] = .string(s) }
            if let e = w.event { f["event"] = .string(e) }
            return emit("wire", f)
        }
        let answer = w.status == 200 ? "200" : "\(w.status) \(w.reason ?? "")"
        let line = "\(w.pushType)\(w.event.map { " \($0)" } ?? "") · priority \(w.priority) · apns-id \(w.apnsID.prefix(8))… → \(answer)"
        if let compact {
            out("  Isle → APNs  \(compact.padding(toLength: 5, withPad: " ", startingAt: 0)) \(line) · phone: \(Self.outcomeText(w.outcome))")
            return
        }
        out("  Isle → APNs       \(line)")
        if let o = w.outcome { out("  phone             \(Self.outcomeText(o)): \(w.sentence ?? "")") }
    }

    func deviceEvent(source: String, outcome: String?, message: String) {
        if json {
            var f: JSONObject = ["source": .string(source), "message": .string(message)]
            if let outcome { f["outcome"] = .string(outcome) }
            return emit("device", f)
        }
        out("  phone (\(source))".padding(toLength: 20, withPad: " ", startingAt: 0) + message)
    }

    func time(_ seconds: TimeInterval, _ why: String) {
        if json { return emit("time", ["advance": .double(seconds), "why": .string(why)]) }
        out("  ⏩ +\(Self.duration(seconds))".padding(toLength: 20, withPad: " ", startingAt: 0) + why)
    }

    func note(_ text: String) {
        if json { return emit("note", ["text": .string(text)]) }
        out("  " + text)
    }

    func check(ok: Bool, _ expectation: String, found: String?) {
        if json {
            var f: JSONObject = ["ok": .bool(ok), "expectation": .string(expectation)]
            if let found { f["found"] = .string(found) }
            return emit("check", f)
        }
        out(ok ? "  ✓ \(expectation)" : "  ✗ \(expectation) — found: \(found ?? "nothing")")
    }

    func prompt() {
        if !json { out("  (press Enter for the next step)") }
    }

    func finish(steps: Int, metrics: String) {
        // `isle_deliveries_total{app="…",outcome="sent"} 27` → ("sent", 27), summed over apps.
        var counts: [(String, Int)] = []
        for line in metrics.split(separator: "\n") where line.hasPrefix("isle_deliveries_total{") {
            guard let start = line.range(of: "outcome=\"")?.upperBound, let end = line[start...].firstIndex(of: "\""),
                  let n = Int(line.split(separator: " ").last ?? "") else { continue }
            let outcome = String(line[start..<end])
            if let i = counts.firstIndex(where: { $0.0 == outcome }) { counts[i].1 += n } else { counts.append((outcome, n)) }
        }
        if json { return emit("done", ["steps": .int(steps), "ok": true, "deliveries": .object(JSONObject(counts.map { ($0.0, JSONValue.int($0.1)) }))]) }
        out("")
        out("All \(steps) steps reached the expected state on the phone.")
        out("The server's /metrics: " + counts.map { "\($0.1) \($0.0)" }.joined(separator: ", ") + ".")
    }

    // MARK: The phone

    func screen(_ s: ScreenView) {
        if json {
            let items: [JSONValue] = s.lockScreen.map { i in
                ["order": .string(i.order), "driver": .string(i.driver), "state": .string(i.state), "isStale": .bool(i.isStale), "relevanceScore": .double(i.relevance),
                 "text": .array(Self.lines(i, now: s.time).map(JSONValue.string))]
            }
            return emit("screen", ["time": .int(Int64(s.time.timeIntervalSince1970)), "lockScreen": .array(items), "dynamicIsland": .string(s.dynamicIsland.rawValue),
                                   "widgets": .array(s.widgets.map { ["kind": .string($0.kind), "pizza": $0.pizza.map(JSONValue.string) ?? .null, "reloads": .int($0.reloads)] })])
        }
        let inner = Self.width - 6
        let title = " Lock Screen "
        let island = " Dynamic Island: \(s.dynamicIsland.rawValue) "
        out("  ┌" + title + String(repeating: "─", count: max(1, inner - title.count - island.count)) + island + "┐")
        if s.lockScreen.isEmpty { out("  │ " + "(no Live Activities)".padding(toLength: inner - 2, withPad: " ", startingAt: 0) + " │") }
        for (n, i) in s.lockScreen.enumerated() {
            if n > 0 { out("  ├" + String(repeating: "─", count: inner) + "┤") }
            for l in Self.lines(i, now: s.time) { out("  │ " + Self.fit(l, inner - 2) + " │") }
        }
        out("  └" + String(repeating: "─", count: inner) + "┘")
        for w in s.widgets { out("  Widget \"\(w.kind)\": \(w.pizza ?? "(no entry)") · reloaded \(w.reloads)×") }
    }

    /// An activity as the pizza app's Lock Screen view draws it.
    static func lines(_ i: ScreenView.Item, now: Date) -> [String] {
        var tag = i.state == "ended" ? "Delivered" : i.isStale ? "⚠ stale — may be out of date" : ""
        if i.relevance != 0 { tag += (tag.isEmpty ? "" : " · ") + "relevance \(Int(i.relevance))" }
        var first = "Order #\(i.order) · \(i.pizzas) pizza\(i.pizzas == 1 ? "" : "s") · \(i.total)"
        if !tag.isEmpty { first += "   [\(tag)]" }
        var result = [first]
        if let lo = i.deliveryStart, let hi = i.deliveryEnd, lo <= hi {
            let range = Date(timeIntervalSinceReferenceDate: Double(lo))...Date(timeIntervalSinceReferenceDate: Double(hi))
            let timer = DateText.timerInterval(range, now: now)
            if i.state == "ended" {
                result.append("\(i.driver) delivered it · \(timer)")
            } else {
                let eta = range.upperBound > now ? "arrives in \(DateText.text(range.upperBound, style: .relative, now: now))" : "due now"
                result.append("\(i.driver) is on the way · \(timer) · \(eta)")
            }
            result.append("Delivery window \(DateText.range(range))")
        } else {
            result.append(i.driver)
        }
        if let a = i.alertTitle { result.append("Last alert: \(a)") }
        return result
    }

    static func fit(_ s: String, _ n: Int) -> String {
        s.count > n ? String(s.prefix(n - 1)) + "…" : s.padding(toLength: n, withPad: " ", startingAt: 0)
    }

    static func outcomeText(_ code: String?) -> String {
        switch code {
        case nil: "no outcome"
        case "olderTimestamp"?: "ignored: older timestamp"
        case "deferredLowPriority"?: "deferred (priority 5)"
        case "widgetsReloaded"?: "widgets reloaded"
        case let c?: c.replacingOccurrences(of: "([a-z])([A-Z])", with: "$1 $2", options: .regularExpression).lowercased()
        }
    }

    static func duration(_ s: TimeInterval) -> String {
        s >= 60 ? "\(Int(s / 60)) min" + (Int(s) % 60 > 0 ? " \(Int(s) % 60) s" : "") : "\(Int(s)) s"
    }

    /// `/3/device/<token>` → `/3/device/1a2b3c4d…`: the demo never prints whole tokens.
    static func redactedPath(_ p: String) -> String {
        guard let slash = p.lastIndex(of: "/") else { return p }
        let tail = p[p.index(after: slash)...]
        return tail.count > 16 ? p[...slash] + tail.prefix(8) + "…" : p
    }

    static func short(_ token: String) -> String { token.count > 12 ? token.prefix(8) + "…" : token }
}
