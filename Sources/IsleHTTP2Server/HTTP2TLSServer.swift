import Foundation
public import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
public import ServiceLifecycle
import Synchronization

/// One complete HTTP/2 request as the server received it.
public struct HTTP2ServerRequest: Sendable {
    public var method: String
    public var path: String
    public var authority: String?
    /// Every regular header in arrival order, duplicates kept, names lowercase.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// The connection it came on: ids are unique for the server's lifetime.
    public var connectionID: Int
    /// The HTTP/2 stream id.
    public var streamID: Int = 0
    /// Requests being handled on this connection when this one started, itself included: how many
    /// streams the client had open at once.
    public var concurrentStreams: Int = 1

    /// All values of a header.
    public func values(_ name: String) -> [String] { headers.filter { $0.name == name }.map(\.value) }
    /// The first value of a header.
    public func value(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

/// The answer to one request. An empty body is sent as a single HEADERS frame with END_STREAM,
/// exactly as APNs frames a success (clients such as aioapns break on an extra empty DATA frame).
public struct HTTP2ServerResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// After answering, send GOAWAY with this JSON reason and close the connection gracefully:
    /// `lastStreamID` is the highest stream the server has started on, those streams are still
    /// answered, later ones are refused (never processed), then the connection closes.
    public var goAwayReason: String?
    /// Wait this long before answering (simulated latency).
    public var delay: Duration?
    /// Instead of answering, close the TCP connection at once (a connection reset): every open
    /// stream on it is left without an answer.
    public var dropConnection: Bool
    /// With the answer, send a SETTINGS frame with this SETTINGS_MAX_CONCURRENT_STREAMS (as APNs
    /// raises the limit once it has seen a valid provider token).
    public var maxConcurrentStreams: Int?

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = [], goAwayReason: String? = nil, delay: Duration? = nil,
                dropConnection: Bool = false, maxConcurrentStreams: Int? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
        self.goAwayReason = goAwayReason
        self.delay = delay
        self.dropConnection = dropConnection
        self.maxConcurrentStreams = maxConcurrentStreams
    }
}

/// A connection the server's `admit` refused: closed before TLS.
struct ConnectionRefused: Error {}

/// A plain HTTP/2-over-TLS server (ALPN `h2`) on raw swift-nio-http2, for fakes and sinks.
///
/// ``bind(configuration:logger:handler:)`` binds at once so the port is known; ``run()`` serves
/// until its task is cancelled or the service group shuts down.
public final class HTTP2TLSServer: Service {
    /// Connection ids are unique in the process, not per listener: the fake APNs keeps each
    /// connection's provider-token state by id, and its three hosts (device, broadcast, channel
    /// management) are three listeners — numbered each from 1, a fresh connection to one host
    /// inherited another host's token history (429 TooManyProviderTokenUpdates).
    private static let connectionCounter = Atomic<Int>(0)
    public struct Configuration: Sendable {
        public var host: String
        /// 0 picks a free port.
        public var port: Int
        public var certificateChainPEM: String
        public var privateKeyPEM: String
        /// SETTINGS_MAX_CONCURRENT_STREAMS the server advertises.
        public var maxConcurrentStreams: Int
        /// Largest request body accepted; larger bodies are cut off and the stream reset.
        public var maxBodySize: Int
        /// Asked for each new connection as it is accepted: false closes it at once, before TLS
        /// (a server that blocks a client opening connections too fast).
        public var admit: (@Sendable () -> Bool)?
        /// Told each connection's id once it has ended (its requests all answered), so per-connection
        /// state kept elsewhere can go.
        public var connectionEnded: (@Sendable (Int) -> Void)?

        public init(host: String = "127.0.0.1", port: Int = 0, certificateChainPEM: String, privateKeyPEM: String, maxConcurrentStreams: Int = 1000, maxBodySize: Int = 1 << 20) {
            self.host = host
            self.port = port
            self.certificateChainPEM = certificateChainPEM
            self.privateKeyPEM = privateKeyPEM
            self.maxConcurrentStreams = maxConcurrentStreams
            self.maxBodySize = maxBodySize
        }
    }

    public typealias Handler = @Sendable (HTTP2ServerRequest) async -> HTTP2ServerResponse
    typealias StreamChannel = NIOAsyncChannel<HTTP2Frame.FramePayload, HTTP2Frame.FramePayload>
    /// A stream and its id, read on the event loop as the stream opens (asking later is a hop to
    /// the event loop and back for every request).
    typealias Stream = (id: Int, channel: StreamChannel)
    typealias Connection = (id: Int, channel: any Channel, multiplexer: NIOHTTP2Handler.AsyncStreamMultiplexer<Stream>)

    /// Streams in progress on one connection, for a graceful GOAWAY.
    final class ConnectionStreams: Sendable {
        struct State {
            /// Streams being handled, until everything after their last frame is done (GOAWAY's
            /// close waits for zero).
            var inFlight = 0
            /// Streams open as HTTP/2 sees them: until their final frame is written. A client may
            /// open the next stream as soon as it reads that frame, possibly before this task has
            /// finished, so this, not `inFlight`, is what a request's `concurrentStreams` reports.
            var open = 0
            var highestStarted = 0
            var goAwayLast: Int?
        }
        let state = Mutex(State())
    }

    public let port: Int
    public let host: String
    private let serverChannel: NIOAsyncChannel<Connection, Never>
    private let handler: Handler
    private let logger: Logger
    private let maxBodySize: Int

    private let connectionEnded: (@Sendable (Int) -> Void)?

    private init(serverChannel: NIOAsyncChannel<Connection, Never>, host: String, port: Int, handler: @escaping Handler, logger: Logger, maxBodySize: Int,
                 connectionEnded: (@Sendable (Int) -> Void)? = nil) {
        self.connectionEnded = connectionEnded
        self.serverChannel = serverChannel
        self.host = host
        self.port = port
        self.handler = handler
        self.logger = logger
        self.maxBodySize = maxBodySize
    }

    /// Binds the listening socket now; call ``run()`` to serve.
    public static func bind(configuration: Configuration, logger: Logger, handler: @escaping Handler) async throws -> HTTP2TLSServer {
        let chain = try NIOSSLCertificate.fromPEMBytes(Array(configuration.certificateChainPEM.utf8))
        let key = try NIOSSLPrivateKey(bytes: Array(configuration.privateKeyPEM.utf8), format: .pem)
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.applicationProtocols = ["h2"]
        tls.minimumTLSVersion = .tlsv12
        let sslContext = try NIOSSLContext(configuration: tls)
        var h2 = NIOHTTP2Handler.Configuration()
        h2.connection.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: configuration.maxConcurrentStreams),
            HTTP2Setting(parameter: .maxHeaderListSize, value: HPACKDecoder.defaultMaxHeaderListSize),
        ]
        let http2Configuration = h2
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 256)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: configuration.host, port: configuration.port) { channel in
                channel.eventLoop.makeCompletedFuture { () throws -> Connection in
                    if let admit = configuration.admit, !admit() {
                        channel.close(promise: nil)
                        throw ConnectionRefused()
                    }
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                    let multiplexer = try channel.pipeline.syncOperations.configureAsyncHTTP2Pipeline(mode: .server, configuration: http2Configuration) { stream in
                        stream.eventLoop.makeCompletedFuture { () throws -> Stream in
                            var id = 0
                            if let options = stream.syncOptions, let streamID = try? options.getOption(HTTP2StreamChannelOptions.streamID) { id = Int(Int32(streamID)) }
                            let wrapped = try StreamChannel(wrappingChannelSynchronously: stream)
                            return (id: id, channel: wrapped)
                        }
                    }
                    let id = Self.connectionCounter.wrappingAdd(1, ordering: .relaxed).newValue
                    return (id, channel, multiplexer)
                }
            }
        let port = channel.channel.localAddress?.port ?? configuration.port
        return HTTP2TLSServer(serverChannel: channel, host: configuration.host, port: port, handler: handler, logger: logger, maxBodySize: configuration.maxBodySize,
                              connectionEnded: configuration.connectionEnded)
    }

    /// `https://127.0.0.1:<port>`
    public var baseURL: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "https://\(h):\(port)"
    }

    /// Serves until cancelled or the service group shuts down gracefully; open connections are
    /// closed then. Stopping this way is not an error.
    public func run() async throws {
        do {
            try await runUntilCancelled()
        } catch is CancellationError {
            return
        }
    }

    private func runUntilCancelled() async throws {
        try await cancelWhenGracefulShutdown {
            try await self.serverChannel.executeThenClose { connections in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in connections {
                        group.addTask { await self.serve(connection) }
                    }
                }
            }
        }
    }

    private func serve(_ connection: Connection) async {
        let streams = ConnectionStreams()
        // The stream loop runs in a task of its own that is never cancelled: cancelling the
        // iteration would drop streams already accepted, and every stream channel must be closed
        // by executeThenClose. Stopping the server closes the connection instead, which ends the
        // loop after each accepted stream has been handled.
        let loop = Task {
            do {
                try await withThrowingDiscardingTaskGroup { group in
                    for try await stream in connection.multiplexer.inbound {
                        group.addTask { await self.serve(stream: stream.channel, streamID: stream.id, connection: connection, streams: streams) }
                    }
                }
            } catch {
                logger.trace("connection ended", metadata: ["http2.connection": "\(connection.id)", "error": "\(error)"])
            }
        }
        await withTaskCancellationHandler {
            await loop.value
        } onCancel: {
            connection.channel.close(promise: nil)
        }
        connectionEnded?(connection.id)
    }

    private func serve(stream: StreamChannel, streamID: Int, connection: Connection, streams: ConnectionStreams) async {
        // After a GOAWAY, streams above its lastStreamID are refused unprocessed.
        let concurrent: Int? = streams.state.withLock { s in
            if let last = s.goAwayLast, streamID > last { return nil }
            s.inFlight += 1
            s.open += 1
            s.highestStarted = max(s.highestStarted, streamID)
            return s.open
        }
        guard let concurrent else {
            try? await stream.executeThenClose { _, outbound in try await outbound.write(.rstStream(.refusedStream)) }
            return
        }
        var sendGoAway: (last: Int, reason: String)?
        var drop = false
        // The stream counts as open until just before its final frame goes out (or it ends otherwise).
        let closing = Mutex(false)
        @Sendable func closeForCounting() {
            guard closing.withLock({ c in defer { c = true }; return !c }) else { return }
            streams.state.withLock { $0.open -= 1 }
        }
        defer { closeForCounting() }
        do {
            let action: (goAway: String?, drop: Bool, settings: Int?) = try await stream.executeThenClose { inbound, outbound in
                var head: HPACKHeaders?
                var body = ByteBuffer()
                var complete = false
                frames: for try await frame in inbound {
                    switch frame {
                    case .headers(let h):
                        if head == nil { head = h.headers }
                        if h.endStream { complete = true; break frames }
                    case .data(let d):
                        if case .byteBuffer(var b) = d.data {
                            guard body.readableBytes + b.readableBytes <= maxBodySize else {
                                try await outbound.write(.rstStream(.refusedStream))
                                return (nil, false, nil)
                            }
                            body.writeBuffer(&b)
                        }
                        if d.endStream { complete = true; break frames }
                    default:
                        continue
                    }
                }
                guard complete, let head else { return (nil, false, nil) }
                var request = HTTP2ServerRequest(method: "", path: "", authority: nil, headers: [], body: Array(buffer: body), connectionID: connection.id,
                                                 streamID: streamID, concurrentStreams: concurrent)
                for (name, value, _) in head {
                    switch name {
                    case ":method": request.method = value
                    case ":path": request.path = value
                    case ":authority": request.authority = value
                    case ":scheme": break
                    default: request.headers.append((name.lowercased(), value))
                    }
                }
                let response = await handler(request)
                if let delay = response.delay {
                    // Simulated latency ends early when the connection closes.
                    let sleeper = Task { try? await Task.sleep(for: delay) }
                    connection.channel.closeFuture.whenComplete { _ in sleeper.cancel() }
                    await sleeper.value
                }
                if response.dropConnection {
                    // Close the connection before this stream ends, so no RST_STREAM goes out first.
                    try? await connection.channel.close()
                    return (nil, true, nil)
                }
                if let limit = response.maxConcurrentStreams {
                    // Sent before the answer, while the stream is still open: a client must not
                    // see the new limit on an idle connection only (some pools assume it is busy).
                    let frame = HTTP2Frame(streamID: .rootStream, payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: limit)])))
                    try? await connection.channel.writeAndFlush(frame)
                }
                var headers = HPACKHeaders([(":status", String(response.status))])
                for (name, value) in response.headers { headers.add(name: name.lowercased(), value: value) }
                if response.body.isEmpty {
                    closeForCounting()
                    try await outbound.write(.headers(.init(headers: headers, endStream: true)))
                } else {
                    try await outbound.write(.headers(.init(headers: headers, endStream: false)))
                    closeForCounting()
                    try await outbound.write(.data(.init(data: .byteBuffer(ByteBuffer(bytes: response.body)), endStream: true)))
                }
                return (response.goAwayReason, false, nil)
            }
            drop = action.drop
            if let limit = action.settings {
                let frame = HTTP2Frame(streamID: .rootStream, payload: .settings(.settings([HTTP2Setting(parameter: .maxConcurrentStreams, value: limit)])))
                try? await connection.channel.writeAndFlush(frame)
            }
            if let reason = action.goAway {
                streams.state.withLock { s in
                    if s.goAwayLast == nil {
                        s.goAwayLast = s.highestStarted
                        sendGoAway = (s.highestStarted, reason)
                    }
                }
            }
        } catch {
            logger.trace("stream ended", metadata: ["http2.connection": "\(connection.id)", "error": "\(error)"])
        }
        if drop {
            try? await connection.channel.close()
            return
        }
        // Only once this stream's frames are out: GOAWAY naming the last stream started, then the
        // connection closes when the streams up to it are answered.
        if let (last, reason) = sendGoAway {
            let opaque = ByteBuffer(string: "{\"reason\":\"\(reason)\"}")
            let frame = HTTP2Frame(streamID: .rootStream, payload: .goAway(lastStreamID: HTTP2StreamID(Int32(last)), errorCode: .noError, opaqueData: opaque))
            try? await connection.channel.writeAndFlush(frame)
        }
        let closeNow = streams.state.withLock { s in
            s.inFlight -= 1
            return s.goAwayLast != nil && s.inFlight == 0
        }
        if closeNow { try? await connection.channel.close() }
    }
}

