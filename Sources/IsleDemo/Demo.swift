import AsyncHTTPClient
import Crypto
import Foundation
import Hummingbird
import IsleCore
import IsleServer
public import IsleSimulator
import IsleStore
import IsleDelivery
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// `isle demo`: a simulated iPhone with the pizza-delivery app (ActivityKit + IsleClient, in
/// Swift), the Isle server on a temporary SQLite file, and a scripted backend over HTTP, the
/// server talking HTTP/2 + TLS to the fake APNs. Each step checks what the phone shows and fails the demo if it does not.
public struct Demo: Sendable {
    public struct Options: Sendable {
        /// Virtual seconds per real second while the demo waits for time to pass.
        public var speed: Double = 600
        /// Wait for Enter between steps.
        public var step = false
        /// JSON lines instead of the terminal view.
        public var json = false
        /// The simulated iPhone's rules (budgets, lifetimes); the scenario expects the defaults,
        /// so changing them is how a test shows the demo failing when the phone disagrees.
        /// `isle sim`'s defaults — Apple's leeway on — but for what the script's subject switches
        /// off: each step is checked on the phone as it lands, and the virtual clock moves only
        /// between steps, so priority 5 and a widgets push are applied at once (the defaults wait a
        /// seeded 0.5–3 s, and up to a minute for WidgetKit) and no priority 5 is lost (Apple may
        /// lose one; docs/simulator.md, "Never kinder than Apple").
        public var device: SimulatorConfiguration = {
            var c = SimulatorConfiguration()
            c.lowPriorityDelay = 0
            c.lowPriorityDelayMaximum = nil
            c.lowPriorityLossProbability = 0
            c.widgetPushDelayMaximum = 0
            return c
        }()
        /// Where to keep the server's database when the demo ends (a copy of the SQLite file);
        /// nil deletes it with the run. For looking at what Isle stored, or `isle db copy`.
        public var keepDatabase: String?
        public init() {}
    }

    public struct Failure: Error, CustomStringConvertible {
        public let step: Int
        public let expectation: String
        public let found: String
        public var description: String { "step \(step): expected \(expectation); found \(found)" }
    }

    let options: Options
    let out: @Sendable (String) -> Void
    let progress: @Sendable (String) -> Void
    let waitForEnter: @Sendable () async -> Void

    /// - Parameters:
    ///   - out: the view (or JSON lines), one line per call.
    ///   - progress: what the demo is waiting for while services start (stderr in the CLI).
    ///   - waitForEnter: blocks until the person presses Enter (`--step`).
    public init(options: Options, out: @escaping @Sendable (String) -> Void, progress: @escaping @Sendable (String) -> Void, waitForEnter: @escaping @Sendable () async -> Void = {}) {
        self.options = options
        self.out = out
        self.progress = progress
        self.waitForEnter = waitForEnter
    }

    static let bundleID = "com.example.pizza"
    static let schemaText = """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes":   { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange" } }
        """
    /// Match night (step 8): a match's score, followed by fans.
    static let matchSchemaText = """
        { "attributesType": "MatchAttributes",
          "attributes":   { "home": "string", "away": "string" },
          "contentState": { "home": "int", "away": "int" } }
        """
    static let keyID = "DEMOKEY000"
    static let teamID = "DEMOTEAM00"

    /// Runs the scenario. Throws ``Failure`` when an expected device state is not reached.
    public func run() async throws {
        guard options.speed > 0 else { throw Failure(step: 0, expectation: "--speed above 0", found: "\(options.speed)") }
        var quiet = Logger(label: "isle.demo")
        quiet.logLevel = .critical
        let start = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        // One virtual clock for the phone and the server: the demo moves it through the
        // simulator's control API.
        let clock = ManualWallClock(start)
        progress("starting the simulator: fake APNs (HTTP/2 + TLS) and a simulated iPhone…")
        var simulator = IsleSim.Configuration()
        simulator.device = options.device
        try await IsleSim.withRunning(configuration: simulator, clock: clock, logger: quiet) { sim in
            progress("creating the server's database (a temporary SQLite file)…")
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-demo-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: dir) }
            let key = P256.Signing.PrivateKey()
            let store = try SQLiteStore(path: dir.appendingPathComponent("isle.sqlite").path)
            try await store.migrate()
            // First setup, as `isle app add` and `isle key create` do it: the key sealed with a
            // master key (one for this run; the database is deleted at the end).
            let masterKey = MasterKey.generate()
            // The pizza shop's backend signs registration tickets for its order keys, as
            // `isle app ticket-key create` sets up: Isle keeps the public key only.
            let ticketKey = P256.Signing.PrivateKey()
            let ticketKeyID = "tk_pizzashop"
            try await store.upsertApp(AppRecord(bundleID: Self.bundleID, teamID: Self.teamID, keyID: Self.keyID, keyPEM: masterKey.seal(key.pemRepresentation, bundleID: Self.bundleID),
                                                schemas: [try ActivitySchema(jsonText: Self.schemaText), try ActivitySchema(jsonText: Self.matchSchemaText)], createdAt: start,
                                                ticketKeys: [TicketKey(id: ticketKeyID, publicKeyPEM: ticketKey.publicKey.pemRepresentation, createdAt: start)]))
            let ticket: @Sendable (String) -> String? = { order in
                try? RegistrationTicket(bundleID: Self.bundleID, expires: clock.now.addingTimeInterval(3600), externalKey: order).signed(with: ticketKey, keyID: ticketKeyID)
            }
            let backendKey = try await ServerSetup.createKey(store: store, bundleID: Self.bundleID, scope: .backend).secret
            let deviceKey = try await ServerSetup.createKey(store: store, bundleID: Self.bundleID, scope: .device).secret
            var c = ServerConfiguration()
            c.port = 0
            c.database = dir.appendingPathComponent("isle.sqlite").path
            c.sendBothEnvironments(to: .custom(url: sim.apnsURL, broadcastURL: sim.broadcastURL, managementURL: sim.managementURL, trustRootsPEM: sim.caCertificatePEM))
            c.masterKey = masterKey
            let server = IsleServerApp(configuration: c, store: store, clock: clock, logger: quiet)

            // The pizza shop's widget data: the "favorite pizza" timeline the widget fetches.
            let favorite = FavoritePizza("Margherita")
            let widgetRouter = Router()
            widgetRouter.get("favorite") { _, _ -> Response in
                let body: JSONValue = ["entries": [["date": .int(Int64(clock.now.timeIntervalSince1970)), "content": ["pizza": .string(favorite.name)]]], "policy": ["never": [:]]]
                return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body.jsonBytes)))
            }
            let widgetPort = WidgetPort()
            let widgetApp = Application(router: widgetRouter, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                                        onServerRunning: { widgetPort.set($0.localAddress?.port ?? 0) }, logger: quiet)

            let group = ServiceGroup(configuration: .init(services: [server, widgetApp], gracefulShutdownSignals: [], logger: quiet))
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                let http = HTTPClient(eventLoopGroupProvider: .singleton)
                do {
                    progress("waiting for the server's HTTP API…")
                    let serverURL = "http://127.0.0.1:\(await server.port())"
                    progress("waiting for the widget's data source…")
                    let widgetURL = "http://127.0.0.1:\(await widgetPort.wait())/favorite"
                    let control = await sim.controlURL()
                    progress("ready: Isle server \(serverURL) · fake APNs \(sim.apnsURL) · simulator control \(control)")
                    // The script's phone is the simulator's first device.
                    progress("watch the phone in a browser: \(control)/phone/device-1\(options.step ? "" : " (add --step to go at your own pace)")")
                    let script = Script(view: DemoView(json: options.json, out: out), options: options, http: http,
                                        endpoints: .init(server: serverURL, control: control, backendKey: backendKey, deviceKey: deviceKey, widgetURL: widgetURL,
                                                         keyID: Self.keyID, teamID: Self.teamID, publicKeyPEM: key.publicKey.pemRepresentation, ticket: ticket),
                                        favorite: favorite, world: sim.world, appStorage: dir.appendingPathComponent("isle-client.json").path, waitForEnter: waitForEnter)
                    try await script.play()
                    try await http.shutdown()
                    await group.triggerGracefulShutdown()
                    try await tasks.waitForAll()
                    if let keep = options.keepDatabase {
                        // The server has stopped: the file is complete (its WAL checkpointed into it by the copy).
                        try await store.backup(to: keep)
                        progress("the server's database is kept at \(keep)")
                    }
                } catch {
                    try? await http.shutdown()
                    await group.triggerGracefulShutdown()
                    try? await tasks.waitForAll()
                    throw error
                }
            }
        }
    }
}

/// The widget's data: the backend changes it, the widget's timeline source serves it.
final class FavoritePizza: Sendable {
    private let state: Mutex<String>
    init(_ name: String) { state = Mutex(name) }
    var name: String { state.withLock { $0 } }
    func set(_ name: String) { state.withLock { $0 = name } }
}

final class WidgetPort: Sendable {
    private let stream: AsyncStream<Int>
    private let continuation: AsyncStream<Int>.Continuation
    init() { (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1)) }
    func set(_ p: Int) { continuation.yield(p) }
    func wait() async -> Int {
        for await p in stream { return p }
        return 0
    }
}
