import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes

/// HTTP/1.1 with deadlines a slow client cannot stretch (docs/security.md, "Bounded by
/// construction"): a request's head must arrive within `timeouts.header` of its first byte, its
/// body within `timeouts.body` of the head, and a connection with nothing in progress is closed
/// after `timeouts.idle` (Hummingbird's idle timeout). Deadlines are absolute: a client trickling
/// one byte at a time does not extend them, unlike an inactivity timer.
///
/// A late head is answered `408 Request Timeout` and the connection closed; a late body closes the
/// connection (its request's handler sees the body end in an error and answers nothing more).
struct DeadlineHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value
    let inner: HTTP1Channel
    let timeouts: HTTPTimeouts
    let logger: Logger

    init(responder: @escaping HTTPChannelHandler.Responder, timeouts: HTTPTimeouts, logger: Logger) {
        self.inner = HTTP1Channel(responder: responder,
                                  configuration: .init(additionalChannelHandlers: [RequestPhaseHandler()], idleTimeout: TimeAmount(timeouts.idle)))
        self.timeouts = timeouts
        self.logger = logger
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let timeouts = timeouts
        let log = self.logger
        let inner = inner
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
}

/// Sees decoded request parts and reports the end of the head and of the body.
final class RequestPhaseHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: context.triggerUserOutboundEvent(RequestPhase.headReceived, promise: nil)
        case .end: context.triggerUserOutboundEvent(RequestPhase.bodyReceived, promise: nil)
        case .body: break
        }
        context.fireChannelRead(data)
    }
}

/// Runs the header and body deadlines on the raw connection.
final class RequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        /// No request has started since the last one was read.
        case betweenRequests
        /// Bytes of a request arrived; its head has not been decoded yet.
        case readingHead
        /// The head was decoded; the body has not ended yet.
        case readingBody
    }

    private let timeouts: HTTPTimeouts
    private let logger: Logger
    private var state = State.betweenRequests
    private var timer: Scheduled<Void>?

    init(timeouts: HTTPTimeouts, logger: Logger) {
        self.timeouts = timeouts
        self.logger = logger
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .betweenRequests = state, unwrapInboundIn(data).readableBytes > 0 {
            state = .readingHead
            arm(context, after: timeouts.header, phase: "head")
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
            arm(context, after: timeouts.body, phase: "body")
        case .bodyReceived:
            // The next request's deadline starts with its first byte (a pipelined request's bytes
            // read before this point are covered by the idle timeout instead).
            state = .betweenRequests
            disarm()
        }
        promise?.succeed()
    }

    func channelInactive(context: ChannelHandlerContext) {
        disarm()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        disarm()
    }

    private func arm(_ context: ChannelHandlerContext, after duration: Duration, phase: String) {
        disarm()
        let loop = context.eventLoop.assumeIsolated()
        timer = loop.scheduleTask(in: TimeAmount(duration)) { [self] in
            self.timer = nil
            self.expire(context, phase: phase)
        }
    }

    private func disarm() {
        timer?.cancel()
        timer = nil
    }

    private func expire(_ context: ChannelHandlerContext, phase: String) {
        guard context.channel.isActive else { return }
        let limit = phase == "head" ? timeouts.header : timeouts.body
        logger.info("closed a connection whose request \(phase) took longer than \(limit)",
                    metadata: ["peer": "\(context.channel.remoteAddress?.ipAddress ?? "?")"])
        if case .readingHead = state {
            // Nothing was answered on this request yet: say why before closing.
            var response = context.channel.allocator.buffer(capacity: 96)
            response.writeString("HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
            context.writeAndFlush(wrapOutboundOut(response), promise: nil)
            context.close(promise: nil)
        } else {
            context.close(promise: nil)
        }
    }
}
