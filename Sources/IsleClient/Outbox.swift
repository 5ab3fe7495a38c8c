public import Foundation

/// Where the SDK keeps its state between launches: the installation, its secret, the server's ids
/// for the app's activities and the reports not yet sent. The Keychain on Apple platforms is the
/// right home for the secret; ``FileStorage`` serves tests and command-line tools.
public protocol IsleClientStorage: Sendable {
    func load() throws -> Data?
    func save(_ data: Data) throws
}

/// A file, replaced atomically on every save.
public struct FileStorage: IsleClientStorage {
    public let path: String
    public init(path: String) { self.path = path }
    public func load() throws -> Data? {
        FileManager.default.fileExists(atPath: path) ? try Data(contentsOf: URL(fileURLWithPath: path)) : nil
    }
    public func save(_ data: Data) throws {
        let url = URL(fileURLWithPath: path)
        // The first save may come before anything made the directory (a caches folder on Linux).
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try data.write(to: url, options: .atomic)
    }
}

/// One thing the server must hear, kept until it has: in order per lane (the installation, or one
/// activity), with its own `Idempotency-Key` so a retry after a lost answer changes nothing twice.
struct Report: Codable, Sendable, Hashable {
    enum Kind: Codable, Sendable, Hashable {
        /// The installation as it is now (tokens, enablement): sent whole, so newer replaces older.
        case installation
        /// An activity the app started (or one started by push), with its first token.
        case register(local: String, attributesType: String, token: String, externalKey: String?, topics: [String])
        /// An activity on a broadcast channel (iOS 18): it has no token, only its channel.
        case registerChannel(local: String, attributesType: String, channelID: String, externalKey: String?, topics: [String])
        /// A rotated activity token.
        case token(local: String, token: String)
        /// The person dismissed it, or it ended.
        case state(local: String, report: String)
    }
    var key: String
    var lane: String
    var kind: Kind
    var attempts = 0
    /// Times a registration's ticket was fetched anew after the server found it expired.
    var ticketRefreshes = 0
    var notBefore = Date.distantPast
    /// The request as first sent; every retry repeats it byte for byte.
    var request: Request?
    /// Handed to the system's background transport (once): its answer may come in a later launch.
    var handedOff = false

    struct Request: Codable, Sendable, Hashable {
        var method: String
        var path: String
        var body: Data
    }

    init(key: String, lane: String, kind: Kind) {
        self.key = key
        self.lane = lane
        self.kind = kind
    }

    enum CodingKeys: String, CodingKey { case key, lane, kind, attempts, ticketRefreshes, notBefore, request, handedOff }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        key = try c.decode(String.self, forKey: .key)
        lane = try c.decode(String.self, forKey: .lane)
        kind = try c.decode(Kind.self, forKey: .kind)
        attempts = try c.decodeIfPresent(Int.self, forKey: .attempts) ?? 0
        ticketRefreshes = try c.decodeIfPresent(Int.self, forKey: .ticketRefreshes) ?? 0
        notBefore = try c.decodeIfPresent(Date.self, forKey: .notBefore) ?? .distantPast
        request = try c.decodeIfPresent(Request.self, forKey: .request)
        handedOff = try c.decodeIfPresent(Bool.self, forKey: .handedOff) ?? false
    }
}

/// What the SDK persists (``IsleClientStorage``).
struct ClientState: Codable, Sendable {
    var installationID: String
    /// The installation's secret once the server registered it.
    var secret: String?
    /// The secret this installation proposes at its first registration (the server keeps the one
    /// the first registration presents): chosen and saved before anything is sent, so a first
    /// answer lost with the app's process loses nothing.
    var proposedSecret: String = ClientState.makeSecret()
    /// The installation as the app last reported it.
    var pushToStartTokens: [String: String] = [:]
    var widgetToken: String?
    /// The control push token (iOS 18, `ControlPushHandler`), as the app last reported it.
    var controlsToken: String?
    /// The topics the installation follows for starts (nil: never said).
    var startTopics: [String]?
    var liveActivitiesEnabled: Bool?
    var frequentPushesEnabled: Bool?
    /// The APNs environment last reported (`sandbox`, `production`; nil: not said).
    var environment: String?
    /// ActivityKit's activity id → the server's.
    var serverIDs: [String: String] = [:]
    /// Activities whose first token was reported.
    var registered: Set<String> = []
    /// The last token reported for each activity: the same token again (ActivityKit's
    /// `pushTokenUpdates` starts with the current one) is not a rotation.
    var lastTokens: [String: String] = [:]
    /// Each registered activity's attributes type, until it is reported dismissed: at the next
    /// launch, one that ActivityKit no longer lists was dismissed while the app was not running.
    var types: [String: String] = [:]
    /// The last state reported for each activity (`ended`, `dismissed`): not reported twice.
    var reportedStates: [String: String] = [:]
    /// The backend's registration ticket for an activity's external key, until it is registered.
    var tickets: [String: String] = [:]
    var outbox: [Report] = []
    /// Reports the server refused for good (4xx other than rate limits): kept for the app to see.
    var refused: [String] = []
    /// Each activity whose registration the server refused, with the server's reason.
    var refusals: [String: IsleClient.Refusal] = [:]
    /// What each activity was registered with, so it can be registered again when the server has
    /// lost it (rows pruned, a restore from an older backup): never stranded.
    var registrations: [String: Registration] = [:]
    /// When the server last took the installation: it is sent again after
    /// ``IsleClient/Configuration/installationRefresh`` even when nothing changed.
    var installationSentAt: Date?
    /// Once the installation is registered again, register every live activity again too (the
    /// server answers the one it has: no duplicate).
    var resyncPending = false
    /// The backend's user ticket, sent with the installation until the server took it.
    var userTicket: String?
    /// The token the server last took for each activity: an activity found missing is registered
    /// again with it (the server answers the row it has, if it has one after all), then rotated.
    var serverTokens: [String: String] = [:]

    struct Registration: Codable, Sendable, Hashable {
        var attributesType: String
        var externalKey: String?
        var topics: [String]
        var channelID: String?
    }

    init(installationID: String) { self.installationID = installationID }

    /// 32 random bytes, base64url: what the server accepts as an app-chosen secret (32–200 printable ASCII).
    static func makeSecret() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return "isle_app_" + Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    enum CodingKeys: String, CodingKey {
        case installationID, secret, proposedSecret, pushToStartTokens, widgetToken, controlsToken, liveActivitiesEnabled, frequentPushesEnabled, environment, serverIDs, registered, lastTokens, types, reportedStates, outbox, refused, tickets, refusals
        case registrations, installationSentAt, resyncPending, userTicket, serverTokens, startTopics
    }

    /// Reads what any earlier version of the SDK saved: a field it did not know takes its default,
    /// so an app update never loses the installation, its secret or the unsent reports.
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        installationID = try c.decode(String.self, forKey: .installationID)
        secret = try c.decodeIfPresent(String.self, forKey: .secret)
        proposedSecret = try c.decodeIfPresent(String.self, forKey: .proposedSecret) ?? ClientState.makeSecret()
        pushToStartTokens = try c.decodeIfPresent([String: String].self, forKey: .pushToStartTokens) ?? [:]
        widgetToken = try c.decodeIfPresent(String.self, forKey: .widgetToken)
        controlsToken = try c.decodeIfPresent(String.self, forKey: .controlsToken)
        liveActivitiesEnabled = try c.decodeIfPresent(Bool.self, forKey: .liveActivitiesEnabled)
        frequentPushesEnabled = try c.decodeIfPresent(Bool.self, forKey: .frequentPushesEnabled)
        environment = try c.decodeIfPresent(String.self, forKey: .environment)
        serverIDs = try c.decodeIfPresent([String: String].self, forKey: .serverIDs) ?? [:]
        registered = try c.decodeIfPresent(Set<String>.self, forKey: .registered) ?? []
        lastTokens = try c.decodeIfPresent([String: String].self, forKey: .lastTokens) ?? [:]
        types = try c.decodeIfPresent([String: String].self, forKey: .types) ?? [:]
        reportedStates = try c.decodeIfPresent([String: String].self, forKey: .reportedStates) ?? [:]
        outbox = try c.decodeIfPresent([Report].self, forKey: .outbox) ?? []
        refused = try c.decodeIfPresent([String].self, forKey: .refused) ?? []
        tickets = try c.decodeIfPresent([String: String].self, forKey: .tickets) ?? [:]
        refusals = try c.decodeIfPresent([String: IsleClient.Refusal].self, forKey: .refusals) ?? [:]
        registrations = try c.decodeIfPresent([String: Registration].self, forKey: .registrations) ?? [:]
        installationSentAt = try c.decodeIfPresent(Date.self, forKey: .installationSentAt)
        resyncPending = try c.decodeIfPresent(Bool.self, forKey: .resyncPending) ?? false
        userTicket = try c.decodeIfPresent(String.self, forKey: .userTicket)
        serverTokens = try c.decodeIfPresent([String: String].self, forKey: .serverTokens) ?? [:]
        startTopics = try c.decodeIfPresent([String].self, forKey: .startTopics)
    }

    /// A registration report for every live activity the server should have (not ended, not
    /// dismissed, not refused). One with reports still queued is left to them: a token report the
    /// server answers 404 is turned into a registration with that newest token.
    mutating func reRegisterLiveActivities() {
        for (local, r) in registrations.sorted(by: { $0.key < $1.key }) where registered.contains(local) && reportedStates[local] == nil && refusals[local] == nil {
            guard !outbox.contains(where: { $0.lane == ClientState.lane(local) }) else { continue }
            // A channel activity is left alone: the server matches a registration to the one it has
            // by token, and broadcasts reach the phone through the channel whatever the server keeps.
            guard r.channelID == nil, let token = lastTokens[local] else { continue }
            let kind = Report.Kind.register(local: local, attributesType: r.attributesType, token: token, externalKey: r.externalKey, topics: r.topics)
            outbox.append(Report(key: UUID().uuidString.lowercased(), lane: ClientState.lane(local), kind: kind))
        }
    }

    static let installationLane = "installation"
    static func lane(_ local: String) -> String { "activity:" + local }
    static func local(ofLane lane: String) -> String { String(lane.dropFirst("activity:".count)) }

    /// Queues `report`; a report that a newer one makes pointless goes (the installation's whole
    /// state; a token not yet sent), so a flaky network never replays stale tokens.
    mutating func add(_ report: Report) {
        switch report.kind {
        case .installation:
            if outbox.contains(where: { $0.kind == .installation && $0.request == nil }) { return }
        case .token(let local, let token):
            // Not yet registered: the registration carries the newest token instead.
            if let i = outbox.firstIndex(where: { if case .register(local, _, _, _, _) = $0.kind { true } else { false } }), outbox[i].request == nil,
               case .register(_, let type, _, let key, let topics) = outbox[i].kind {
                outbox[i].kind = .register(local: local, attributesType: type, token: token, externalKey: key, topics: topics)
                return
            }
            if let i = outbox.lastIndex(where: { if case .token(local, _) = $0.kind { true } else { false } }), outbox[i].request == nil {
                outbox[i].kind = .token(local: local, token: token)
                return
            }
        default:
            break
        }
        outbox.append(report)
    }
}
