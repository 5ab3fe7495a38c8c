public import Foundation

/// SwiftUI's dynamic date text styles, rendered the way a Live Activity or widget shows them
/// (docs/protocol.md §9.3; docs/protocol.md, WidgetKit): one formatter for the simulator, the demo
/// and anything that shows what a phone would show. Locale `en_US`; times in the given time zone.
public enum DateText {
    public enum Style: String, Sendable, CaseIterable {
        /// Counts down to a future date, then up after it: "15:00", "2:32", "36:59:01".
        case timer
        /// The distance, without sign: "11 min, 14 sec", "2 hr, 23 min".
        case relative
        /// The distance with a sign: "-11 min" (future), "+2 hr" (past).
        case offset
        /// "9:41 AM"
        case time
        /// "April 1, 2020"
        case date
    }

    public static func text(_ date: Date, style: Style, now: Date, timeZone: TimeZone = TimeZone(identifier: "UTC")!) -> String {
        switch style {
        case .timer: return timer(abs(date.timeIntervalSince(now)))
        case .relative: return relative(abs(date.timeIntervalSince(now)))
        case .offset:
            let d = now.timeIntervalSince(date)
            return (d >= 0 ? "+" : "-") + relative(abs(d), short: true)
        case .time: return formatted(date, "h:mm a", timeZone)
        case .date: return formatted(date, "MMMM d, yyyy", timeZone)
        }
    }

    /// `Text(start...end)`: "9:30 AM – 2:45 PM".
    public static func range(_ range: ClosedRange<Date>, timeZone: TimeZone = TimeZone(identifier: "UTC")!) -> String {
        "\(formatted(range.lowerBound, "h:mm a", timeZone)) – \(formatted(range.upperBound, "h:mm a", timeZone))"
    }

    /// `Text(timerInterval:countsDown:)`: counts down to the upper bound (or up from the lower),
    /// clamped to the interval.
    public static func timerInterval(_ range: ClosedRange<Date>, countsDown: Bool = true, now: Date) -> String {
        let clamped = min(max(now, range.lowerBound), range.upperBound)
        return timer(countsDown ? range.upperBound.timeIntervalSince(clamped) : clamped.timeIntervalSince(range.lowerBound))
    }

    static func timer(_ seconds: TimeInterval) -> String {
        let s = Int(seconds.rounded(.down))
        let h = s / 3600, m = s % 3600 / 60, sec = s % 60
        return h > 0 ? String(format: "%d:%02d:%02d", h, m, sec) : String(format: "%d:%02d", m, sec)
    }

    static func relative(_ seconds: TimeInterval, short: Bool = false) -> String {
        let s = Int(seconds.rounded(.down))
        let d = s / 86400, h = s % 86400 / 3600, m = s % 3600 / 60, sec = s % 60
        if short {
            if d > 0 { return "\(d) day\(d == 1 ? "" : "s")" }
            if h > 0 { return "\(h) hr" }
            if m > 0 { return "\(m) min" }
            return "\(sec) sec"
        }
        if d > 0 { return "\(d) day\(d == 1 ? "" : "s"), \(h) hr" }
        if h > 0 { return "\(h) hr, \(m) min" }
        if m > 0 { return "\(m) min, \(sec) sec" }
        return "\(sec) sec"
    }

    static func formatted(_ date: Date, _ format: String, _ tz: TimeZone) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = tz
        f.dateFormat = format
        return f.string(from: date)
    }
}
