import Foundation
public import IsleAPNs
public import IsleCore
public import IsleDelivery
public import IsleStore
public import Logging
import Synchronization

/// One APNs client per app and environment, made on first use and shared by every worker (one JWT
/// per key): an app's sandbox and production tokens go to their own hosts, side by side.
public final class APNsClients: Sendable {
    /// Where each environment's pushes go.
    let targets: [PushEnvironment: APNsEnvironment]
    /// The environment of records that do not name one.
    public let defaultEnvironment: PushEnvironment
    let requestTimeout: Duration
    let transport: APNsTransportKind
    let masterKey: MasterKey?
    let clock: any WallClock
    let logger: Logger
    /// Per app and environment, with the credentials it was made with (key id, team id and the
    /// sealed key): `isle app add` again with a corrected key or team under the same key id makes
    /// a new client, so a paused app can resume.
    private let clients = Mutex<[String: (credentials: String, client: APNsClient)]>([:])
    /// Clients replaced after a key change, closed at shutdown.
    private let retired = Mutex<[APNsClient]>([])

    /// Every environment to `environment`'s hosts (one fake APNs for all, or one Apple environment).
    public convenience init(environment: APNsEnvironment, requestTimeout: Duration = .seconds(30), transport: APNsTransportKind = .default, masterKey: MasterKey? = nil,
                            clock: any WallClock = SystemWallClock(), logger: Logger) {
        let name: PushEnvironment = environment == .production ? .production : .sandbox
        self.init(targets: [.sandbox: environment, .production: environment], defaultEnvironment: name, requestTimeout: requestTimeout, transport: transport,
                  masterKey: masterKey, clock: clock, logger: logger)
    }

    public init(targets: [PushEnvironment: APNsEnvironment], defaultEnvironment: PushEnvironment, requestTimeout: Duration = .seconds(30), transport: APNsTransportKind = .default,
                masterKey: MasterKey? = nil, clock: any WallClock = SystemWallClock(), logger: Logger) {
        self.targets = targets
        self.defaultEnvironment = defaultEnvironment
        self.requestTimeout = requestTimeout
        self.transport = transport
        self.masterKey = masterKey
        self.clock = clock
        self.logger = logger
    }

    /// Where `environment`'s pushes go.
    public func target(_ environment: PushEnvironment) -> APNsEnvironment {
        targets[environment] ?? (environment == .production ? .production : .sandbox)
    }

    /// The client for the app's pushes to `environment` (nil: the default environment).
    public func client(for app: AppRecord, environment: PushEnvironment? = nil) throws -> APNsClient {
        let environment = environment ?? defaultEnvironment
        let key = app.bundleID + "|" + environment.rawValue
        var replaced: APNsClient?
        // The environment's own key (an environment-scoped key), else the app's.
        let signing = app.signingKey(for: environment)
        let client = try clients.withLock { c throws -> APNsClient in
            let identity = signing.keyID + "|" + signing.teamID + "|" + signing.keyPEM
            if let existing = c[key], existing.credentials == identity { return existing.client }
            // Made under the lock: two workers must not each make one and drop the other unclosed.
            let credentials = try APNsCredentials(keyID: signing.keyID, teamID: signing.teamID,
                                                  pem: try MasterKey.openKey(signing.keyPEM, bundleID: app.bundleID, with: masterKey))
            // Payloads were validated once, when the API accepted them (PayloadCheck); the engine's
            // stamping (timestamp, dates) keeps them valid, so the client does not validate again.
            let client = try APNsClient(configuration: .init(environment: target(environment), credentials: credentials, requestTimeout: requestTimeout, validatesPayloads: false, transport: transport),
                                        clock: clock, logger: logger)
            replaced = c[key]?.client
            c[key] = (identity, client)
            return client
        }
        if let replaced { retired.withLock { $0.append(replaced) } }
        return client
    }

    public func shutdown() async {
        let all = clients.withLock { c in defer { c.removeAll() }; return c.values.map(\.client) } + retired.withLock { r in defer { r.removeAll() }; return r }
        for c in all { try? await c.shutdown() }
    }
}
