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
    public func save(_ data: Data) throws { try data.write(to: URL(fileURLWithPath: path), options: .atomic) }
}

/// One thing the server must hear, kept until it has: in order per lane (the installation, or one
/// activity), with its own `Idempotency-Key` so a retry after a lost answer changes nothing twice.
struct Report: Codable, Sendable, Hashable {
    enum Kind: Codable, Sendable, Hashable {
        /// The installation as it is now (tokens, enablement): sent whole, so newer replaces older.
        case installation
        /// An activity the app started (or one started by push), with its first token.
        case register(local: String, attributesType: String, token: String, externalKey: String?, topics: [String])
        /// A rotated activity token.
        case token(local: String, token: String)
        /// The person dismissed it, or it ended.
        case state(local: String, report: String)
    }
    var key: String
    var lane: String
    var kind: Kind
    var attempts = 0
    var notBefore = Date.distantPast
}

/// What the SDK persists (``IsleClientStorage``).
struct ClientState: Codable, Sendable {
    var installationID: String
    var secret: String?
    /// The installation as the app last reported it.
    var pushToStartTokens: [String: String] = [:]
    var widgetToken: String?
    var liveActivitiesEnabled: Bool?
    var frequentPushesEnabled: Bool?
    /// ActivityKit's activity id → the server's.
    var serverIDs: [String: String] = [:]
    /// Activities whose first token was reported.
    var registered: Set<String> = []
    var outbox: [Report] = []
    /// Reports the server refused for good (4xx other than rate limits): kept for the app to see.
    var refused: [String] = []

    static let installationLane = "installation"
    static func lane(_ local: String) -> String { "activity:" + local }

    /// Queues `report`; a report that a newer one makes pointless goes (the installation's whole
    /// state; a token not yet sent), so a flaky network never replays stale tokens.
    mutating func add(_ report: Report) {
        switch report.kind {
        case .installation:
            if outbox.contains(where: { $0.kind == .installation && $0.attempts == 0 }) { return }
        case .token(let local, let token):
            // Not yet registered: the registration carries the newest token instead.
            if let i = outbox.firstIndex(where: { if case .register(local, _, _, _, _) = $0.kind { true } else { false } }), outbox[i].attempts == 0,
               case .register(_, let type, _, let key, let topics) = outbox[i].kind {
                outbox[i].kind = .register(local: local, attributesType: type, token: token, externalKey: key, topics: topics)
                return
            }
            if let i = outbox.lastIndex(where: { if case .token(local, _) = $0.kind { true } else { false } }), outbox[i].attempts == 0 {
                outbox[i].kind = .token(local: local, token: token)
                return
            }
        default:
            break
        }
        outbox.append(report)
    }
}
