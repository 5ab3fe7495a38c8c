import AsyncHTTPClient
import Crypto
import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Logging
import NIOCore
import ServiceLifecycle

enum Pizza {
    static let bundleID = "com.example.pizza"
    static let schema = try! ActivitySchema(jsonText: """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes": { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange" } }
        """)
    static let attributes: JSONValue = ["numberOfPizzas": 3, "totalAmount": "$42.00", "orderNumber": "12345"]
    static func state(_ driver: String) -> JSONValue { ["driverName": .string(driver), "deliveryTimer": [788_918_400, 788_919_900]] }
    static let t0 = Date(timeIntervalSince1970: 1_767_225_600)
}

/// A simulator and an Isle server on one virtual clock, the server on a real SQLite file, talking
/// HTTP/2 + TLS to the simulator's fake APNs; and an HTTP client for the server's API.
final class ServerFixture: Sendable {
    /// Seals the fixture's app key, as `isle app add` does with the operator's master key.
    static let masterKey = MasterKey.generate()
    /// The backend's registration-ticket key (its public half is the app's ticket key).
    static let ticketKey = P256.Signing.PrivateKey()
    static let ticketKeyID = "tk_fixture"
    let sim: IsleSim
    let clock: ManualWallClock
    let http: HTTPClient
    let databasePath: String
    let device: String
    let backendKey: String
    let deviceKey: String
    let server: Server
    let tune: @Sendable (inout ServerConfiguration) -> Void
    /// The failpoints of every store the server opens on its file (``StoreFaults``): a test arms
    /// them to make the database misbehave.
    let faults = StoreFaults()
    /// The server's logger, when a test reads its logs (quiet otherwise).
    let logger = Mutex<Logger?>(nil)

    /// The running server, which tests can stop abruptly and start again on the same file.
    final class Server: Sendable {
        let state = Mutex<(app: IsleServerApp, task: Task<Void, any Error>)?>(nil)
        let group = Mutex<ServiceGroup?>(nil)
        var app: IsleServerApp { state.withLock { $0!.app } }
        var port: Int { get async { await app.port() } }
    }

    init(sim: IsleSim, clock: ManualWallClock, databasePath: String, device: String, backendKey: String, deviceKey: String, tune: @escaping @Sendable (inout ServerConfiguration) -> Void = { _ in }) {
        self.tune = tune
        self.sim = sim
        self.clock = clock
        self.databasePath = databasePath
        self.device = device
        self.backendKey = backendKey
        self.deviceKey = deviceKey
        http = HTTPClient(eventLoopGroupProvider: .singleton)
        server = Server()
    }

    func configuration() -> ServerConfiguration {
        var c = ServerConfiguration()
        c.port = 0
        c.sendBothEnvironments(to: .custom(url: sim.apnsURL, broadcastURL: sim.broadcastURL, managementURL: sim.managementURL, trustRootsPEM: sim.caCertificatePEM))
        c.database = databasePath
        c.concurrency = 64
        c.randomSeed = 9
        c.masterKey = Self.masterKey
        // Every request of a test comes from 127.0.0.1 on a clock that moves only when the test
        // says: the per-address, per-installation and failure limits are tested on their own
        // (TrustModelTests) and off elsewhere.
        c.deviceAddressLimit = .off
        c.deviceInstallationLimit = .off
        c.authFailureLimit = .off
        c.quotas.newInstallationsPerAddressPerHour = 0
        c.quotas.newActivitiesPerAddressPerHour = 0
        // Tests' webhook receivers listen on 127.0.0.1; the address rules are tested with this off
        // (TrustV3Tests).
        c.webhooks.allowPrivate = true
        tune(&c)
        return c
    }

    /// Starts the server (again) on the database file.
    func start() async throws {
        var logger = self.logger.withLock { $0 } ?? Logger(label: "isle.test.server")
        if self.logger.withLock({ $0 }) == nil { logger.logLevel = .critical }
        let store = try SQLiteStore(path: databasePath, faults: faults)
        let app = IsleServerApp(configuration: configuration(), store: store, clock: clock, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: logger))
        let task = Task { try await group.run() }
        server.state.withLock { $0 = (app, task) }
        server.group.withLock { $0 = group }
        _ = await app.port()
    }

    /// Stops the server gracefully, as a deploy does: it stops accepting, answers what it has,
    /// and stops. (Cancelling, as `kill()` does, can race NIO's accept of a new connection —
    /// apple/swift-nio#3481 — so tests that stop often while clients connect use this.)
    func stop() async {
        guard let group = server.group.withLock({ $0 }), let (_, task) = server.state.withLock({ $0 }) else { return }
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }

    /// Stops the server abruptly: its task is cancelled mid-work, nothing is drained.
    func kill() async {
        guard let (_, task) = server.state.withLock({ $0 }) else { return }
        task.cancel()
        _ = try? await task.value
    }

    /// The simulated phones of the server's tests: `isle sim`'s defaults — Apple's leeway on:
    /// the budget per app, the per-token and connection limits, the widget budget drawn from
    /// 40–70, a seeded 5 % of stored pushes not the newest, tokens withheld from an app that is not
    /// running, the push-to-start limit — with only these switched off, each for its reason
    /// (docs/simulator.md, "Never kinder than Apple"). With all of it on, the server is tested by
    /// `LeewayTests`, `TopicAudienceTests.offlineFollowers` and `isle-bench day`.
    static var device: SimulatorConfiguration {
        var c = SimulatorConfiguration()
        // The clock moves only when a test advances it: priority 5 is applied as it arrives and
        // APNs holds nothing back for reordering, or every test would have to move time for them.
        c.lowPriorityDelay = 0
        c.lowPriorityDelayMaximum = nil
        c.reorderProbability = 0
        c.widgetPushDelayMaximum = 0
        // Tests check what a push did on the phone: none of their priority-5 pushes is lost.
        c.lowPriorityLossProbability = 0
        // Tokens change only when a test rotates them: a test that jumps hours has no app to
        // report a rotation (IsleClient does it in ClientTests and isle-bench day).
        c.activityTokenRotation = nil
        c.pushToStartTokenRotation = nil
        // The install's tokens are there when install returns (tests read them at once), and a
        // dismissed activity's token answers 410 at once (tests do not wait up to 2 virtual minutes).
        c.tokensAtInstall = true
        c.tokenInvalidationDelayMaximum = 0
        return c
    }

    static func with(configure: (inout IsleSim.Configuration) -> Void = { _ in }, server tune: @escaping @Sendable (inout ServerConfiguration) -> Void = { _ in },
                     logger: Logger? = nil, _ body: (ServerFixture) async throws -> Void) async throws {
        var simConfiguration = IsleSim.Configuration()
        simConfiguration.device = Self.device
        configure(&simConfiguration)
        let clock = ManualWallClock(Pizza.t0)
        try await IsleSim.withRunning(configuration: simConfiguration, clock: clock) { sim in
            let key = TestProviderKey()
            try sim.apns.register(RegisteredKey(keyID: key.keyID, teamID: key.teamID, publicKeyPEM: key.publicKeyPEM))
            let device = sim.world.createDevice(name: "iPhone")
            try sim.world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema], widgets: [
                .init(kind: "favorite", source: .fixed(WidgetTimeline(entries: [.init(date: Pizza.t0, content: ["pizza": "Diavola"])], policy: .never))),
            ], controls: ["com.example.pizza.oven"]), on: device)
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-server-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            let path = dir.appendingPathComponent("isle.sqlite").path
            let store = try SQLiteStore(path: path)
            try await store.migrate()
            try await store.upsertApp(AppRecord(bundleID: Pizza.bundleID, teamID: key.teamID, keyID: key.keyID, keyPEM: Self.masterKey.seal(key.privateKeyPEM, bundleID: Pizza.bundleID),
                                                schemas: [Pizza.schema], createdAt: Pizza.t0,
                                                ticketKeys: [TicketKey(id: Self.ticketKeyID, publicKeyPEM: Self.ticketKey.publicKey.pemRepresentation, createdAt: Pizza.t0)]))
            let backend = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .backend).secret
            let deviceKey = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .device).secret
            let f = ServerFixture(sim: sim, clock: clock, databasePath: path, device: device, backendKey: backend, deviceKey: deviceKey, tune: tune)
            f.logger.withLock { $0 = logger }
            try await f.start()
            do {
                try await body(f)
            } catch {
                await f.kill()
                try? await f.http.shutdown()
                throw error
            }
            // Gracefully: cancelling can race NIO's accept of a connection a client is still
            // opening (apple/swift-nio#3481), which traps; a graceful stop never does.
            await f.stop()
            try await f.http.shutdown()
        }
    }

    struct Answer {
        var status: Int
        var json: JSONValue
        var retryAfter: String? = nil
    }

    func call(_ method: String, _ path: String, key: String? = nil, body: JSONValue? = nil, raw: String? = nil, headers: [(String, String)] = []) async throws -> Answer {
        var r = HTTPClientRequest(url: "http://127.0.0.1:\(await server.port)\(path)")
        r.method = .init(rawValue: method)
        if let key { r.headers.add(name: "authorization", value: "Bearer \(key)") }
        for (n, v) in headers { r.headers.add(name: n, value: v) }
        if let body { r.body = .bytes(ByteBuffer(bytes: body.jsonBytes)) } else if let raw { r.body = .bytes(ByteBuffer(string: raw)) }
        let response = try await http.execute(r, timeout: .seconds(20))
        let bytes = try await response.body.collect(upTo: 4 << 20)
        let json = bytes.readableBytes == 0 ? JSONValue.null : ((try? JSONParser.parse(Array(buffer: bytes))) ?? .string(String(buffer: bytes)))
        return Answer(status: Int(response.status.code), json: json, retryAfter: response.headers.first(name: "retry-after"))
    }

    // Device-side helpers.

    /// A registration ticket the backend signed (docs/security.md), valid `ttl` seconds on the fixture's clock.
    func ticket(key: String? = nil, user: String? = nil, installation: String? = nil, ttl: TimeInterval = 600, bundleID: String = Pizza.bundleID) -> String {
        try! RegistrationTicket(bundleID: bundleID, expires: clock.now.addingTimeInterval(ttl), externalKey: key, userID: user, installationID: installation)
            .signed(with: Self.ticketKey, keyID: Self.ticketKeyID)
    }

    /// Installations registered by ``installation(_:)``, with their secrets.
    let secrets = Mutex<[String: String]>([:])

    /// Registers the installation `id` (once) and answers its secret.
    @discardableResult
    func installation(_ id: String = "fixture-phone", body: JSONValue = ["liveActivitiesEnabled": true]) async throws -> String {
        if let s = secrets.withLock({ $0[id] }) { return s }
        let r = try await call("PUT", "/v1/installations/\(id)", key: deviceKey, body: body)
        guard r.status == 200, let secret = r.json["installationSecret"]?.stringValue else { throw DeadlineExceeded(what: "installation \(id) (\(r.status) \(r.json.jsonString))", after: .zero) }
        secrets.withLock { $0[id] = secret }
        return secret
    }

    /// `POST /v1/activities` as IsleClient sends it: on `installation` (registered first), with its
    /// secret, and a ticket for `externalKey` unless `ticket` is given ("" sends none).
    func register(_ body: JSONValue, installation id: String = "fixture-phone", ticket: String? = nil, headers: [(String, String)] = []) async throws -> Answer {
        let secret = try await installation(id)
        var o = body.objectValue ?? [:]
        o["installationID"] = .string(id)
        if let key = o["externalKey"]?.stringValue, o["ticket"] == nil {
            let t = ticket ?? self.ticket(key: key)
            if !t.isEmpty { o["ticket"] = .string(t) }
        }
        return try await call("POST", "/v1/activities", key: deviceKey, body: .object(o), headers: [("Isle-Installation-Secret", secret)] + headers)
    }

    /// The secret header of an installation registered with ``installation(_:)``.
    func secretHeader(_ id: String = "fixture-phone") -> [(String, String)] {
        secrets.withLock { $0[id] }.map { [("Isle-Installation-Secret", $0)] } ?? []
    }

    // The simulated app starts an activity and registers its token with Isle.
    func appStartsActivity(key: String, topics: [String] = [], installation: String = "fixture-phone") async throws -> (activity: SimulatedActivity, isleID: String) {
        let requested = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                      contentState: Pizza.state("Bill James"))
        // As app code does: the token arrives on pushTokenUpdates, after request returns.
        let token = try await sim.world.waitForPushToken(activityID: requested.id, on: device)
        let a = try deviceActivity(requested.id) ?? requested
        let r = try await register([
            "attributesType": "PizzaDeliveryAttributes", "token": .string(token), "externalKey": .string(key), "topics": .array(topics.map(JSONValue.string)),
            "attributes": Pizza.attributes, "contentState": Pizza.state("Bill James"),
        ], installation: installation)
        guard r.status == 201, let id = r.json["id"]?.stringValue else { throw DeadlineExceeded(what: "registration (\(r.status) \(r.json.jsonString))", after: .zero) }
        return (a, id)
    }

    func deviceActivity(_ id: String) throws -> SimulatedActivity? { try sim.world.device(device).activities.first { $0.id == id } }

    /// Waits until the simulated device satisfies `predicate` (re-checked on every change).
    func waitForDevice(_ what: String, within: Duration = .seconds(20), _ predicate: @escaping @Sendable (SimulatedDevice) -> Bool) async throws {
        let world = sim.world
        let device = device
        try await withDeadline(within, what) {
            let changes = world.changes.subscribe()
            if predicate(try world.device(device)) { return }
            for await _ in changes where predicate(try world.device(device)) { return }
        }
    }
}

import Synchronization
