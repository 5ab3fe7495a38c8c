public import Foundation
import Hummingbird
import IsleAPNs
public import IsleCore
public import IsleStore
public import Logging
import NIOCore
public import ServiceLifecycle
import Synchronization

/// The Isle server: the HTTP API and the delivery engine over one store, as one Service.
public final class IsleServerApp: Service {
    public let store: any IsleStore
    public let engine: DeliveryEngine
    public let configuration: ServerConfiguration
    let clients: APNsClients
    let clock: any WallClock
    let logger: Logger
    let application: Application<RouterResponder<BasicRequestContext>>
    let portBox = PortBox()

    public init(configuration: ServerConfiguration, store: any IsleStore, clock: any WallClock = SystemWallClock(), logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.clock = clock
        self.logger = logger
        clients = APNsClients(environment: configuration.apns, requestTimeout: configuration.requestTimeout, transport: configuration.apnsTransport,
                              masterKey: configuration.masterKey, clock: clock, logger: logger)
        engine = DeliveryEngine(store: store, configuration: configuration, clients: clients, clock: clock, logger: logger)
        let router = Router()
        let box = portBox
        let api = API(store: store, engine: engine, clock: clock, logger: logger, limiter: RateLimiter(limits: configuration.rateLimits, clock: clock))
        router.add(middleware: WriteTimingMiddleware(metrics: engine.counters.metrics))
        router.add(middleware: ErrorMiddleware(logger: logger))
        api.addRoutes(to: router)
        application = Application(router: router, configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "Isle"),
                                  onServerRunning: { box.set($0.localAddress?.port ?? 0) }, logger: logger)
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
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await self.engine.run() }
                group.addTask { try await self.application.runService() }
            }
        } catch {
            await clients.shutdown()
            throw error
        }
        await clients.shutdown()
    }
}

/// Turns any error that is not an API error into a 500 without details (and logs it); bad
/// input never gets here — handlers answer it with 4xx.
struct ErrorMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext
    let logger: Logger
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let e as APIError {
            throw e
        } catch let e as StoreError where e.code == .unavailable {
            logger.error("the database is unavailable", metadata: ["http.path": "\(request.uri.path)", "error": "\(e.message)"])
            throw APIError(.serviceUnavailable, "databaseUnavailable", "the database is unavailable right now; nothing was changed — retry shortly", retryAfter: 1)
        } catch let e as HTTPError {
            // No route: a documented path asked with a method it does not take is a 405 naming
            // the ones it does.
            if e.status == .notFound, let allowed = OpenAPIDocument.methods(forPath: request.uri.path), !allowed.isEmpty {
                throw APIError(.methodNotAllowed, "methodNotAllowed", "\(request.uri.path) takes \(allowed.joined(separator: ", ")), not \(request.method.rawValue)", allow: allowed.joined(separator: ", "))
            }
            throw APIError(e.status, e.status == .notFound ? "notFound" : "badRequest", e.body ?? "\(e.status.reasonPhrase)")
        } catch {
            logger.error("request failed", metadata: ["http.path": "\(request.uri.path)", "error": "\(error)"])
            throw APIError(.internalServerError, "internal", "the server could not complete the request")
        }
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

/// Times every API write (POST, PUT, DELETE under /v1) for `isle_api_write_seconds{status}`.
struct WriteTimingMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext
    let metrics: ServerMetrics
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.method != .get, request.method != .head, request.uri.path.hasPrefix("/v1/") else { return try await next(request, context) }
        let start = ContinuousClock.now
        do {
            let response = try await next(request, context)
            metrics.accepted(status: response.status.code, duration: ContinuousClock.now - start)
            return response
        } catch let error as HTTPResponseError {
            metrics.accepted(status: error.status.code, duration: ContinuousClock.now - start)
            throw error
        }
    }
}
