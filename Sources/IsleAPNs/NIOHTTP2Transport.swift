import Foundation
public import Logging
public import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization

/// ``APNsTransport`` on swift-nio-http2 directly, made for APNs: a small pool of long-lived
/// HTTP/2 connections per host, frames written straight onto the connection (no channel per
/// stream), one flush per event-loop tick for everything queued in it, answers read from the
/// single HEADERS frame APNs sends, bodies only on errors.
///
/// - Each connection honours the server's `SETTINGS_MAX_CONCURRENT_STREAMS` (APNs raises it after
///   the first valid provider token); requests beyond it wait on the connection, and another
///   connection is opened while every open one is full, up to ``Configuration/maximumConnectionsPerHost``.
///   A connection counts as one stream until its server's first SETTINGS, as APNs allows one
///   stream until a valid provider token: a cold burst spreads over new connections instead of
///   queueing behind one whose limit is not known yet.
/// - `GOAWAY`: streams above the server's `lastStreamID` (never processed) and requests still waiting
///   are sent again on another connection; streams the server may have processed are reported,
///   never sent twice. A connection lost without `GOAWAY` reports its open streams the same way.
/// - Health: a `PING` after ``Configuration/pingInterval`` without traffic; no answer within
///   ``Configuration/pingTimeout`` closes the connection. Connections idle for
///   ``Configuration/idleTimeout`` are closed.
/// - Provider tokens: a connection carries one provider token (`authorization`) for its whole
///   life. APNs answers 429 `TooManyProviderTokenUpdates` — and keeps the connection unusable
///   for a while — when a connection sees a new token less than 20 minutes after its previous
///   one, which a connection opened late in a token's hour would (docs/protocol.md §1.3). So a
///   request with a newer token of the same key goes to a new connection, and the key's
///   connections with the older token finish what they carry and close. A 429
///   `TooManyProviderTokenUpdates` retires its connection the same way.
/// - Back-pressure: callers wait (within their timeout) while every connection is full; past
///   ``Configuration/maximumQueuedRequests`` waiting requests, new ones fail at once with
///   ``APNsTransportError/Kind/overloaded``.
public final class NIOHTTP2Transport: APNsTransport {
    public struct Configuration: Sendable {
        /// CA certificates (PEM) to trust instead of the system's roots (for a fake APNs).
        public var trustRootsPEM: String?
        /// TCP connect + TLS handshake + the server's first SETTINGS.
        public var connectTimeout: Duration
        public var maximumConnectionsPerHost: Int
        /// Our own cap on streams per connection, below whatever the server allows.
        public var maximumStreamsPerConnection: Int
        /// Requests waiting for a stream, over all connections, before new ones are refused.
        public var maximumQueuedRequests: Int
        public var pingInterval: Duration
        public var pingTimeout: Duration
        public var idleTimeout: Duration
        /// Error bodies larger than this are cut off and the request fails.
        public var maximumResponseBody: Int

        public init(trustRootsPEM: String? = nil, connectTimeout: Duration = .seconds(10), maximumConnectionsPerHost: Int = 4,
                    maximumStreamsPerConnection: Int = 1000, maximumQueuedRequests: Int = 100_000,
                    pingInterval: Duration = .seconds(60), pingTimeout: Duration = .seconds(10), idleTimeout: Duration = .seconds(600),
                    maximumResponseBody: Int = 64 * 1024) {
            self.trustRootsPEM = trustRootsPEM
            self.connectTimeout = connectTimeout
            self.maximumConnectionsPerHost = maximumConnectionsPerHost
            self.maximumStreamsPerConnection = maximumStreamsPerConnection
            self.maximumQueuedRequests = maximumQueuedRequests
            self.pingInterval = pingInterval
            self.pingTimeout = pingTimeout
            self.idleTimeout = idleTimeout
            self.maximumResponseBody = maximumResponseBody
        }
    }

    let pool: APNsConnectionPool

    public init(configuration: Configuration = .init(), eventLoopGroup: (any EventLoopGroup)? = nil,
                logger: Logger = Logger(label: "isle.apns.transport")) throws(APNsTransportError) {
        guard configuration.maximumConnectionsPerHost >= 1, configuration.maximumStreamsPerConnection >= 1, configuration.maximumQueuedRequests >= 1 else {
            throw APNsTransportError(kind: .other, reason: "maximumConnectionsPerHost, maximumStreamsPerConnection and maximumQueuedRequests must be at least 1")
        }
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["h2"]
        if let pem = configuration.trustRootsPEM {
            let roots: [NIOSSLCertificate]
            do { roots = try NIOSSLCertificate.fromPEMBytes(Array(TrustRoots.normalized(pem).utf8)) } catch {
                throw APNsTransportError(kind: .tlsFailed, reason: "the trust roots are not valid PEM certificates")
            }
            guard !roots.isEmpty else { throw APNsTransportError(kind: .tlsFailed, reason: "no certificate found in the trust roots PEM") }
            tls.trustRoots = .certificates(roots)
        }
        let context: NIOSSLContext
        do { context = try NIOSSLContext(configuration: tls) } catch {
            throw APNsTransportError(kind: .tlsFailed, reason: "could not set up TLS: \(error)")
        }
        pool = APNsConnectionPool(configuration: configuration, sslContext: context, group: eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton, logger: logger)
    }

    public func execute(_ request: APNsTransportRequest, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse {
        let prepared = try PreparedRequest(request)
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        return try await pool.execute(prepared, deadline: deadline, timeout: timeout)
    }

    public func shutdown() async throws { await pool.shutdown() }

    /// Open (or opening) connections, for tests and benchmarks.
    public var connectionCount: Int { pool.connectionCount }
    /// Connections opened since the transport was made.
    public var connectionsOpened: Int { pool.connectionsOpened }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let clamped = min(max(seconds, -9_000_000_000), 9_000_000_000)
        self = .nanoseconds(clamped * 1_000_000_000 + attoseconds / 1_000_000_000)
    }
}

/// Where a request goes: one pool of connections per host and port.
struct APNsHostKey: Hashable, Sendable, CustomStringConvertible {
    var host: String
    var port: Int
    var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// A request ready for the wire: its header block and body, built off the event loop.
struct PreparedRequest: Sendable {
    var key: APNsHostKey
    var headers: HPACKHeaders
    var body: ByteBuffer
    /// Which provider token the request carries (a hash of its `authorization` value), and which
    /// key signed it (a hash of the JWT's header, the same for every token of a key): a connection
    /// carries one token; a newer token of its key replaces it with a new connection.
    var credential: ProviderCredential

    /// Headers whose values change with every push are kept out of HPACK's dynamic table, so
    /// the ones that repeat (the JWT, topic, push type) stay in it and cost a byte or two.
    static func isVolatile(_ name: String) -> Bool {
        name == "apns-id" || name == "apns-expiration" || name == "apns-collapse-id" || name == "content-length" || name == "apns-request-id"
    }

    init(_ request: APNsTransportRequest) throws(APNsTransportError) {
        let url = request.url
        guard url.hasPrefix("https://") else {
            throw APNsTransportError(kind: .other, reason: "only https:// URLs can be sent over HTTP/2 with TLS (got \(url.prefix(40)))")
        }
        let rest = url.dropFirst("https://".count)
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        let authority = rest[..<slash]
        let path = slash == rest.endIndex ? "/" : String(rest[slash...])
        var host = Substring(authority)
        var port = 443
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { throw APNsTransportError(kind: .other, reason: "the URL's IPv6 host has no closing ]") }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if after.hasPrefix(":") {
                guard let p = Int(after.dropFirst()), (1...65535).contains(p) else { throw APNsTransportError(kind: .other, reason: "the URL's port is not a number from 1 to 65535") }
                port = p
            }
        } else if let colon = authority.lastIndex(of: ":") {
            host = authority[..<colon]
            guard let p = Int(authority[authority.index(after: colon)...]), (1...65535).contains(p) else {
                throw APNsTransportError(kind: .other, reason: "the URL's port is not a number from 1 to 65535")
            }
            port = p
        }
        guard !host.isEmpty else { throw APNsTransportError(kind: .other, reason: "the URL has no host") }
        key = APNsHostKey(host: String(host), port: port)
        var h = HPACKHeaders()
        h.reserveCapacity(request.headers.count + 4)
        h.add(name: ":method", value: request.method)
        h.add(name: ":scheme", value: "https")
        h.add(name: ":authority", value: String(authority))
        h.add(name: ":path", value: path, indexing: .nonIndexable)
        for (name, value) in request.headers {
            h.add(name: name, value: value, indexing: Self.isVolatile(name) ? .nonIndexable : .indexable)
        }
        headers = h
        body = ByteBuffer(bytes: request.body)
        credential = ProviderCredential(authorization: request.value("authorization"))
    }
}

/// A request on its way: waiting for a stream, or on one.
struct PendingRequest: Sendable {
    var id: UInt64
    var request: PreparedRequest
    var deadline: NIODeadline
    var timeout: Duration
    var continuation: UnsafeContinuation<Result<APNsTransportResponse, APNsTransportError>, Never>
    /// Times this request was moved to another connection without having been processed.
    var moves: Int = 0

    func resume(_ result: Result<APNsTransportResponse, APNsTransportError>) { continuation.resume(returning: result) }
}

/// The connections of one transport, per host. Picking a connection is one lock; everything
/// else about a connection happens on its event loop.
final class APNsConnectionPool: Sendable {
    let configuration: NIOHTTP2Transport.Configuration
    let sslContext: NIOSSLContext
    let group: any EventLoopGroup
    let logger: Logger
    private let state = Mutex(State())
    private let nextRequestID = Atomic<UInt64>(0)
    private let opened = Atomic<Int>(0)
    /// Requests assigned to connections and not finished, over all hosts.
    let outstanding = Atomic<Int>(0)

    struct State {
        var connections: [APNsHostKey: [APNsConnection]] = [:]
        var nextConnectionID = 0
        var isShutDown = false
        /// Per signing key (``ProviderCredential/key``), the token its connections carry.
        var currentTokens: [UInt64: UInt64] = [:]
        /// Tokens replaced by newer ones (a few): a request still carrying one is a straggler.
        var retiredTokens: Set<UInt64> = []
        /// Connections out of rotation that still finish their requests (by id): cancellation
        /// and shutdown reach them too.
        var retiring: [Int: APNsConnection] = [:]
    }

    init(configuration: NIOHTTP2Transport.Configuration, sslContext: NIOSSLContext, group: any EventLoopGroup, logger: Logger) {
        self.configuration = configuration
        self.sslContext = sslContext
        self.group = group
        self.logger = logger
    }

    var connectionCount: Int { state.withLock { $0.connections.values.reduce(0) { $0 + $1.count } } }
    var connectionsOpened: Int { opened.load(ordering: .relaxed) }

    func execute(_ request: PreparedRequest, deadline: NIODeadline, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse {
        let id = nextRequestID.wrappingAdd(1, ordering: .relaxed).newValue
        let result = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Result<APNsTransportResponse, APNsTransportError>, Never>) in
                if Task.isCancelled {
                    continuation.resume(returning: .failure(APNsTransportError(kind: .cancelled, reason: "the request was cancelled")))
                    return
                }
                dispatch(PendingRequest(id: id, request: request, deadline: deadline, timeout: timeout, continuation: continuation))
            }
        } onCancel: {
            cancel(id)
        }
        return try result.get()
    }

    /// Hands a request to the least-loaded connection with a free stream, opening one when all are
    /// full and the host has room; otherwise to the least-loaded connection, where it waits.
    func dispatch(_ request: PendingRequest) {
        let limit = configuration.maximumConnectionsPerHost
        let queueLimit = configuration.maximumQueuedRequests + configuration.maximumConnectionsPerHost * configuration.maximumStreamsPerConnection
        enum Choice { case use(APNsConnection), open(APNsConnection), shutDown, overloaded }
        var replaced: [APNsConnection] = []
        let choice: Choice = state.withLock { s in
            if s.isShutDown { return .shutDown }
            if outstanding.load(ordering: .relaxed) >= queueLimit { return .overloaded }
            let credential = request.request.credential
            if s.currentTokens[credential.key] != credential.token {
                if s.retiredTokens.contains(credential.token) {
                    // Built with a token just replaced: a connection of its own, closed after it.
                    s.nextConnectionID += 1
                    let c = APNsConnection(id: s.nextConnectionID, key: request.request.key, credential: credential, loop: group.next(), pool: self)
                    c.counters.load.wrappingAdd(1, ordering: .relaxed)
                    c.counters.usable.store(false, ordering: .relaxed)
                    outstanding.wrappingAdd(1, ordering: .relaxed)
                    replaced.append(c)
                    s.retiring[c.id] = c
                    return .open(c)
                }
                // A newer token of a key: the key's connections with the older one take no more
                // requests (a connection must not see its token change within 20 minutes).
                if let old = s.currentTokens[credential.key] {
                    if s.retiredTokens.count >= 64 { s.retiredTokens.removeAll() }
                    s.retiredTokens.insert(old)
                }
                s.currentTokens[credential.key] = credential.token
                for c in s.connections.values.joined() where c.credential.key == credential.key && c.credential != credential {
                    replaced.append(c)
                }
                for c in replaced {
                    Self.unlist(c.counters, from: &s)
                    s.retiring[c.id] = c
                }
            }
            var list = s.connections[request.request.key] ?? []
            list.removeAll { $0.credential != credential }
            var best: APNsConnection?
            var bestLoad = Int.max
            var leastLoaded: APNsConnection?
            var leastLoad = Int.max
            for c in list where c.isUsable {
                let load = c.counters.load.load(ordering: .relaxed)
                if load < leastLoad { leastLoad = load; leastLoaded = c }
                if load < c.counters.limit.load(ordering: .relaxed), load < bestLoad { bestLoad = load; best = c }
            }
            if let best {
                best.counters.load.wrappingAdd(1, ordering: .relaxed)
                outstanding.wrappingAdd(1, ordering: .relaxed)
                return .use(best)
            }
            if list.count < limit || leastLoaded == nil {
                s.nextConnectionID += 1
                let c = APNsConnection(id: s.nextConnectionID, key: request.request.key, credential: credential, loop: group.next(), pool: self)
                s.connections[request.request.key, default: []].append(c)
                c.counters.load.wrappingAdd(1, ordering: .relaxed)
                outstanding.wrappingAdd(1, ordering: .relaxed)
                return .open(c)
            }
            leastLoaded!.counters.load.wrappingAdd(1, ordering: .relaxed)
            outstanding.wrappingAdd(1, ordering: .relaxed)
            return .use(leastLoaded!)
        }
        for c in replaced { c.closeWhenDone(reason: "a newer provider token") }
        switch choice {
        case .use(let c):
            c.submit(request)
        case .open(let c):
            opened.wrappingAdd(1, ordering: .relaxed)
            c.connect()
            c.submit(request)
        case .shutDown:
            request.resume(.failure(APNsTransportError(kind: .cancelled, reason: "the transport was shut down")))
        case .overloaded:
            request.resume(.failure(APNsTransportError(kind: .overloaded, reason: "more than \(configuration.maximumQueuedRequests) requests are waiting for a stream to APNs")))
        }
    }

    /// A connection gave a request back unprocessed (GOAWAY above its last stream, refused stream,
    /// connection lost before it was sent): send it on another connection, a few times at most.
    func move(_ request: PendingRequest, reason: String) {
        var request = request
        request.moves += 1
        if request.moves > 3 {
            request.resume(.failure(APNsTransportError(kind: .connectionFailed, reason: "the request could not be sent: \(reason) (tried on \(request.moves) connections)")))
            return
        }
        if request.deadline <= .now() {
            request.resume(.failure(APNsTransportError(kind: .timedOut, reason: "no answer within \(request.timeout)")))
            return
        }
        dispatch(request)
    }

    /// Takes a connection out of rotation.
    func retire(_ counters: APNsConnectionCounters) {
        state.withLock { s in Self.unlist(counters, from: &s) }
    }

    /// Marks the connection unusable and removes it from its host's list (under the pool's lock).
    fileprivate static func unlist(_ counters: APNsConnectionCounters, from s: inout State) {
        counters.usable.store(false, ordering: .relaxed)
        for (key, list) in s.connections {
            guard let index = list.firstIndex(where: { $0.counters === counters }) else { continue }
            var list = list
            list.remove(at: index)
            s.connections[key] = list.isEmpty ? nil : list
            return
        }
    }

    /// A connection closed: it is no longer anyone's to reach.
    func closed(_ connectionID: Int) {
        state.withLock { s in _ = s.retiring.removeValue(forKey: connectionID) }
    }

    /// Retires the connection only if nothing is assigned to it (checked under the lock that assigns).
    func retireIfIdle(_ counters: APNsConnectionCounters) -> Bool {
        // Assignments happen under this lock, so no request can be assigned between the check and
        // the connection leaving the list.
        state.withLock { s in
            guard counters.load.load(ordering: .relaxed) == 0 else { return false }
            Self.unlist(counters, from: &s)
            return true
        }
    }

    func cancel(_ id: UInt64) {
        let all = state.withLock { s in s.connections.values.flatMap { $0 } + s.retiring.values }
        for c in all { c.cancel(id) }
    }

    func shutdown() async {
        let all = state.withLock { s -> [APNsConnection] in
            s.isShutDown = true
            let all = s.connections.values.flatMap { $0 } + s.retiring.values
            s.retiring = [:]
            s.connections = [:]
            return all
        }
        for c in all { c.counters.usable.store(false, ordering: .relaxed) }
        await withTaskGroup(of: Void.self) { group in
            for c in all { group.addTask { await c.close() } }
        }
    }
}
