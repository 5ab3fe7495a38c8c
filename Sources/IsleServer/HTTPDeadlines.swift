import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
import Synchronization

/// HTTP/1.1 with deadlines a slow client cannot stretch (docs/security.md, "Bounded by
/// construction"): a request's head must arrive within `timeouts.header` of its first byte, its
/// body within `timeouts.body` of the head, and a connection with no request being read and no
/// response owed is closed after `timeouts.idle`. Deadlines are absolute: a client trickling one
/// byte at a time does not extend them, unlike an inactivity timer.
///
/// A late head is answered `408 Request Timeout` and the connection closed; a late body closes the
/// connection (its request's handler sees the body end early and nothing of it is stored).
struct DeadlineHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value
    let inner: HTTP1Channel
    let timeouts: HTTPTimeouts
    let logger: Logger
    let connections: ConnectionLimiter?

    init(responder: @escaping HTTPChannelHandler.Responder, timeouts: HTTPTimeouts, connections: ConnectionLimiter? = nil, logger: Logger) {
        self.inner = HTTP1Channel(responder: responder,
                                  configuration: .init(additionalChannelHandlers: [RequestPhaseHandler()]))
        self.timeouts = timeouts
        self.logger = logger
        self.connections = connections
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let timeouts = timeouts
        let log = self.logger
        let inner = inner
        // One address holding too many connections: this one is closed before anything is read.
        if let connections, !connections.admit(channel) {
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ConnectionLimiter.Refused())
        }
        return channel.eventLoop.makeCompletedFuture {
            // First in the pipeline: it sees the raw bytes, before HTTP decoding.
            try channel.pipeline.syncOperations.addHandler(RequestDeadlineHandler(timeouts: timeouts, logger: log))
        }.flatMap {
            inner.setup(channel: channel, logger: logger)
        }
    }

    func handle(value: Value, logger: Logger) async {
        await inner.handle(value: value, logger: logger)
    }
}

/// Where a request is, told by ``RequestPhaseHandler`` (after HTTP decoding) to
/// ``RequestDeadlineHandler`` (before it) as a user outbound event.
enum RequestPhase: Sendable {
    case headReceived
    case bodyReceived
    case responseSent
}

/// Sees decoded request parts and encoded response parts, and reports the end of a request's head
/// and body and of a response.
final class RequestPhaseHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: context.triggerUserOutboundEvent(RequestPhase.headReceived, promise: nil)
        case .end: context.triggerUserOutboundEvent(RequestPhase.bodyReceived, promise: nil)
        case .body: break
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let isEnd = if case .end = unwrapOutboundIn(data) { true } else { false }
        context.write(data, promise: promise)
        if isEnd { context.triggerUserOutboundEvent(RequestPhase.responseSent, promise: nil) }
    }
}

/// Runs the header, body and idle deadlines on the raw connection. One deadline in force at a time:
/// the head's while a request's first bytes are in, the body's after its head, the idle one when
/// nothing is being read and no response is owed.
///
/// One timer per connection, never further ahead than the shortest of the three timeouts: when it
/// fires it expires the deadline in force if that has passed, else it sets itself again. A new
/// deadline is never sooner than the timer, so a request arms and disarms its deadlines without
/// scheduling or cancelling a timer (three of each per request before, ~7 % of the server's CPU
/// per request: docs/performance.md).
final class RequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        /// No request is being read.
        case betweenRequests
        /// Bytes of a request arrived; its head has not been decoded yet.
        case readingHead
        /// The head was decoded; the body has not ended yet.
        case readingBody
        /// A 408 was sent and our side closed; what the client still sends is read and dropped
        /// until it closes too (or a moment passes), so the 408 is not lost to a reset.
        case lingering
    }

    private enum Deadline {
        case head, body, idle, linger
    }

    /// How long a lingering close waits for the client to stop sending.
    static let linger: Duration = .seconds(2)

    private let timeouts: HTTPTimeouts
    private let logger: Logger
    private var state = State.betweenRequests
    /// Requests whose head was read and whose response has not ended.
    private var responsesOwed = 0
    private var timer: Scheduled<Void>?
    /// When `timer` fires.
    private var timerAt = NIODeadline.distantFuture
    /// The deadline in force, when, and its timeout (nil: none).
    private var pending: (deadline: Deadline, at: NIODeadline, after: Duration)?
    /// How far ahead the timer is set at most.
    private let horizon: TimeAmount
    private var started = false

    init(timeouts: HTTPTimeouts, logger: Logger) {
        self.timeouts = timeouts
        self.logger = logger
        horizon = TimeAmount(max(.milliseconds(1), min(timeouts.header, timeouts.body, timeouts.idle)))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    private func start(_ context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        arm(context, .idle)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .lingering = state { return }
        if case .betweenRequests = state, unwrapInboundIn(data).readableBytes > 0 {
            state = .readingHead
            arm(context, .head)
        }
        context.fireChannelRead(data)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let phase = event as? RequestPhase else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        switch phase {
        case .headReceived:
            state = .readingBody
            responsesOwed += 1
            arm(context, .body)
        case .bodyReceived:
            // The next request's deadline starts with its first byte.
            state = .betweenRequests
            disarm()
        case .responseSent:
            responsesOwed = max(0, responsesOwed - 1)
            if case .betweenRequests = state, responsesOwed == 0 { arm(context, .idle) }
        }
        promise?.succeed()
    }

    func channelInactive(context: ChannelHandlerContext) {
        stop()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        stop()
    }

    private func arm(_ context: ChannelHandlerContext, _ deadline: Deadline) {
        let after = switch deadline {
        case .head: timeouts.header
        case .body: timeouts.body
        case .idle: timeouts.idle
        case .linger: Self.linger
        }
        let at = NIODeadline.now() + TimeAmount(after)
        pending = (deadline, at, after)
        // The timer wakes in time to look (the usual case: it is never set further ahead than a timeout).
        if timer != nil, timerAt <= at { return }
        setTimer(context, at: at)
    }

    /// No deadline in force; the timer finds none when it fires, and stops.
    private func disarm() {
        pending = nil
    }

    /// The connection is gone: nothing may fire.
    private func stop() {
        pending = nil
        timer?.cancel()
        timer = nil
    }

    private func setTimer(_ context: ChannelHandlerContext, at: NIODeadline) {
        timer?.cancel()
        let when = min(at, NIODeadline.now() + horizon)
        timerAt = when
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: when) { [self] in
            self.timer = nil
            self.timerAt = .distantFuture
            guard let p = self.pending else { return }
            if p.at <= NIODeadline.now() {
                self.pending = nil
                self.expire(context, p.deadline, after: p.after)
            } else {
                self.setTimer(context, at: p.at)
            }
        }
    }

    private func expire(_ context: ChannelHandlerContext, _ deadline: Deadline, after: Duration) {
        guard context.channel.isActive else { return }
        let peer = context.channel.remoteAddress?.ipAddress ?? "?"
        switch deadline {
        case .idle:
            logger.debug("closed a connection idle for \(after)", metadata: ["peer": "\(peer)"])
            context.close(promise: nil)
        case .head:
            logger.info("closed a connection whose request head took longer than \(after)", metadata: ["peer": "\(peer)"])
            guard responsesOwed == 0 else { return context.close(promise: nil) }
            // Nothing is being answered on this connection: say why, close our side, and drop what
            // the client still sends until it closes — closing at once with its bytes unread would
            // reset the connection and lose the 408 (a lingering close).
            var response = context.channel.allocator.buffer(capacity: 96)
            response.writeString("HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
            context.writeAndFlush(wrapOutboundOut(response), promise: nil)
            state = .lingering
            context.close(mode: .output, promise: nil)
            arm(context, .linger)
        case .body:
            logger.info("closed a connection whose request body took longer than \(after)", metadata: ["peer": "\(peer)"])
            context.close(promise: nil)
        case .linger:
            context.close(promise: nil)
        }
    }
}

/// Open connections per client address (docs/security.md, "Connections"): past `perAddress`, a new
/// connection from that address is closed at once, so one address holding thousands of idle
/// sockets cannot use up the process's file descriptors and shut everyone else out. Trusted
/// proxies (`--trusted-proxies`) carry many clients and are not limited.
final class ConnectionLimiter: Sendable {
    struct Refused: Error {}
    let perAddress: Int
    let exempt: [AddressRange]
    private let open = Mutex<[String: Int]>([:])

    init(perAddress: Int, exempt: [AddressRange]) {
        self.perAddress = perAddress
        self.exempt = exempt
    }

    /// Counts `channel` against its address until it closes; false (not counted) past the limit.
    func admit(_ channel: any Channel) -> Bool {
        guard perAddress > 0, let address = channel.remoteAddress?.ipAddress else { return true }
        if exempt.contains(where: { $0.contains(address) }) { return true }
        let admitted = open.withLock { o -> Bool in
            let n = o[address, default: 0]
            guard n < perAddress else { return false }
            o[address] = n + 1
            return true
        }
        guard admitted else { return false }
        channel.closeFuture.whenComplete { [self] _ in
            open.withLock { o in
                let n = (o[address] ?? 1) - 1
                o[address] = n > 0 ? n : nil
            }
        }
        return true
    }

    /// Connections open from `address` now.
    func count(_ address: String) -> Int { open.withLock { $0[address, default: 0] } }
}
