import Foundation
import Hummingbird
import HummingbirdCore
import IsleAPNs
public import IsleCore
import IsleHTTPAPI
public import IsleStore
import IsleDelivery
public import Logging
import NIOCore
public import ServiceLifecycle
import Synchronization

/// The Isle server: the HTTP API and the delivery engine over one store, as one `Service` for the
/// caller's `ServiceGroup` (which owns signals and graceful shutdown).
///
/// `run()` claims the store for this process, runs the migrations, and only then starts the
/// engine and the HTTP server (Hummingbird's `Application.run()`, with the engine as one of its
/// services): nothing serves a database that is not migrated.
public final class IsleServerApp: Service {
    public let store: any IsleStore
    public let engine: DeliveryEngine
    let topics: TopicAudiences
    let renewals: Renewals
    /// Sweeps finished since start: of topic channels to close, and of renewals due (what a test
    /// waits on to see that a sweep ran and did nothing).
    public var topicSweeps: Int { topics.sweeps.load(ordering: .relaxed) }
    public var renewalSweeps: Int { renewals.sweeps.load(ordering: .relaxed) }
    public let configuration: ServerConfiguration
    let clients: APNsClients
    let clock: any WallClock
    let logger: Logger
    let application: Application<RouterResponder<IsleRequestContext>>
    let portBox = PortBox()
    /// Open connections per client address.
    let connections: ConnectionLimiter

    public init(configuration: ServerConfiguration, store: any IsleStore, clock: any WallClock = SystemWallClock(), logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.clock = clock
        self.logger = logger
        clients = APNsClients(targets: configuration.apnsTargets, defaultEnvironment: configuration.defaultEnvironment, requestTimeout: configuration.requestTimeout, transport: configuration.apnsTransport,
                              masterKey: configuration.masterKey, clock: clock, logger: logger)
        engine = DeliveryEngine(store: store, configuration: configuration, clients: clients, clock: clock, logger: logger)
        let topics = TopicAudiences(store: store, clients: clients, apps: engine.apps, configuration: configuration, clock: clock, logger: logger)
        let renewals = Renewals(store: store, engine: engine, configuration: configuration, clock: clock, logger: logger)
        self.topics = topics
        self.renewals = renewals
        let services = APIServices(lookups: store, engine: engine, topics: topics, renewals: renewals, clock: clock, logger: logger, environmentName: configuration.apnsDescription,
                                                                   configuration: configuration,
                                                                   authFailures: KeyedRateLimiter(configuration.authFailureLimit, what: "this address sent wrong keys: it", clock: clock),
                                                                   apiKeys: APIKeyDirectory(store: store),
                                                                   newInstallations: CreationQuota(perHour: configuration.quotas.newInstallationsPerAddressPerHour, what: "installations", clock: clock),
                                                                   newActivities: CreationQuota(perHour: configuration.quotas.newActivitiesPerAddressPerHour, what: "activities", clock: clock))
        let router = Self.buildRouter(services: services, store: store, limiter: RateLimiter(limits: configuration.rateLimits, clock: clock),
                                      perInstallation: KeyedRateLimiter(configuration.deviceInstallationLimit, what: "this installation", clock: clock),
                                      perAddress: KeyedRateLimiter(configuration.deviceAddressLimit, what: "this address", clock: clock))
        let webhooks = WebhookDispatcher(store: store, bell: engine.events, clock: clock, settings: configuration.webhooks, masterKey: configuration.masterKey, logger: logger,
                                         metrics: engine.counters.metrics)
        let box = portBox
        let timeouts = configuration.timeouts
        let tls = configuration.tls
        let connections = ConnectionLimiter(perAddress: configuration.quotas.connectionsPerAddress, exempt: configuration.trustedProxies)
        self.connections = connections
        // Stopped in reverse order: the history writes last, after the engine's last completions.
        var running: [any Service] = [engine.history, engine, webhooks, topics, renewals]
        if let tls { running.append(TLSReloader(credentials: tls, interval: configuration.tlsReloadInterval, logger: logger)) }
        application = Application(router: router,
                                  server: HTTPServerBuilder { responder in
                                      let http = DeadlineHTTP1Channel(responder: responder, timeouts: timeouts, connections: connections, logger: logger)
                                      if let tls { return ReloadingTLSChannel(base: http, credentials: tls) }
                                      return http
                                  },
                                  configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "Isle"),
                                  services: running, onServerRunning: { box.set($0.localAddress?.port ?? 0) }, logger: logger)
    }

    /// The API: operations at the root; everything under `/v1` behind the API-key and idempotency
    /// middleware; one controller per resource.
    static func buildRouter(services: APIServices, store: any IsleStore, limiter: RateLimiter?, perInstallation: KeyedRateLimiter? = nil, perAddress: KeyedRateLimiter? = nil) -> Router<IsleRequestContext> {
        let router = Router(context: IsleRequestContext.self)
        // HTTPS: browsers keep to HTTPS for a year (docs/security.md).
        if services.configuration.tls != nil { router.add(middleware: HSTSMiddleware()) }
        if let tracer = services.configuration.tracer { router.add(middleware: RequestTracingMiddleware(tracer: tracer, keys: services.apiKeys)) }
        router.add(middleware: AccessLogMiddleware(logger: services.logger, enabled: services.configuration.accessLog))
        router.add(middleware: ClientAddressMiddleware(trusted: services.configuration.trustedProxies))
        router.add(middleware: APIMetricsMiddleware(metrics: services.engine.counters.metrics))
        router.add(middleware: ErrorMiddleware(logger: services.logger))
        let operations = OperationsController(services: services, store: store)
        operations.addRoutes(to: router)
        let v1 = router.group("v1")
            .add(middleware: APIKeyMiddleware(keys: services.apiKeys, limiter: limiter, authFailures: services.authFailures, perInstallation: perInstallation, perAddress: perAddress))
            .add(middleware: IdempotencyMiddleware(store: store, clock: services.clock, bodyLimit: Limits.body))
        operations.addRoutes(to: v1)
        InstallationController(services: services, store: store).addRoutes(to: v1)
        TopicController(services: services, store: store).addRoutes(to: v1)
        ActivityController(services: services, store: store).addRoutes(to: v1)
        ChannelController(services: services, store: store).addRoutes(to: v1)
        DeliveryController(services: services, store: store).addRoutes(to: v1)
        EventsController(services: services, store: store).addRoutes(to: v1)
        JobController(services: services, store: store).addRoutes(to: v1)
        // The operator console: HTML pages behind an admin key, outside the API.
        ConsoleController(services: services, store: store).addRoutes(to: router)
        return router
    }

    /// The port the API listens on, once it does; 0 if the server stopped before listening
    /// (`run()` throws the reason).
    public func port() async -> Int { await portBox.wait() }

    public func run() async throws {
        // Whoever waits for the port must not wait forever when the server cannot start: they get
        // 0, and this method's error says why.
        defer { portBox.set(0, ifUnset: true) }
        // One serving process per SQLite file: a second one stops here with the reason.
        let hold = try store.holdForServing()
        defer { hold.release() }
        do {
            try await store.migrate()
            try await application.run()
        } catch {
            await clients.shutdown()
            throw error
        }
        await clients.shutdown()
    }
}

final class PortBox: Sendable {
    private let state = Mutex<(Int?, [CheckedContinuation<Int, Never>])>((nil, []))
    func set(_ p: Int, ifUnset: Bool = false) {
        let waiters = state.withLock { s -> [CheckedContinuation<Int, Never>] in
            if ifUnset, s.0 != nil { return [] }
            s.0 = p
            defer { s.1.removeAll() }
            return s.1
        }
        for w in waiters { w.resume(returning: p) }
    }
    func wait() async -> Int {
        await withCheckedContinuation { c in
            let p = state.withLock { s -> Int? in
                if let p = s.0 { return p }
                s.1.append(c)
                return nil
            }
            if let p { c.resume(returning: p) }
        }
    }
}
