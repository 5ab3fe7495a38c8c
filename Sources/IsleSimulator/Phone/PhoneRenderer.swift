import Foundation
import IsleCore
import IsleHTTPAPI

/// Draws what the person sees on a simulated iPhone as HTML: the Lock Screen with its Live
/// Activities in relevance order (stale and ended looks), the Dynamic Island (compact, minimal,
/// expanded) or the banner of a phone without one, the widgets' current entries, and the event log.
/// One renderer serves the first page and every live update (server-sent events), so escaping
/// happens in one place. Dates that move are `<time>` elements the page's script keeps current.
struct PhoneRenderer {
    let device: SimulatedDevice
    let screen: ScreenState
    let realTime: Bool

    /// The phone and its event log (the inside of `#phone`).
    func body() -> String {
        var h = "<div class=\"device\(device.family == "iPad" ? " ipad" : "")\" data-family=\"\(device.family)\" data-now=\"\(screen.time.timeIntervalSince1970)\" data-clock=\"\(realTime ? "real" : "virtual")\">"
        h += "<div class=\"screen\" aria-label=\"Lock Screen of \(HTML.escape(device.name))\">"
        h += "<div class=\"status\"><span>\(HTML.escape(Self.clock(screen.time)))</span><span>\(HTML.escape(device.model)) · iOS \(HTML.escape(device.osVersion))\(device.isOnline ? "" : " · offline")</span></div>"
        h += island()
        if let banner = screen.banner { h += "<div class=\"banner\" role=\"alert\"><b>\(HTML.escape(banner.alert.title))</b> \(HTML.escape(banner.alert.body))</div>" }
        h += "<section class=\"lock\" aria-label=\"Live Activities\">"
        if screen.lockScreen.isEmpty { h += "<p class=\"empty\">No Live Activities</p>" }
        for item in screen.lockScreen { h += lockScreenCard(item) }
        h += "</section>"
        h += "<section class=\"widgets\" aria-label=\"Widgets\">"
        for w in screen.widgets { h += widget(w) }
        h += "</section></div>"
        h += elsewhere()
        h += eventLog()
        h += "</div>"
        return h
    }

    // MARK: Dynamic Island

    func island() -> String {
        guard device.hasDynamicIsland else { return "" }
        let items = screen.islandActivities.compactMap { id in (screen.lockScreen + screen.transientActivities).first { $0.activityID == id } }
        var h = "<div class=\"island \(screen.dynamicIsland.rawValue)\" data-mode=\"\(screen.dynamicIsland.rawValue)\" aria-label=\"Dynamic Island: \(screen.dynamicIsland.rawValue)\">"
        switch screen.dynamicIsland {
        case .none:
            break
        case .compact:
            if let a = items.first {
                let t = Self.template(a.attributesType)
                h += "<span class=\"leading\">\(t.compactLeading(a))</span><span class=\"trailing\">\(t.compactTrailing(a))</span>"
            }
        case .minimal:
            for (i, a) in items.enumerated() {
                h += "<span class=\"minimal \(i == 0 ? "attached" : "detached")\">\(Self.template(a.attributesType).minimal(a))</span>"
            }
        case .expanded:
            if let a = items.first {
                h += "<div class=\"expanded\">\(Self.template(a.attributesType).expanded(a))"
                if let alert = a.lastAlert { h += "<p class=\"alert\"><b>\(HTML.escape(alert.title))</b> \(HTML.escape(alert.body))</p>" }
                h += "</div>"
            }
        }
        return h + "</div>"
    }

    // MARK: Elsewhere: Apple Watch, CarPlay, the Mac

    /// The same activities where the person also sees them: the paired Watch's Smart Stack, CarPlay,
    /// the paired Mac's menu bar — each in its layout, re-rendered with every push.
    func elsewhere() -> String {
        guard !screen.presentations.isEmpty else { return "" }
        var h = "<section class=\"elsewhere\" aria-label=\"Also shown on\">"
        for p in screen.presentations {
            guard let a = (screen.lockScreen + screen.transientActivities).first(where: { $0.activityID == p.activityID }) else { continue }
            let t = Self.template(a.attributesType)
            let name = switch p.surface {
            case .watchSmartStack: "Apple Watch · Smart Stack"
            case .carPlay: "CarPlay"
            case .macMenuBar: "Mac · menu bar"
            }
            h += "<article class=\"surface \(p.surface.rawValue)\" data-surface=\"\(p.surface.rawValue)\" data-layout=\"\(HTML.escape(p.layout))\" aria-label=\"\(name) (\(HTML.escape(p.layout)))\">"
            h += "<h3>\(name) <small>\(HTML.escape(p.layout))</small></h3>"
            h += "<p><span class=\"leading\">\(t.compactLeading(a))</span> <span class=\"trailing\">\(t.compactTrailing(a))</span></p>"
            if let alert = p.alert { h += "<p class=\"alert\"><b>\(HTML.escape(alert.title))</b> \(HTML.escape(alert.body))</p>" }
            h += "</article>"
        }
        return h + "</section>"
    }

    // MARK: Lock Screen

    func lockScreenCard(_ a: ScreenState.Item) -> String {
        let look = a.state == .ended ? "ended" : a.isStale ? "stale" : "active"
        var h = "<article class=\"activity \(look)\" data-activity=\"\(HTML.escape(a.activityID))\" data-type=\"\(HTML.escape(a.attributesType))\" aria-label=\"\(HTML.escape(a.attributesType)) (\(look))\">"
        h += Self.template(a.attributesType).lockScreen(a)
        if a.isStale { h += "<p class=\"note\">Out of date</p>" }
        if a.state == .ended { h += "<p class=\"note\">Ended</p>" }
        return h + "</article>"
    }

    func widget(_ w: WidgetView) -> String {
        var h = "<article class=\"widget \(HTML.escape(w.family))\" aria-label=\"Widget \(HTML.escape(w.kind))\"><header>\(HTML.escape(w.kind))</header>"
        if let entry = w.entry {
            h += Self.fields(entry.content)
        } else {
            h += "<p class=\"empty\">\(w.lastError.map { "Failed to load: \(HTML.escape($0))" } ?? "No entry yet")</p>"
        }
        return h + "</article>"
    }

    // MARK: Event log

    func eventLog() -> String {
        var h = "<section class=\"log\" aria-label=\"Event log\"><h2>What the phone did</h2><ol reversed>"
        for e in device.events.suffix(60).reversed() {
            let code = e.outcome?.code.rawValue ?? e.source.rawValue
            h += "<li class=\"\(HTML.escape(code))\"><time>\(HTML.escape(Self.clock(e.time)))</time> <span class=\"code\">\(HTML.escape(code))</span> \(HTML.escape(e.message))</li>"
        }
        return h + "</ol></section>"
    }

    // MARK: Templates

    /// How one attributes type draws itself in each presentation (HTML, already escaped).
    struct Template: Sendable {
        var lockScreen: @Sendable (ScreenState.Item) -> String
        var compactLeading: @Sendable (ScreenState.Item) -> String
        var compactTrailing: @Sendable (ScreenState.Item) -> String
        var minimal: @Sendable (ScreenState.Item) -> String
        var expanded: @Sendable (ScreenState.Item) -> String
    }

    static func template(_ type: String) -> Template {
        switch type {
        case "PizzaDeliveryAttributes": pizza
        case "AdventureAttributes": adventure
        default: generic
        }
    }

    /// Apple's pizza delivery sample: order, driver, and the delivery window counting down.
    static let pizza = Template(
        lockScreen: { a in
            let order = a.attributes["orderNumber"]?.stringValue ?? "?"
            let pizzas = a.attributes["numberOfPizzas"]?.numberValue.map { "\($0)" } ?? "?"
            var h = "<h3>Order #\(HTML.escape(order)) · \(HTML.escape(pizzas)) pizza\(pizzas == "1" ? "" : "s")</h3>"
            h += "<p class=\"driver\">\(HTML.escape(a.contentState["driverName"]?.stringValue ?? ""))</p>"
            if let end = deliveryEnd(a) { h += "<p>Arrives in \(timer(end))</p>" }
            return h
        },
        compactLeading: { _ in "🍕" },
        compactTrailing: { a in deliveryEnd(a).map(timer) ?? "" },
        minimal: { a in deliveryEnd(a).map(timer) ?? "🍕" },
        expanded: { a in
            "<h3>\(HTML.escape(a.contentState["driverName"]?.stringValue ?? "")) is on the way</h3>" + (deliveryEnd(a).map { "<p>Arrives in \(timer($0))</p>" } ?? "")
        })

    static func deliveryEnd(_ a: ScreenState.Item) -> Date? {
        // A ClosedRange<Date> as ActivityKit encodes it: [lower, upper], seconds since 2001.
        a.contentState["deliveryTimer"]?.arrayValue?.last?.numberValue.map { Date(timeIntervalSinceReferenceDate: $0.doubleValue) }
    }

    /// WWDC23's Emoji Rangers: the hero, a health bar, what just happened.
    static let adventure = Template(
        lockScreen: { a in
            let health = healthLevel(a)
            return "<h3>\(HTML.escape(a.attributes["hero"]?.stringValue ?? "Hero"))</h3>"
                + "<meter min=\"0\" max=\"1\" value=\"\(health)\" aria-label=\"Health\">\(Int(health * 100)) %</meter>"
                + "<p>\(HTML.escape(a.contentState["eventDescription"]?.stringValue ?? ""))</p>"
        },
        compactLeading: { a in HTML.escape(a.attributes["hero"]?.stringValue ?? "🦸") },
        compactTrailing: { a in "\(Int(healthLevel(a) * 100)) %" },
        minimal: { a in "\(Int(healthLevel(a) * 100))" },
        expanded: { a in "<h3>\(HTML.escape(a.attributes["hero"]?.stringValue ?? ""))</h3><p>\(HTML.escape(a.contentState["eventDescription"]?.stringValue ?? ""))</p>" })

    /// The hero's health, 0…1 whatever the content says (it is data, not a promise).
    static func healthLevel(_ a: ScreenState.Item) -> Double {
        let v = a.contentState["currentHealthLevel"]?.numberValue?.doubleValue ?? 0
        return v.isFinite ? min(1, max(0, v)) : 0
    }

    /// Any other type: its fields, as they are.
    static let generic = Template(
        lockScreen: { a in "<h3>\(HTML.escape(a.attributesType))</h3>" + fields(a.attributes) + fields(a.contentState) },
        compactLeading: { a in HTML.escape(String(a.attributesType.prefix(1))) },
        compactTrailing: { a in HTML.escape(firstValue(a.contentState)) },
        minimal: { a in HTML.escape(String(firstValue(a.contentState).prefix(3))) },
        expanded: { a in fields(a.contentState) })

    static func firstValue(_ v: JSONValue) -> String {
        guard let o = v.objectValue, let key = o.keys.sorted().first else { return "" }
        return o[key]!.stringValue ?? o[key]!.briefDescription
    }

    static func fields(_ v: JSONValue) -> String {
        guard let o = v.objectValue, !o.isEmpty else { return "" }
        var h = "<dl>"
        for key in o.keys.sorted() {
            let value = o[key]!
            h += "<dt>\(HTML.escape(key))</dt><dd>\(HTML.escape(value.stringValue ?? value.jsonString))</dd>"
        }
        return h + "</dl>"
    }

    /// A countdown the page keeps current (`data-end`, Unix seconds).
    static func timer(_ end: Date) -> String {
        "<time class=\"timer\" data-end=\"\(end.timeIntervalSince1970)\">–:––</time>"
    }

    static func clock(_ d: Date) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "HH:mm:ss"
        return f.string(from: d)
    }
}
