import Foundation
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
        /// 0 picks a free port. Device pushes (`api.push.apple.com`).
        public var apnsPort = 0
        /// Broadcasts (`api-broadcast.push.apple.com`) and channel management
        /// (`api-manage-broadcast.push.apple.com`) are served apart, as Apple does, so a client
        /// that mixes the hosts is caught; `singleHost` serves all three on `apnsPort` instead.
        public var broadcastPort = 0
        public var managementPort = 0
        public var singleHost = false
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
        /// More DNS names for the server certificate, beside `localhost`, 127.0.0.1 and ::1 — e.g.
        /// `api.sandbox.push.apple.com` for a library whose host is fixed, resolved to loopback.
        public var hostnames: [String] = []
        /// The CA that signs the server certificate (a team's own, or one kept in a folder);
        /// nil: a new one for this run.
        public var certificateAuthority: CertificateAuthority?
        public init() {}
    }

    public let world: SimulatorWorld
    public let apns: FakeAPNs
    public let apnsServer: HTTP2TLSServer
    public let broadcastServer: HTTP2TLSServer?
    public let managementServer: HTTP2TLSServer?
    /// PEM of the CA that signed the fake APNs' certificate (nil when the user supplied one).
    public let caCertificatePEM: String?
    let application: Application<RouterResponder<BasicRequestContext>>
    let controlPortBox = ControlPort()

    /// Device pushes (`/3/device/…`).
    public var apnsURL: String { apnsServer.baseURL }
    /// Broadcasts (`/4/broadcasts/…`); the device URL when served on a single host.
    public var broadcastURL: String { broadcastServer?.baseURL ?? apnsServer.baseURL }
    /// Channel management (`/1/apps/…/channels`); the device URL when served on a single host.
    public var managementURL: String { managementServer?.baseURL ?? apnsServer.baseURL }

    /// Whether `host` (a name or an address, IPv6 with or without brackets) is this machine's
    /// loopback: `localhost`, 127.0.0.0/8, `::1` or `::ffff:127.x.y.z`. Parsed as an address, so
    /// `127.evil.example` is not loopback.
    public static func isLoopback(_ host: String) -> Bool {
        var h = host
        if h.hasPrefix("["), h.hasSuffix("]") { h = String(h.dropFirst().dropLast()) }
        if h.lowercased() == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, h, &v4) == 1 {
            return UInt32(bigEndian: v4.s_addr) >> 24 == 127
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, h, &v6) == 1 {
            let bytes = withUnsafeBytes(of: v6) { Array($0) }
            if bytes[0..<15].allSatisfy({ $0 == 0 }), bytes[15] == 1 { return true }
            if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF { return bytes[12] == 127 }
        }
        return false
    }

    /// The host part of a `Host` header or URL authority: `[::1]:80` → `::1`, `127.0.0.1:8080` → `127.0.0.1`.
    static func hostPart(_ authority: String) -> String {
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
            return String(authority[authority.index(after: authority.startIndex)..<close])
        }
        if authority.filter({ $0 == ":" }).count == 1, let colon = authority.firstIndex(of: ":") { return String(authority[..<colon]) }
        return authority
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
            for name in configuration.hostnames where !CertificateAuthority.isValidDNSName(name) {
                throw SimulatorError(.invalidArgument, "hostname \"\(name)\" is not a DNS name (letters, digits, hyphens and dots; a leading *. for a wildcard)", field: "hostname")
            }
            let ca = try configuration.certificateAuthority ?? CertificateAuthority(commonName: "Isle Simulator CA")
            var names = ["localhost"]
            for name in configuration.hostnames where !names.contains(name.lowercased()) { names.append(name.lowercased()) }
            let leaf = try ca.issueServerCertificate(dnsNames: names)
            chain = leaf.certificatePEM
            key = leaf.privateKeyPEM
            caCertificatePEM = ca.certificatePEM
        } else {
            caCertificatePEM = nil
        }
        if let path = configuration.caCertificatePath, let pem = caCertificatePEM ?? configuration.certificateChainPEM {
            // Ends with a newline, as PEM files do: `cat` of several CA files stays valid.
            try (pem.hasSuffix("\n") ? pem : pem + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        }
        let fake = apns
        // APNs allows one stream until it has seen a valid provider token (docs/protocol.md §1.1);
        // FakeAPNs raises the limit with a SETTINGS frame then.
        func bind(_ port: Int, _ host: FakeAPNs.Host?) async throws -> HTTP2TLSServer {
            try await HTTP2TLSServer.bind(
                configuration: {
                    var c = HTTP2TLSServer.Configuration(host: configuration.host, port: port, certificateChainPEM: chain!, privateKeyPEM: key!, maxConcurrentStreams: 1)
                    c.admit = { fake.admitConnection() }
                    c.connectionEnded = { fake.connectionEnded($0) }
                    return c
                }(),
                logger: logger
            ) { request in await fake.handle(request, on: host) }
        }
        if configuration.singleHost {
            apnsServer = try await bind(configuration.apnsPort, nil)
            broadcastServer = nil
            managementServer = nil
        } else {
            apnsServer = try await bind(configuration.apnsPort, .device)
            broadcastServer = try await bind(configuration.broadcastPort, .broadcast)
            managementServer = try await bind(configuration.managementPort, .management)
        }
        let router = Router()
        if !configuration.allowNonLoopback { router.add(middleware: LoopbackOnlyMiddleware()) }
        ControlAPI(world: world, apns: apns, allowsNonLoopbackURLs: configuration.allowNonLoopback).addRoutes(to: router)
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
            if let b = self.broadcastServer { group.addTask { try await b.run() } }
            if let m = self.managementServer { group.addTask { try await m.run() } }
            // run(), not runService(): the caller's ServiceGroup owns signals and graceful shutdown.
            group.addTask { try await self.application.run() }
            // What comes due on its own in real time (push tokens after request, widget policy reloads).
            group.addTask { await cancelWhenGracefulShutdown { await self.world.runTicker() } }
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
