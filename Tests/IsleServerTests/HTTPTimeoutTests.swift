import Foundation
import IsleCore
import IsleServer
import IsleStore
import IsleDelivery
import IsleTesting
import NIOCore
import NIOPosix
import Testing

/// Header, body and idle deadlines (docs/security.md, "Bounded by construction"), from
/// raw TCP connections: a client trickling bytes cannot hold a connection past its deadline, and
/// idle connections are closed — while well-behaved requests on other connections go through.
@Suite("HTTP deadlines: slow heads, slow bodies and idle connections are closed")
struct HTTPTimeoutTests {
    static func tune(_ c: inout ServerConfiguration) {
        c.timeouts.header = .milliseconds(600)
        c.timeouts.body = .milliseconds(600)
        // Longer than the others: under a loaded machine a client's first byte may come late.
        c.timeouts.idle = .seconds(3)
    }

    @Test("a head trickled byte by byte gets 408 and is closed at its deadline; a body trickled is closed at its deadline; idle connections close; others are served meanwhile")
    func deadlines() async throws {
        try await ServerFixture.with(server: Self.tune) { f in
            let port = await f.server.port
            // A head sent one header line every 100 ms: without an absolute deadline it would
            // last as long as the client likes (40 lines = 4 s).
            let slowHead = Task {
                try await RawConnection.exchange(port: port, chunks: ["GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"] + (0..<40).map { "X-Slow-\($0): 1\r\n" }, every: .milliseconds(100))
            }
            // A body announced as 4,000 bytes, sent 10 bytes every 100 ms (40 s at that pace).
            let slowBody = Task {
                try await RawConnection.exchange(port: port, chunks: ["PUT /v1/installations/slow-phone HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(f.deviceKey)\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{"]
                                                 + Array(repeating: String(repeating: " ", count: 10), count: 399), every: .milliseconds(100))
            }
            // A connection that says nothing, and one that goes quiet after one request.
            let silent = Task { try await RawConnection.exchange(port: port, chunks: [], every: .zero) }
            let afterOne = Task { try await RawConnection.exchange(port: port, chunks: ["GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"], every: .zero) }
            // Meanwhile, a head and body that arrive in parts but in time are served.
            let honest = try await RawConnection.exchange(port: port, chunks: ["GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", "Connection: close\r\n\r\n"], every: .milliseconds(200))
            #expect(honest.text.hasPrefix("HTTP/1.1 200"), "\(honest.text.prefix(200))")

            let head = try await withDeadline(.seconds(10), "the slow head to be cut off") { try await slowHead.value }
            #expect(head.text.hasPrefix("HTTP/1.1 408"), "\(head.text.prefix(200))")
            #expect(head.closedBeforeSendingAll, "the server closed the connection before the client finished its head")
            let body = try await withDeadline(.seconds(10), "the slow body to be cut off") { try await slowBody.value }
            #expect(body.closedBeforeSendingAll, "the server closed the connection before the client finished its body")
            #expect(!body.text.contains("HTTP/1.1 2"), "nothing was accepted from a body that never ended: \(body.text.prefix(200))")
            let quiet = try await withDeadline(.seconds(10), "the silent connection to be closed") { try await silent.value }
            #expect(quiet.text.isEmpty)
            let one = try await withDeadline(.seconds(10), "the connection idle after one request to be closed") { try await afterOne.value }
            #expect(one.text.hasPrefix("HTTP/1.1 200"), "\(one.text.prefix(200))")
            // The slow body stored nothing.
            #expect(try await SQLiteStore(path: f.databasePath).installation(bundleID: Pizza.bundleID, id: "slow-phone") == nil)
        }
    }

    @Test("100 idle connections are all closed, and the server answers at once afterwards")
    func manyIdleConnections() async throws {
        try await ServerFixture.with(server: Self.tune) { f in
            let port = await f.server.port
            // A generous deadline: the full test suite runs beside this on two cores (each closes in ~2 s).
            let closed = try await withDeadline(.seconds(90), "100 idle connections to be closed") {
                try await withThrowingTaskGroup(of: Bool.self) { group in
                    for i in 0..<100 {
                        // Half say nothing; half start a head and stop.
                        group.addTask { try await RawConnection.exchange(port: port, chunks: i.isMultiple(of: 2) ? [] : ["GET /health HTTP/1.1\r\n"], every: .zero).closedByServer }
                    }
                    return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
                }
            }
            #expect(closed == 100)
            #expect(try await f.call("GET", "/health").status == 200)
        }
    }
}

/// One raw TCP connection: sends `chunks`, the first at once and the others one `every` apart on
/// the connection's own event loop (the pace of a slow client is the behaviour under test), and
/// reads everything until the server closes the connection.
struct RawConnection {
    struct Outcome: Sendable {
        var text: String
        /// The server closed the connection while chunks were still to be sent.
        var closedBeforeSendingAll: Bool
        var closedByServer: Bool
    }

    /// Collects what the server sends; on close, says what arrived and whether chunks were left.
    final class Reader: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var received = ByteBuffer()
        var remaining: [String]
        let interval: Duration
        let done: EventLoopPromise<Outcome>
        var pacer: Scheduled<Void>?

        init(chunks: [String], interval: Duration, done: EventLoopPromise<Outcome>) {
            remaining = chunks
            self.interval = interval
            self.done = done
        }

        func channelActive(context: ChannelHandlerContext) {
            sendNext(context)
            context.fireChannelActive()
        }

        /// Sends one chunk, and schedules the next on the event loop.
        func sendNext(_ context: ChannelHandlerContext) {
            guard context.channel.isActive, !remaining.isEmpty else { return }
            let chunk = remaining.removeFirst()
            context.writeAndFlush(NIOAny(ByteBuffer(string: chunk)), promise: nil)
            guard !remaining.isEmpty else { return }
            pacer = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(interval)) { [self] in self.sendNext(context) }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var part = unwrapInboundIn(data)
            received.writeBuffer(&part)
        }

        func channelInactive(context: ChannelHandlerContext) {
            pacer?.cancel()
            done.succeed(Outcome(text: String(buffer: received), closedBeforeSendingAll: !remaining.isEmpty, closedByServer: true))
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            // A reset counts as closed by the server too.
            context.close(promise: nil)
        }
    }

    /// The raw clients' own event loops: the process-wide singleton is shared with every other test
    /// running in parallel, and a client whose first write waits behind them would look idle.
    static let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)

    static func exchange(port: Int, chunks: [String], every interval: Duration) async throws -> Outcome {
        let loop = group.next()
        let done = loop.makePromise(of: Outcome.self)
        _ = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Reader(chunks: chunks, interval: interval, done: done))
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return try await done.futureResult.get()
    }
}
