import Foundation
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// One HTTP/2 connection of the pool. The pool reads its load and limit without a hop; the
/// stream bookkeeping lives in ``APNsStreamHandler`` on the connection's event loop.
final class APNsConnection: Sendable {
    let id: Int
    let key: APNsHostKey
    /// The provider token every request on this connection carries.
    let credential: ProviderCredential
    let loop: any EventLoop
    let pool: APNsConnectionPool
    let counters: APNsConnectionCounters
    private let box: NIOLoopBoundBox<APNsStreamHandler>

    init(id: Int, key: APNsHostKey, credential: ProviderCredential, loop: any EventLoop, pool: APNsConnectionPool) {
        self.id = id
        self.key = key
        self.credential = credential
        self.loop = loop
        self.pool = pool
        // One stream until the server's SETTINGS say more: APNs "allows only one stream until you
        // post a request with a valid authentication token" (docs/protocol.md §1.1). Counting a
        // connection still connecting as roomier sent whole bursts to its queue, to wait there
        // one at a time while the pool could have opened others.
        let counters = APNsConnectionCounters(limit: 1)
        self.counters = counters
        // Everything the handler needs is given here, so a request that reaches it before the
        // connection has started (another caller picked this connection first) is accounted for.
        box = NIOLoopBoundBox.makeBoxSendingValue(
            APNsStreamHandler(configuration: pool.configuration, logger: pool.logger, pool: pool, counters: counters, loop: loop, hostDescription: key.description, connectionID: id),
            eventLoop: loop)
    }

    var isUsable: Bool { counters.usable.load(ordering: .relaxed) }

    /// Starts TCP + TLS + HTTP/2; requests submitted meanwhile wait on the handler.
    func connect() {
        let box = self.box
        let configuration = pool.configuration
        let ssl = pool.sslContext
        let host = key.host
        let serverHostname: String? = Self.isIPAddress(host) ? nil : host
        loop.execute { box.value.connecting() }
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(TimeAmount(configuration.connectTimeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let tls = try NIOSSLClientHandler(context: ssl, serverHostname: serverHostname)
                    let http2 = NIOHTTP2Handler(mode: .client, initialSettings: [
                        HTTP2Setting(parameter: .enablePush, value: 0),
                        HTTP2Setting(parameter: .maxConcurrentStreams, value: 100),
                        HTTP2Setting(parameter: .initialWindowSize, value: 65_535),
                        HTTP2Setting(parameter: .maxHeaderListSize, value: 16_384),
                    ], headerBlockValidation: .disabled, contentLengthValidation: .disabled)
                    try channel.pipeline.syncOperations.addHandler(tls)
                    try channel.pipeline.syncOperations.addHandler(http2)
                    try channel.pipeline.syncOperations.addHandler(box.value)
                }
            }
        bootstrap.connect(host: host, port: key.port).whenComplete { result in
            if case .failure(let error) = result { box.value.connectFailed(error) }
        }
    }

    func submit(_ request: PendingRequest) {
        let box = self.box
        loop.execute { box.value.enqueue(request) }
    }

    func cancel(_ id: UInt64) {
        let box = self.box
        loop.execute { box.value.cancel(id) }
    }

    /// Takes no new requests (the pool has unlisted it); finishes those it has, then closes.
    func closeWhenDone(reason: String) {
        let box = self.box
        loop.execute { box.value.closeWhenDone(reason: reason) }
    }

    func close() async {
        let box = self.box
        let closed = loop.submit { box.value.shutdown() }.flatMap { $0 }
        try? await closed.get()
    }

    static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }
}

/// What the pool reads of a connection without a hop to its event loop.
final class APNsConnectionCounters: Sendable {
    /// Requests assigned here and not yet finished (waiting or on a stream).
    let load = Atomic<Int>(0)
    /// How many streams may be open at once: the server's SETTINGS_MAX_CONCURRENT_STREAMS, capped.
    let limit: Atomic<Int>
    /// False once the connection takes no new requests (GOAWAY, idle, lost, shut down).
    let usable = Atomic<Bool>(true)

    init(limit: Int) { self.limit = Atomic(limit) }
}

/// The stream bookkeeping of one connection; runs only on its event loop. Frames are written
/// directly on the connection (NIOHTTP2Handler without a multiplexer), so a push costs no
/// channel, and all requests queued within one event-loop tick share one flush.
final class APNsStreamHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    enum Phase { case idle, connecting, ready, draining, closed }

    struct InFlight {
        var request: PendingRequest
        var status: Int?
        var headers: [(name: String, value: String)] = []
        var body: ByteBuffer?
    }

    private let configuration: NIOHTTP2Transport.Configuration
    private let logger: Logger
    private let pool: APNsConnectionPool
    private let counters: APNsConnectionCounters
    private let loop: any EventLoop
    private let hostDescription: String
    private var phase = Phase.idle
    private var everReady = false
    private var context: ChannelHandlerContext?
    private var queue = CircularBuffer<PendingRequest>(initialCapacity: 16)
    private var streams: [HTTP2StreamID: InFlight] = [:]
    private var nextStreamID: Int32 = 1
    private var remoteLimit = 100
    private var goAwayLast: HTTP2StreamID?
    private var failure: APNsTransportError?
    private var needsFlush = false
    private var flushScheduled = false
    private var timeoutTask: Scheduled<Void>?
    private var timeoutAt: NIODeadline?
    private var connectDeadline: Scheduled<Void>?
    private var maintenance: Scheduled<Void>?
    private var pingTimeoutTask: Scheduled<Void>?
    private var pingOutstanding = false
    private var lastRead = NIODeadline.now()
    private var lastActivity = NIODeadline.now()
    private var unacknowledgedBytes = 0
    /// RST_STREAM codes the server sent, until the stream's close event is handled.
    private var peerResets: [HTTP2StreamID: HTTP2ErrorCode] = [:]
    private var closePromises: [EventLoopPromise<Void>] = []
    /// Out of the pool's rotation: close once nothing is queued, open or on its way here.
    private var closingWhenDone = false

    private let connectionID: Int

    init(configuration: NIOHTTP2Transport.Configuration, logger: Logger, pool: APNsConnectionPool, counters: APNsConnectionCounters, loop: any EventLoop, hostDescription: String, connectionID: Int) {
        self.connectionID = connectionID
        self.configuration = configuration
        self.logger = logger
        self.pool = pool
        self.counters = counters
        self.loop = loop
        self.hostDescription = hostDescription
    }

    private var streamCap: Int { min(remoteLimit, configuration.maximumStreamsPerConnection) }

    // MARK: Connecting

    func connecting() {
        guard phase == .idle else { return }
        phase = .connecting
        let timeout = configuration.connectTimeout
        let description = hostDescription
        connectDeadline = loop.assumeIsolated().scheduleTask(in: TimeAmount(timeout)) {
            guard self.phase == .connecting || self.phase == .idle else { return }
            self.fail(APNsTransportError(kind: .timedOut, reason: "could not connect to \(description) (TCP, TLS and HTTP/2 settings) within \(timeout)"))
        }
    }

    func connectFailed(_ error: any Error) {
        guard phase != .closed else { return }
        fail(failure ?? Self.classify(error, host: hostDescription, connecting: true))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if phase == .closed { context.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        teardown(failure ?? APNsTransportError(kind: .connectionFailed, reason: "the connection to \(hostDescription) closed"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A stream error is followed by that stream's close event; only connection errors end it.
        if error is NIOHTTP2Errors.StreamError { return }
        if failure == nil { failure = Self.classify(error, host: hostDescription, connecting: !everReady) }
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let closed = event as? StreamClosedEvent {
            streamClosed(closed.streamID, reason: closed.reason)
        } else if let tls = event as? TLSUserEvent, case .handshakeCompleted(let proto) = tls, proto != "h2" {
            failure = APNsTransportError(kind: .tlsFailed, reason: "\(hostDescription) did not negotiate HTTP/2 (ALPN h2); APNs requires it")
            context.close(promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    // MARK: Requests

    func enqueue(_ request: PendingRequest) {
        lastActivity = .now()
        switch phase {
        case .closed:
            if everReady, failure?.kind != .cancelled {
                leave(moving: request, reason: "the connection closed")
            } else {
                leave()
                request.resume(.failure(failure ?? closedError))
            }
        case .draining:
            leave(moving: request, reason: "the connection is closing")
        case .idle, .connecting, .ready:
            queue.append(request)
            armTimeout(request.deadline)
            pump()
        }
    }

    private var closedError: APNsTransportError { APNsTransportError(kind: .connectionFailed, reason: "the connection to \(hostDescription) closed") }

    /// Opens streams for waiting requests while the server allows.
    private func pump() {
        guard phase == .ready, let context else { return }
        var wrote = false
        let now = NIODeadline.now()
        while streams.count < streamCap, let request = queue.popFirst() {
            if request.deadline <= now {
                leave()
                request.resume(.failure(APNsTransportError(kind: .timedOut, reason: "no free stream to APNs within \(request.timeout)")))
                continue
            }
            let id = HTTP2StreamID(nextStreamID)
            nextStreamID += 2
            let body = request.request.body
            context.write(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .headers(.init(headers: request.request.headers, endStream: body.readableBytes == 0)))), promise: nil)
            if body.readableBytes > 0 {
                context.write(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .data(.init(data: .byteBuffer(body), endStream: true)))), promise: nil)
            }
            streams[id] = InFlight(request: request)
            wrote = true
            if nextStreamID >= Int32.max - 2 {
                startDraining(reason: "stream ids used up")
                break
            }
        }
        if wrote { scheduleFlush() }
    }

    private func scheduleFlush() {
        needsFlush = true
        guard !flushScheduled, let context else { return }
        flushScheduled = true
        context.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            self.flushIfNeeded()
        }
    }

    private func flushIfNeeded() {
        guard needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }

    func cancel(_ id: UInt64) {
        if let index = queue.firstIndex(where: { $0.id == id }) {
            let request = queue.remove(at: index)
            leave()
            request.resume(.failure(APNsTransportError(kind: .cancelled, reason: "the request was cancelled")))
            return
        }
        guard let entry = streams.first(where: { $0.value.request.id == id }) else { return }
        let streamID = entry.key
        let s = entry.value
        streams.removeValue(forKey: streamID)
        reset(streamID)
        leave()
        s.request.resume(.failure(APNsTransportError(kind: .cancelled, reason: "the request was cancelled")))
        pump()
        closeIfDrained()
    }

    private func reset(_ streamID: HTTP2StreamID) {
        guard let context else { return }
        context.write(wrapOutboundOut(HTTP2Frame(streamID: streamID, payload: .rstStream(.cancel))), promise: nil)
        scheduleFlush()
    }

    /// A request is no longer this connection's (answered, failed or moved).
    private func leave() {
        counters.load.wrappingAdd(-1, ordering: .relaxed)
        pool.outstanding.wrappingAdd(-1, ordering: .relaxed)
    }

    private func leave(moving request: PendingRequest, reason: String) {
        leave()
        pool.move(request, reason: reason)
    }

    // MARK: Frames

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        lastRead = .now()
        switch frame.payload {
        case .headers(let h):
            guard var s = streams[frame.streamID] else { return }
            if s.status == nil {
                guard let text = h.headers.first(name: ":status"), let status = Int(text) else {
                    abort(frame.streamID, s.request, reason: "the response had no valid :status")
                    return
                }
                if (100..<200).contains(status), !h.endStream { return }
                s.status = status
                for (name, value, _) in h.headers where !name.hasPrefix(":") { s.headers.append((name, value)) }
            }
            if h.endStream { finish(frame.streamID, s) } else { streams[frame.streamID] = s }
        case .data(let d):
            // The connection window is given back in channelReadComplete: writing here could
            // deliver this stream's close event before this frame is handled.
            unacknowledgedBytes += d.data.readableBytes + (d.paddingBytes.map { $0 + 1 } ?? 0)
            guard var s = streams[frame.streamID] else { return }
            if case .byteBuffer(var bytes) = d.data {
                if (s.body?.readableBytes ?? 0) + bytes.readableBytes > configuration.maximumResponseBody {
                    abort(frame.streamID, s.request, reason: "the response body is larger than \(configuration.maximumResponseBody) bytes")
                    return
                }
                if s.body == nil { s.body = bytes } else { s.body!.writeBuffer(&bytes) }
            }
            if d.endStream { finish(frame.streamID, s) } else { streams[frame.streamID] = s }
        case .settings(.settings(let settings)):
            for setting in settings where setting.parameter == .maxConcurrentStreams {
                remoteLimit = setting.value
                counters.limit.store(streamCap, ordering: .relaxed)
            }
            if phase == .connecting {
                phase = .ready
                everReady = true
                connectDeadline?.cancel()
                connectDeadline = nil
                startMaintenance(context: context)
            }
            pump()
        case .goAway(let last, let code, let opaque):
            goAwayLast = last
            var reason = opaque.map { String(buffer: $0) } ?? ""
            if reason.count > 200 { reason = String(reason.prefix(200)) }
            logger.info("APNs sent GOAWAY", metadata: ["apns.host": "\(hostDescription)", "http2.lastStreamID": "\(last)", "http2.error": "\(code)", "apns.goaway": "\(reason)"])
            startDraining(reason: "APNs sent GOAWAY \(reason)")
        case .rstStream(let code):
            if streams[frame.streamID] != nil { peerResets[frame.streamID] = code }
        case .ping(_, ack: true):
            pingOutstanding = false
            pingTimeoutTask?.cancel()
            pingTimeoutTask = nil
        default:
            break
        }
    }

    /// Gives up on a stream whose answer is malformed: reset it, fail its request, go on.
    private func abort(_ streamID: HTTP2StreamID, _ request: PendingRequest, reason: String) {
        streams.removeValue(forKey: streamID)
        reset(streamID)
        leave()
        request.resume(.failure(APNsTransportError(kind: .other, reason: reason)))
        pump()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if unacknowledgedBytes >= 32_768, phase != .closed {
            context.write(wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .windowUpdate(windowSizeIncrement: unacknowledgedBytes))), promise: nil)
            unacknowledgedBytes = 0
            needsFlush = true
        }
        flushIfNeeded()
        context.fireChannelReadComplete()
    }

    private func finish(_ streamID: HTTP2StreamID, _ s: InFlight) {
        streams.removeValue(forKey: streamID)
        leave()
        let body = s.body.map { Array(buffer: $0) } ?? []
        // APNs keeps a connection that saw its token change too soon unusable for a while
        // (docs/protocol.md §1.3): the requests after this one go to a new connection.
        if s.status == 429, body.count < 200, String(decoding: body, as: UTF8.self).contains("TooManyProviderTokenUpdates") {
            closeWhenDone(reason: "APNs answered 429 TooManyProviderTokenUpdates")
        }
        s.request.resume(.success(APNsTransportResponse(status: s.status ?? 0, headers: s.headers, body: body)))
        pump()
        closeIfDrained()
    }

    private func streamClosed(_ streamID: HTTP2StreamID, reason: HTTP2ErrorCode?) {
        let peerReset = peerResets.removeValue(forKey: streamID)
        guard let s = streams.removeValue(forKey: streamID) else { return }
        if let last = goAwayLast, streamID > last {
            leave(moving: s.request, reason: "APNs closed the connection before this stream (GOAWAY)")
        } else if peerReset == .refusedStream {
            // RFC 9113 §8.7: a refused stream was not processed; it is safe to send again.
            leave(moving: s.request, reason: "APNs refused the stream")
        } else if let peerReset {
            leave()
            s.request.resume(.failure(APNsTransportError(kind: .connectionFailed, reason: "APNs reset the stream before answering (\(peerReset)); the push may have been delivered")))
        } else {
            // Closed on this side without an answer: the connection is failing (a write failed).
            // Open no more streams on it; what waits moves when it closes.
            leave()
            s.request.resume(.failure(APNsTransportError(kind: .connectionFailed, reason: "the connection to \(hostDescription) failed before APNs answered; the push may have been delivered")))
            startDraining(reason: "the connection failed")
            return
        }
        pump()
        closeIfDrained()
    }

    // MARK: Ending

    private func startDraining(reason: String) {
        guard phase == .ready || phase == .connecting || phase == .idle else { return }
        phase = .draining
        pool.retire(counters)
        while let request = queue.popFirst() { leave(moving: request, reason: reason) }
        closeIfDrained()
    }

    /// Out of rotation (a newer provider token, or APNs refused a token change): what was
    /// assigned here is still sent here — moving it would only meet the same fate elsewhere.
    func closeWhenDone(reason: String) {
        guard phase != .closed, phase != .draining else { return }
        if !closingWhenDone {
            logger.debug("retiring an APNs connection", metadata: ["apns.host": "\(hostDescription)", "reason": "\(reason)"])
        }
        closingWhenDone = true
        pool.retire(counters)
        closeIfDrained()
    }

    private func closeIfDrained() {
        if closingWhenDone, phase == .ready, streams.isEmpty, queue.isEmpty, counters.load.load(ordering: .relaxed) == 0 {
            phase = .draining
        }
        guard phase == .draining, streams.isEmpty, let context else { return }
        flushIfNeeded()
        context.close(promise: nil)
    }

    /// Ends the connection with this error: waiting and open requests are moved or failed.
    private func fail(_ error: APNsTransportError) {
        if failure == nil { failure = error }
        if let context { context.close(promise: nil) }
        teardown(error)
    }

    private func teardown(_ error: APNsTransportError) {
        guard phase != .closed else { return }
        phase = .closed
        connectDeadline?.cancel()
        timeoutTask?.cancel()
        maintenance?.cancel()
        pingTimeoutTask?.cancel()
        connectDeadline = nil
        timeoutTask = nil
        maintenance = nil
        pingTimeoutTask = nil
        pool.retire(counters)
        pool.closed(connectionID)
        let open = streams
        streams = [:]
        for (id, s) in open.sorted(by: { $0.key < $1.key }) {
            if let last = goAwayLast, id > last {
                leave(moving: s.request, reason: "APNs closed the connection before this stream (GOAWAY)")
            } else {
                leave()
                s.request.resume(.failure(APNsTransportError(kind: error.kind == .cancelled ? .cancelled : .connectionFailed,
                                                             reason: "\(error.reason) before APNs answered; the push may have been delivered")))
            }
        }
        while let request = queue.popFirst() {
            if everReady, error.kind != .cancelled {
                leave(moving: request, reason: error.reason)
            } else {
                leave()
                request.resume(.failure(error))
            }
        }
        for promise in closePromises { promise.succeed() }
        closePromises = []
    }

    /// Closes now; every waiting and open request fails as cancelled.
    func shutdown() -> EventLoopFuture<Void> {
        if phase == .closed { return loop.makeSucceededVoidFuture() }
        let error = APNsTransportError(kind: .cancelled, reason: "the transport was shut down")
        failure = error
        guard let context else {
            teardown(error)
            return loop.makeSucceededVoidFuture()
        }
        let promise = loop.makePromise(of: Void.self)
        closePromises.append(promise)
        context.close(promise: nil)
        teardown(error)
        return promise.futureResult
    }

    // MARK: Timers

    private func armTimeout(_ deadline: NIODeadline) {
        if let at = timeoutAt, at <= deadline { return }
        timeoutTask?.cancel()
        timeoutAt = deadline
        timeoutTask = loop.assumeIsolated().scheduleTask(deadline: deadline) { self.expire() }
    }

    private func expire() {
        timeoutTask = nil
        timeoutAt = nil
        let now = NIODeadline.now()
        var next: NIODeadline?
        if !queue.isEmpty {
            var kept = CircularBuffer<PendingRequest>(initialCapacity: queue.count)
            while let request = queue.popFirst() {
                if request.deadline <= now {
                    leave()
                    request.resume(.failure(APNsTransportError(kind: .timedOut, reason: "no free stream to APNs within \(request.timeout)")))
                } else {
                    kept.append(request)
                    next = min(next ?? request.deadline, request.deadline)
                }
            }
            queue = kept
        }
        for (id, s) in streams {
            if s.request.deadline <= now {
                streams.removeValue(forKey: id)
                reset(id)
                leave()
                s.request.resume(.failure(APNsTransportError(kind: .timedOut, reason: "no answer within \(s.request.timeout)")))
            } else {
                next = min(next ?? s.request.deadline, s.request.deadline)
            }
        }
        if let next { armTimeout(next) }
        pump()
        closeIfDrained()
    }

    private func startMaintenance(context: ChannelHandlerContext) {
        let tick = TimeAmount(max(min(configuration.pingInterval, configuration.idleTimeout) / 2, .milliseconds(10)))
        maintenance = context.eventLoop.assumeIsolated().scheduleTask(in: tick) {
            self.maintenance = nil
            self.maintain()
            if self.phase == .ready, let context = self.context { self.startMaintenance(context: context) }
        }
    }

    private func maintain() {
        guard phase == .ready, let context else { return }
        let now = NIODeadline.now()
        if streams.isEmpty, queue.isEmpty, now - lastActivity >= TimeAmount(configuration.idleTimeout) {
            if pool.retireIfIdle(counters) {
                logger.debug("closing an idle APNs connection", metadata: ["apns.host": "\(hostDescription)"])
                phase = .draining
                closeIfDrained()
                return
            }
        }
        if !pingOutstanding, now - lastRead >= TimeAmount(configuration.pingInterval) {
            pingOutstanding = true
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(withInteger: UInt64.random(in: 0...UInt64.max)), ack: false))), promise: nil)
            let timeout = configuration.pingTimeout
            pingTimeoutTask = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(timeout)) {
                guard self.pingOutstanding else { return }
                self.logger.info("APNs did not answer a PING; closing the connection", metadata: ["apns.host": "\(self.hostDescription)"])
                self.fail(APNsTransportError(kind: .connectionFailed, reason: "no answer to a PING within \(timeout); the connection to \(self.hostDescription) is dead"))
            }
        }
    }

    // MARK: Errors

    static func classify(_ error: any Error, host: String, connecting: Bool) -> APNsTransportError {
        if let e = error as? ChannelError, case .connectTimeout = e {
            return APNsTransportError(kind: .timedOut, reason: "could not connect to \(host) in time")
        }
        if error is NIOSSLError || error is BoringSSLError || error is NIOSSLExtraError {
            return APNsTransportError(kind: .tlsFailed, reason: TLSFailure.describe(error, host: host))
        }
        if connecting {
            return APNsTransportError(kind: .connectionFailed, reason: "could not connect to \(host): \(error)")
        }
        return APNsTransportError(kind: .connectionFailed, reason: "the connection to \(host) failed: \(error)")
    }
}
