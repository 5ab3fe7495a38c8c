public import Foundation
public import IsleCore

/// A WidgetKit timeline: entries and the reload policy (docs/protocol.md §9.2).
public struct WidgetTimeline: Sendable, Hashable, Codable {
    public struct Entry: Sendable, Hashable, Codable {
        public var date: Date
        public var content: JSONValue
        public init(date: Date, content: JSONValue) {
            self.date = date
            self.content = content
        }
    }
    public enum ReloadPolicy: Sendable, Hashable, Codable {
        case atEnd
        case after(Date)
        case never
    }
    public var entries: [Entry]
    public var policy: ReloadPolicy
    public init(entries: [Entry], policy: ReloadPolicy) {
        self.entries = entries.sorted { $0.date < $1.date }
        self.policy = policy
    }

    /// Reads `{"entries":[{"date":<unix>,"content":{…}}], "policy": {"atEnd":{}} | {"after":<unix>} | {"never":{}}}`.
    public init(json: JSONValue) throws(SimulatorError) {
        guard let entries = json["entries"]?.arrayValue else { throw SimulatorError(.invalidArgument, "a timeline needs \"entries\": an array", field: "entries") }
        var parsed: [Entry] = []
        for (i, e) in entries.enumerated() {
            guard let d = e["date"]?.numberValue?.doubleValue, let content = e["content"] else {
                throw SimulatorError(.invalidArgument, "entries[\(i)] needs \"date\" (Unix seconds) and \"content\"", field: "entries[\(i)]")
            }
            parsed.append(Entry(date: Date(timeIntervalSince1970: d), content: content))
        }
        let policy: ReloadPolicy
        switch json["policy"] {
        case nil: policy = .atEnd
        case .object(let o)? where o["atEnd"] != nil: policy = .atEnd
        case .object(let o)? where o["never"] != nil: policy = .never
        case .object(let o)? where o["after"]?.numberValue != nil: policy = .after(Date(timeIntervalSince1970: o["after"]!.numberValue!.doubleValue))
        default: throw SimulatorError(.invalidArgument, "policy must be {\"atEnd\":{}}, {\"after\":<unix>} or {\"never\":{}}", field: "policy")
        }
        self.init(entries: parsed, policy: policy)
    }

    /// The entry shown at `t`: the last one whose date ≤ t.
    public func entry(at t: Date) -> Entry? { entries.last { $0.date <= t } }

    /// When the policy asks for the next reload.
    public var nextReload: Date? {
        switch policy {
        case .atEnd: entries.last?.date
        case .after(let d): d
        case .never: nil
        }
    }
}

/// A configured widget on a simulated device.
public struct SimulatedWidget: Sendable, Hashable, Codable {
    public struct Configuration: Sendable, Hashable, Codable {
        public enum Source: Sendable, Hashable, Codable {
            /// A fixed timeline (returned on every reload).
            case fixed(WidgetTimeline)
            /// An HTTP(S) URL returning the timeline JSON (the analogue of an extension fetching its data).
            case url(String)
            /// A Swift closure registered with ``SimulatorWorld/registerTimelineProvider(_:_:)``.
            case provider(String)
        }
        public var kind: String
        public var family: String
        public var source: Source
        public init(kind: String, family: String = "systemSmall", source: Source) {
            self.kind = kind
            self.family = family
            self.source = source
        }
    }

    public var configuration: Configuration
    public var timeline: WidgetTimeline?
    public var reloadLog: [Date] = []
    /// This widget's reloads per 24 h, drawn when it was added (nil: the configuration's maximum).
    public var dailyBudget: Int?
    public var reloadCount = 0
    public var lastReload: Date?
    /// A reload deferred by the budget, due at this time.
    public var pendingReload: Date?
    public var lastError: String?
    /// When the widget was added: WidgetKit asks its timeline provider for a first timeline at once
    /// (not counted against the budget), so it is never blank waiting for a push or an app reload.
    public var addedAt: Date?

    /// A fixed timeline is there from the moment the widget is added; a provider's or a URL's
    /// first timeline is asked for at the next tick (a fraction of a second in real time).
    init(configuration: Configuration, addedAt: Date? = nil) {
        self.configuration = configuration
        self.addedAt = addedAt
        if case .fixed(let timeline) = configuration.source, let addedAt {
            self.timeline = timeline
            lastReload = addedAt
        }
    }

    func view(bundleID: String, at t: Date) -> WidgetView {
        WidgetView(bundleID: bundleID, kind: configuration.kind, family: configuration.family, entry: timeline?.entry(at: t), reloadCount: reloadCount, lastReload: lastReload, pendingReload: pendingReload, lastError: lastError)
    }
}

/// What a widget shows now.
public struct WidgetView: Sendable, Hashable, Codable {
    public var bundleID: String
    public var kind: String
    public var family: String
    public var entry: WidgetTimeline.Entry?
    public var reloadCount: Int
    public var lastReload: Date?
    public var pendingReload: Date?
    public var lastError: String?
}
