import Foundation
import IsleCore

/// ActivityKit's rules for one activity, as pure functions of (activity, app, configuration, time).
/// Time-based transitions (stale, the 8-hour end, dismissal, deferred updates) are applied lazily
/// by ``advance(_:app:to:events:)`` in the order they happened, so a virtual clock can jump.
struct ActivityEngine {
    let configuration: SimulatorConfiguration

    func budget(for app: SimulatedApp) -> Int {
        app.frequentUpdatesActive ? configuration.frequentHourlyBudget : configuration.hourlyBudget
    }

    // MARK: Receiving a push

    /// A `liveactivity` push that arrived on the activity's update token or its channel.
    /// `appBudget`: the app's log of priority-10 pushes (used when the budget is the app's,
    /// ``SimulatorConfiguration/budgetPerApp``; otherwise the activity keeps its own).
    func receive(_ payload: JSONValue, priority: Int, apnsID: String?, activity a: inout SimulatedActivity, app: SimulatedApp, appBudget: inout [Date], now: Date,
                 events: inout [DeviceEvent], random: inout SeededRandom) -> PushOutcome {
        advance(&a, app: app, appBudget: &appBudget, to: now, events: &events)
        let outcome = judgeAndApply(payload, priority: priority, apnsID: apnsID, activity: &a, app: app, appBudget: &appBudget, now: now, events: &events, random: &random)
        events.append(DeviceEvent(time: now, source: .push, activityID: a.id, apnsID: apnsID, outcome: outcome, message: outcome.sentence))
        return outcome
    }

    private func judgeAndApply(_ payload: JSONValue, priority: Int, apnsID: String?, activity a: inout SimulatedActivity, app: SimulatedApp, appBudget: inout [Date], now: Date,
                               events: inout [DeviceEvent], random: inout SeededRandom) -> PushOutcome {
        if !a.state.isOngoing {
            let when = a.endedAt.map { " at \(Clock.text($0))" } ?? ""
            return PushOutcome(.activityEnded, "Ignored: the activity ended\(when); ActivityKit ignores pushes after the end.")
        }
        guard let aps = payload["aps"]?.objectValue else {
            return PushOutcome(.decodingFailed, "Dropped: the payload has no aps dictionary.", field: "aps", expected: "an object", found: "nothing")
        }
        let event = aps["event"]?.stringValue
        guard event == "update" || event == "end" else {
            return PushOutcome(.notDelivered, "Ignored: an activity's token takes update or end events, not \(event.map { "\"\($0)\"" } ?? "a push without event").")
        }
        if let problem = checkTimestamp(aps, last: a.lastTimestamp) { return problem }
        if let problem = decode(aps["content-state"], required: event == "update", attributesType: a.attributesType, app: app) { return problem }
        let stateSize = aps["content-state"]?.jsonBytes.count ?? a.contentState.jsonBytes.count
        if stateSize + a.attributes.jsonBytes.count > configuration.maximumActivityDataSize {
            return PushOutcome(.tooLarge, "Dropped: content-state and attributes together are \(stateSize + a.attributes.jsonBytes.count) bytes; ActivityKit allows \(configuration.maximumActivityDataSize).")
        }
        // "In some cases, not delivered" (Apple, apns-priority): a seeded share of priority 5 is lost.
        if priority < 10, configuration.lowPriorityLossProbability > 0, Double.random(in: 0..<1, using: &random) < configuration.lowPriorityLossProbability {
            return PushOutcome(.lostLowPriority, "Not delivered: APNs delivers priority \(priority) opportunistically and, in some cases, not at all (Apple, apns-priority); this one never reached the device (seeded, docs/simulator.md). Send what must arrive at priority 10, and keep state a later push can correct.")
        }
        if priority >= 10 {
            let perApp = configuration.budgetPerApp
            var log = perApp ? appBudget : a.budgetLog
            defer { if perApp { appBudget = log } else { a.budgetLog = log } }
            log.removeAll { now.timeIntervalSince($0) >= 3600 }
            let limit = budget(for: app)
            if log.count >= limit {
                let freeAt = log[0].addingTimeInterval(3600)
                let replaced = a.deferred != nil ? " (replacing an older deferred update)" : ""
                a.deferred = PendingUpdate(payload: payload, applyAt: freeAt, apnsID: apnsID, receivedAt: now)
                let whose = perApp ? "\(app.bundleID) (all its activities together)" : "this activity"
                return PushOutcome(.throttled, "Throttled: \(whose) already had \(limit) priority-10 pushes in the last hour\(app.frequentUpdatesActive ? "" : " (frequent updates off)"); the device keeps the newest and applies it at \(Clock.text(freeAt))\(replaced). Send routine updates with priority 5.")
            }
            log.append(now)
        } else if configuration.lowPriorityDelay > 0 || configuration.lowPriorityDelayMaximum != nil {
            var delay = configuration.lowPriorityDelay
            if let maximum = configuration.lowPriorityDelayMaximum, maximum > delay { delay = Double.random(in: delay...maximum, using: &random) }
            let at = now.addingTimeInterval(delay)
            a.lowPriorityQueue.append(PendingUpdate(payload: payload, applyAt: at, apnsID: apnsID, receivedAt: now))
            return PushOutcome(.deferredLowPriority, "Deferred: priority 5 is delivered opportunistically; the device applies it at \(Clock.text(at)).")
        }
        var applied = apply(aps, activity: &a, app: app, at: now)
        if let t = Self.apsDate(aps["timestamp"])?.timeIntervalSince1970, t > 1e11 {
            applied.sentence += " Flagged: timestamp \(aps["timestamp"]!.briefDescription) looks like milliseconds: every later update in seconds will be ignored as older."
            applied.code = .flagged
        }
        return flagged(applied, aps["content-state"], attributesType: a.attributesType, app: app)
    }

    /// A top-level `aps` date (`timestamp`, `stale-date`, `dismissal-date`): Apple documents a
    /// number of Unix seconds, and the device takes any finite one ≥ 0 — `1767225600`,
    /// `1767225600.0` and `1.7672256e9` alike, a fraction kept (docs/protocol.md, Wire; the
    /// validator warns about fractions, docs/simulator.md).
    static func apsDate(_ value: JSONValue?) -> Date? {
        guard let d = value?.numberValue?.doubleValue, d.isFinite, d >= 0 else { return nil }
        return Date(timeIntervalSince1970: d)
    }

    /// Adds what decoded but probably shows wrong: Unix time in a Date field (31 years late).
    func flagged(_ outcome: PushOutcome, _ state: JSONValue?, attributesType: String, app: SimulatedApp) -> PushOutcome {
        guard let state, let schema = app.schemas[attributesType] else { return outcome }
        let late = schema.contentState.decode(state, path: "content-state").notices.filter { $0.kind == .unixTimeInDateField }
        guard let first = late.first, let v = first.value.numberValue?.doubleValue else { return outcome }
        var o = outcome
        let shown = Date(timeIntervalSinceReferenceDate: v)
        o.code = .flagged
        o.sentence += " Flagged: \(first.path) = \(first.value.briefDescription) decodes as \(Clock.text(shown)), about 31 years late — it looks like Unix time; send \(Int64(saturating: v - ActivityKitEncoding.referenceDateOffset))."
        o.field = first.path
        o.expected = "seconds since 2001-01-01"
        o.found = "Unix time \(first.value.briefDescription)"
        return o
    }

    /// The ordering rule (docs/protocol.md, Isle's decisions): older than the last applied → ignored; equal → applied
    /// unless `strictTimestamps`.
    func checkTimestamp(_ aps: JSONObject, last: Date?) -> PushOutcome? {
        guard let ts = Self.apsDate(aps["timestamp"]) else {
            return PushOutcome(.decodingFailed, "Dropped: timestamp is missing or not a number of Unix seconds.", field: "timestamp", expected: "Unix seconds (a number)",
                               found: aps["timestamp"]?.briefDescription ?? "nothing")
        }
        let shown = aps["timestamp"]!.briefDescription
        if let last {
            if ts < last {
                return PushOutcome(.olderTimestamp, "Ignored: timestamp \(shown) is older than the last applied update (\(Self.seconds(last))).")
            }
            if ts == last, configuration.strictTimestamps {
                return PushOutcome(.olderTimestamp, "Ignored: timestamp \(shown) equals the last applied update's (strict timestamps).")
            }
        }
        return nil
    }

    /// Unix seconds as text, the fraction only when there is one.
    static func seconds(_ d: Date) -> String {
        let t = d.timeIntervalSince1970
        if t == t.rounded(), let whole = Int64(exactly: t) { return String(whole) }
        return String(t)
    }

    func decode(_ state: JSONValue?, required: Bool, attributesType: String, app: SimulatedApp) -> PushOutcome? {
        guard let state else {
            return required ? PushOutcome(.decodingFailed, "Dropped: the update has no content-state.", field: "content-state", expected: "an object", found: "nothing") : nil
        }
        guard let schema = app.schemas[attributesType] else { return nil }
        let result = schema.contentState.decode(state, path: "content-state")
        if let m = result.mismatches.first {
            return PushOutcome(.decodingFailed, "Dropped: Unable to decode content state: \(m.path) expected \(m.expected), found \(m.found). APNs answered 200, nothing changed.",
                               field: m.path, expected: m.expected, found: m.found)
        }
        return nil
    }

    /// Applies an accepted update or end at time `t`.
    func apply(_ aps: JSONObject, activity a: inout SimulatedActivity, app: SimulatedApp, at t: Date) -> PushOutcome {
        if let ts = Self.apsDate(aps["timestamp"]) { a.lastTimestamp = ts }
        if let state = aps["content-state"] { a.contentState = state }
        if let score = aps["relevance-score"]?.numberValue?.doubleValue { a.relevanceScore = score }
        a.staleDate = Self.apsDate(aps["stale-date"])
        if let alert = aps["alert"]?.objectValue {
            a.lastAlert = Localizer.resolve(alert, table: app.localization, at: t)
        }
        let alerted = aps["alert"] != nil ? " with an alert" : ""
        if aps["event"]?.stringValue == "end" {
            a.state = .ended
            a.endedAt = t
            a.deferred = nil
            a.lowPriorityQueue.removeAll()
            if let d = Self.apsDate(aps["dismissal-date"]) {
                if d <= t {
                    dismiss(&a, at: t)
                    return PushOutcome(.ended, "Ended\(alerted) and removed at once (dismissal-date in the past).")
                }
                a.scheduledDismissal = min(d, t.addingTimeInterval(configuration.maximumEndedDuration))
                return PushOutcome(.ended, "Ended\(alerted); leaves the Lock Screen at \(Clock.text(a.scheduledDismissal!)).")
            }
            a.scheduledDismissal = t.addingTimeInterval(configuration.maximumEndedDuration)
            return PushOutcome(.ended, "Ended\(alerted); stays on the Lock Screen up to \(Int(configuration.maximumEndedDuration / 3600)) h (default dismissal).")
        }
        if let stale = a.staleDate, stale <= t, a.state != .pending {
            a.state = .stale
            return PushOutcome(.applied, "Applied\(alerted); its stale-date has passed, so it shows as stale.")
        }
        if a.state == .pending { return PushOutcome(.applied, "Applied\(alerted) to the scheduled activity; it starts at \(Clock.text(a.startedAt)).") }
        let wasStale = a.state == .stale
        a.state = .active
        return PushOutcome(.applied, "Applied\(alerted)\(wasStale ? "; no longer stale" : "").")
    }

    func dismiss(_ a: inout SimulatedActivity, at t: Date) {
        if a.endedAt == nil { a.endedAt = t }
        a.state = .dismissed
        a.dismissedAt = t
        a.scheduledDismissal = nil
        a.deferred = nil
        a.lowPriorityQueue.removeAll()
    }

    // MARK: Time

    /// Applies every time-based transition up to `now`, earliest first.
    func advance(_ a: inout SimulatedActivity, app: SimulatedApp, appBudget: inout [Date], to now: Date, events: inout [DeviceEvent]) {
        while true {
            var next: (Date, Int)?
            func consider(_ d: Date?, _ kind: Int) {
                guard let d, d <= now else { return }
                if next == nil || d < next!.0 { next = (d, kind) }
            }
            if a.state == .pending { consider(a.startedAt, 5) }
            if a.state.isOngoing {
                consider(a.deferred?.applyAt, 0)
                consider(a.lowPriorityQueue.map(\.applyAt).min(), 1)
                if a.state == .active { consider(a.staleDate, 2) }
                consider(a.startedAt.addingTimeInterval(configuration.maximumActiveDuration), 3)
            }
            if a.state == .ended { consider(a.scheduledDismissal, 4) }
            guard let (t, kind) = next else { return }
            switch kind {
            case 0:
                let pending = a.deferred!
                a.deferred = nil
                applyPending(pending, activity: &a, app: app, at: t, events: &events, why: "deferred by the budget")
                if configuration.budgetPerApp {
                    appBudget.removeAll { t.timeIntervalSince($0) >= 3600 }
                    appBudget.append(t)
                } else {
                    a.budgetLog.removeAll { t.timeIntervalSince($0) >= 3600 }
                    a.budgetLog.append(t)
                }
            case 1:
                let i = a.lowPriorityQueue.indices.min { a.lowPriorityQueue[$0].applyAt < a.lowPriorityQueue[$1].applyAt }!
                let pending = a.lowPriorityQueue.remove(at: i)
                applyPending(pending, activity: &a, app: app, at: t, events: &events, why: "priority 5, delivered opportunistically")
            case 2:
                a.state = .stale
                events.append(DeviceEvent(time: t, source: .system, activityID: a.id, message: "The stale-date passed: the activity shows as stale."))
            case 3:
                a.state = .ended
                a.endedAt = t
                a.deferred = nil
                a.lowPriorityQueue.removeAll()
                a.scheduledDismissal = t.addingTimeInterval(configuration.maximumEndedDuration)
                events.append(DeviceEvent(time: t, source: .system, activityID: a.id, message: "The system ended the activity after \(Int(configuration.maximumActiveDuration / 3600)) hours active; it left the Dynamic Island and stays on the Lock Screen up to \(Int(configuration.maximumEndedDuration / 3600)) more hours."))
            case 5:
                a.state = .active
                if let alert = a.scheduledAlert {
                    a.lastAlert = ShownAlert(title: alert.title, body: alert.body, sound: alert.sound, at: t)
                    a.scheduledAlert = nil
                }
                events.append(DeviceEvent(time: t, source: .system, activityID: a.id, message: "The scheduled activity started\(a.lastAlert?.at == t ? " with its alert: \(a.lastAlert!.title)" : "")."))
            default:
                dismiss(&a, at: t)
                events.append(DeviceEvent(time: t, source: .system, activityID: a.id, message: "The ended activity left the Lock Screen."))
            }
        }
    }

    private func applyPending(_ p: PendingUpdate, activity a: inout SimulatedActivity, app: SimulatedApp, at t: Date, events: inout [DeviceEvent], why: String) {
        guard let aps = p.payload["aps"]?.objectValue else { return }
        let outcome: PushOutcome
        if let problem = checkTimestamp(aps, last: a.lastTimestamp) {
            outcome = problem
        } else {
            let applied = apply(aps, activity: &a, app: app, at: t)
            outcome = PushOutcome(applied.code, "\(applied.sentence.dropLast()) (\(why)).")
        }
        events.append(DeviceEvent(time: t, source: .push, activityID: a.id, apnsID: p.apnsID, outcome: outcome, message: outcome.sentence))
    }
}

/// Resolves alert text through the app's Localizable.strings, the way the device would.
enum Localizer {
    static func resolve(_ alert: JSONObject, table: [String: String], at t: Date) -> ShownAlert {
        ShownAlert(title: text(alert["title"], table), body: text(alert["body"], table), sound: alert["sound"]?.stringValue, at: t)
    }

    static func text(_ value: JSONValue?, _ table: [String: String]) -> String {
        switch value {
        case .string(let s)?: return s
        case .object(let o)?:
            let key = o["loc-key"]?.stringValue ?? ""
            let args = o["loc-args"]?.arrayValue?.compactMap(\.stringValue) ?? []
            return format(table[key] ?? key, args)
        default: return ""
        }
    }

    /// `%@` takes the next argument, `%1$@` a given one, `%%` is a percent sign.
    static func format(_ format: String, _ args: [String]) -> String {
        var out = ""
        var next = 0
        var chars = Array(format)[...]
        while let c = chars.popFirst() {
            guard c == "%" else { out.append(c); continue }
            if chars.first == "%" { chars.removeFirst(); out.append("%"); continue }
            if chars.first == "@" {
                chars.removeFirst()
                out += next < args.count ? args[next] : ""
                next += 1
                continue
            }
            let digits = chars.prefix { $0.isNumber }
            if !digits.isEmpty, chars.dropFirst(digits.count).starts(with: "$@"), let n = Int(String(digits)) {
                chars = chars.dropFirst(digits.count + 2)
                out += n - 1 < args.count && n >= 1 ? args[n - 1] : ""
                continue
            }
            out.append(c)
        }
        return out
    }
}

enum Clock {
    /// `2026-11-28T11:51:34Z`, as `ISO8601DateFormatter` writes it — without making a formatter
    /// (that cost more than the rest of a push) on every push whose sentence names a time.
    static func text(_ d: Date) -> String {
        var seconds = time_t(Int64(saturating: d.timeIntervalSince1970.rounded(.down)))
        var t = tm()
        guard gmtime_r(&seconds, &t) != nil else { return ISO8601DateFormatter().string(from: d) }
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        let year = Int(t.tm_year) + 1900
        let y = year < 1000 ? String(repeating: "0", count: 4 - String(year).count) + String(year) : String(year)
        return "\(y)-\(two(t.tm_mon + 1))-\(two(t.tm_mday))T\(two(t.tm_hour)):\(two(t.tm_min)):\(two(t.tm_sec))Z"
    }
}
