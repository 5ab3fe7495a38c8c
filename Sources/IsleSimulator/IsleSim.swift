public import Foundation
import Hummingbird
public import IsleCore
public import IsleHTTP2Server
public import Logging
import NIOCore
public import ServiceLifecycle
import Synchronization

/// The whole simulator: the fake APNs (HTTP/2 + TLS) and the control API (HTTP/1.1), as one Service.
public final class IsleSim: Service {
    public struct Configuration: Sendable {
        public var host = "127.0.0.1"
        /// 0 picks a free port.
        public var apnsPort = 0
        public var controlHost = "127.0.0.1"
        public var controlPort = 0
        /// Binding anything but loopback needs this (the control API has no authentication).
        public var allowNonLoopback = false
        public var environment: SimulatedEnvironment = .sandbox
        public var device = SimulatorConfiguration()
        /// A certificate chain and key (PEM) to serve instead of generating them.
        public var certificateChainPEM: String?
        public var privateKeyPEM: String?
        /// Where to write the CA certificate (PEM) so clients can trust it.
        public var caCertificatePath: String?
        public init() {}
    }

    public let world: SimulatorWorld
    public let apns: FakeAPNs
    public let apnsServer: HTTP2TLSServer
    /// PEM of the CA that signed the fake APNs' certificate (nil when the user supplied one).
    public let caCertificatePEM: String?
    let application: Application<RouterResponder<BasicRequestContext>>
    let controlPortBox = ControlPort()

    public var apnsURL: String { apnsServer.baseURL }

    public static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }

    /// Binds the fake APNs now. The control API binds when ``run()`` starts; await ``controlURL()``.
    public init(configuration: Configuration, clock: any WallClock, logger: Logger) async throws {
        for host in [configuration.host, configuration.controlHost] where !Self.isLoopback(host) && !configuration.allowNonLoopback {
            throw SimulatorError(.invalidArgument, "refusing to listen on \(host): the simulator is for loopback; pass allowNonLoopback (--allow-non-loopback) if you mean it", field: "host")
        }
        world = SimulatorWorld(configuration: configuration.device, environment: configuration.environment, clock: clock)
        apns = FakeAPNs(world: world, logger: logger)
        var chain = configuration.certificateChainPEM
        var key = configuration.privateKeyPEM
        if chain == nil || key == nil {
            let ca = try CertificateAuthority(commonName: "Isle Simulator CA")
            let leaf = try ca.issueServerCertificate()
            chain = leaf.certificatePEM
            key = leaf.privateKeyPEM
            caCertificatePEM = ca.certificatePEM
        } else {
            caCertificatePEM = nil
        }
        if let path = configuration.caCertificatePath, let pem = caCertificatePEM ?? configuration.certificateChainPEM {
            try pem.write(toFile: path, atomically: true, encoding: .utf8)
        }
        let fake = apns
        apnsServer = try await HTTP2TLSServer.bind(
            configuration: .init(host: configuration.host, port: configuration.apnsPort, certificateChainPEM: chain!, privateKeyPEM: key!),
            logger: logger
        ) { request in await fake.handle(request) }
        let router = Router()
        ControlAPI(world: world, apns: apns).addRoutes(to: router)
        let box = controlPortBox
        application = Application(
            router: router,
            configuration: .init(address: .hostname(configuration.controlHost, port: configuration.controlPort), serverName: "IsleSimulator"),
            onServerRunning: { channel in box.set(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        controlHost = configuration.controlHost
    }

    let controlHost: String

    /// The control API's base URL, once it listens.
    public func controlURL() async -> String {
        let port = await controlPortBox.wait()
        let h = controlHost.contains(":") ? "[\(controlHost)]" : controlHost
        return "http://\(h):\(port)"
    }

    public func run() async throws {
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await self.apnsServer.run() }
            group.addTask { try await self.application.runService() }
        }
    }

    /// Runs a simulator for the duration of `body`, then stops it.
    public static func withRunning<R: Sendable>(configuration: Configuration = .init(), clock: any WallClock, logger: Logger = Logger(label: "isle.sim"), _ body: (IsleSim) async throws -> R) async throws -> R {
        let sim = try await IsleSim(configuration: configuration, clock: clock, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [sim], gracefulShutdownSignals: [], logger: logger))
        return try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            do {
                _ = await sim.controlURL()
                let r = try await body(sim)
                await group.triggerGracefulShutdown()
                try await tasks.waitForAll()
                return r
            } catch {
                await group.triggerGracefulShutdown()
                try? await tasks.waitForAll()
                throw error
            }
        }
    }
}

/// The control port, known once the server runs.
final class ControlPort: Sendable {
    private let state = Mutex<(port: Int?, waiters: [CheckedContinuation<Int, Never>])>((nil, []))
    func set(_ port: Int) {
        let waiters = state.withLock { s -> [CheckedContinuation<Int, Never>] in
            s.port = port
            defer { s.waiters.removeAll() }
            return s.waiters
        }
        for w in waiters { w.resume(returning: port) }
    }
    func wait() async -> Int {
        await withCheckedContinuation { c in
            let ready = state.withLock { s -> Int? in
                if let p = s.port { return p }
                s.waiters.append(c)
                return nil
            }
            if let ready { c.resume(returning: ready) }
        }
    }
}
