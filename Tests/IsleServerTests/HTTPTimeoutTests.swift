import Foundation
import IsleCore
import IsleServer
import IsleStore
import IsleTesting
import NIOCore
import NIOPosix
import Testing

/// Header, body and idle deadlines (issue 22, docs/security.md "Bounded by construction"), from
/// raw TCP connections: a client trickling bytes cannot hold a connection past its deadline, and
/// idle connections are closed — while well-behaved requests on other connections go through.
@Suite("HTTP deadlines: slow heads, slow bodies and idle connections are closed")
struct HTTPTimeoutTests {
    static func tune(_ c: inout ServerConfiguration) {
        c.timeouts.header = .milliseconds(600)
        c.timeouts.body = .milliseconds(600)
        // Longer than the others: under a loaded machine a client's first byte may come late.
        c.timeouts.idle = .seconds(2)
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
            #expect(one.text.hasPrefix("HTTP/1.1 200"))
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

/// One raw TCP connection: sends `chunks` one `every` apart, then waits, and reads everything until
/// the server closes the connection.
struct RawConnection {
    struct Outcome: Sendable {
        var text: String
        /// The server closed the connection while chunks were still to be sent.
        var closedBeforeSendingAll: Bool
        var closedByServer: Bool
    }

    static func exchange(port: Int, chunks: [String], every interval: Duration) async throws -> Outcome {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: false))
                }
            }
        return try await channel.executeThenClose { inbound, outbound in
            try await withThrowingTaskGroup(of: Bool.self) { group in
                // The writer: true when the server closed before all was sent.
                group.addTask {
                    for (i, chunk) in chunks.enumerated() {
                        if i > 0 {
                            // The pace of a slow client is the behaviour under test, not a wait
                            // for an event: the server's deadlines must cut it short.
                            try? await Task.sleep(for: interval)
                            if Task.isCancelled { return true }
                        }
                        do { try await outbound.write(ByteBuffer(string: chunk)) } catch { return true }
                    }
                    return false
                }
                var received = ByteBuffer()
                do {
                    for try await var part in inbound { received.writeBuffer(&part) }
                } catch {
                    // A reset counts as closed by the server too.
                }
                // The server closed its side: stop writing.
                group.cancelAll()
                let cutShort = try await group.next() ?? false
                let text = String(buffer: received)
                return Outcome(text: text, closedBeforeSendingAll: cutShort, closedByServer: true)
            }
        }
    }

}
