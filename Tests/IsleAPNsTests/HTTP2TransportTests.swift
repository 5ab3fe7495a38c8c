import Foundation
import IsleAPNs
import IsleCore
import IsleHTTP2Server
import IsleTesting
import Logging
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The swift-nio-http2 transport against the recording sink (real HTTP/2 over TLS on loopback),
/// with faults injected while other requests are queued and in flight.
@Suite("NIOHTTP2Transport: pool, GOAWAY, resets, limits, timeouts")
struct HTTP2TransportTests {
    static let key = TestProviderKey()

    /// One provider token for every request, as a client shares one (a connection carries one token).
    static let credentials = try! APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
    static let authorization = credentials.makeProviderToken(issuedAt: Date()).authorization

    /// A device push with a unique `apns-id`, built by the client so every header is real.
    static func request(_ sink: RecordingAPNsServer, id: APNsID = .random(), slow: Bool = false) throws -> APNsTransportRequest {
        let client = try APNsClient(configuration: .init(environment: .custom(url: sink.baseURL, trustRootsPEM: sink.caCertificatePEM), credentials: credentials),
                                    transport: UnusedTransport(), logger: Logger(label: "isle.test"))
        var r = try client.request(for: .liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID, apnsID: id))
        if let i = r.headers.firstIndex(where: { $0.name == "authorization" }) { r.headers[i].value = authorization }
        if slow { r.headers.append(("x-test-slow", "1")) }
        return r
    }

    static func transport(_ sink: RecordingAPNsServer, _ tune: (inout NIOHTTP2Transport.Configuration) -> Void = { _ in }) throws -> NIOHTTP2Transport {
        var configuration = NIOHTTP2Transport.Configuration(trustRootsPEM: sink.caCertificatePEM, connectTimeout: .seconds(10))
        tune(&configuration)
        return try NIOHTTP2Transport(configuration: configuration, logger: Logger(label: "isle.test.transport"))
    }

    /// Sends `count` pushes, `inFlight` at a time; returns each one's id and outcome.
    /// `timeout` catches a request that is never answered; it is not a latency target. The sink
    /// answers through this process's cooperative pool, which the whole suite shares on two cores,
    /// and a loaded run has left an answer waiting more than 20 s.
    static func burst(_ transport: NIOHTTP2Transport, _ sink: RecordingAPNsServer, count: Int, inFlight: Int, timeout: Duration = .seconds(90))
        async throws -> [(id: String, result: Result<APNsTransportResponse, APNsTransportError>)] {
        let requests = try (0..<count).map { _ in try request(sink) }
        let next = Ticket()
        return try await withThrowingTaskGroup(of: [(String, Result<APNsTransportResponse, APNsTransportError>)].self) { group in
            for _ in 0..<inFlight {
                group.addTask {
                    var mine: [(String, Result<APNsTransportResponse, APNsTransportError>)] = []
                    while true {
                        let i = next.take()
                        guard i < count else { break }
                        let r = requests[i]
                        do throws(APNsTransportError) { mine.append((r.value("apns-id")!, .success(try await transport.execute(r, timeout: timeout)))) } catch {
                            mine.append((r.value("apns-id")!, .failure(error)))
                        }
                    }
                    return mine
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    /// Answers the sink's requests in arrival order (the first is 1), so a fault lands mid-burst.
    static func respondNumbered(_ sink: RecordingAPNsServer, _ answer: @escaping @Sendable (Int) -> HTTP2ServerResponse) {
        let n = Ticket()
        sink.setResponder { _ in answer(n.take() + 1) }
    }

    /// How many times the sink saw each apns-id.
    static func seen(_ sink: RecordingAPNsServer) -> [String: Int] {
        sink.requests.reduce(into: [:]) { $0[$1.value("apns-id") ?? "-", default: 0] += 1 }
    }

    @Test("a newer provider token: new connections; the old token's connection finishes what it carries, then closes; a straggler goes alone")
    func tokenGenerations() async throws {
        try await RecordingAPNsServer.withServer { sink in
            // Requests of the first token are answered slowly, so the second token arrives while they are in flight.
            sink.setResponder { r in HTTP2ServerResponse(status: 200, delay: r.value("authorization") == Self.authorization ? .milliseconds(300) : nil) }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 2 }
            let newer = Self.credentials.makeProviderToken(issuedAt: Date().addingTimeInterval(3000)).authorization
            func with(_ authorization: String) throws -> APNsTransportRequest {
                var r = try Self.request(sink)
                r.headers[r.headers.firstIndex { $0.name == "authorization" }!].value = authorization
                return r
            }
            let outcomes = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<20 { let r = try Self.request(sink); group.addTask { try await transport.execute(r, timeout: .seconds(60)).status } }
                // Wait until the first token's requests are on the wire.
                try await eventually(within: .seconds(30), "the first token's requests on the wire") { sink.requests.count >= 20 }
                for _ in 0..<20 { let r = try with(newer); group.addTask { try await transport.execute(r, timeout: .seconds(60)).status } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.count == 40 && outcomes.allSatisfy { $0 == 200 })
            // No connection carried two tokens.
            let tokensPerConnection = Dictionary(grouping: sink.requests, by: \.connectionID).mapValues { Set($0.map { $0.value("authorization") ?? "" }).count }
            #expect(tokensPerConnection.values.allSatisfy { $0 == 1 })
            // A request still carrying the first token is sent on a connection of its own.
            #expect(try await transport.execute(try Self.request(sink), timeout: .seconds(60)).status == 200)
            let last = try #require(sink.requests.last)
            #expect(Set(sink.requests.filter { $0.connectionID == last.connectionID }.map { $0.value("authorization") ?? "" }) == [Self.authorization])
            #expect(try await transport.execute(try with(newer), timeout: .seconds(60)).status == 200)
            // The first token's connections close once they are done.
            try await eventually(within: .seconds(30), "the first token's connections closed") { transport.connectionCount <= 2 }
            try await transport.shutdown()
        }
    }

    @Test("GOAWAY mid-burst, twice: streams above lastStreamID move to a new connection; nothing lost, nothing sent twice")
    func goAwayMidBurst() async throws {
        try await RecordingAPNsServer.withServer { sink in
            Self.respondNumbered(sink) { i in HTTP2ServerResponse(status: 200, goAwayReason: i == 150 || i == 420 ? "Shutdown" : nil, delay: .milliseconds(1)) }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 1 }
            let outcomes = try await Self.burst(transport, sink, count: 600, inFlight: 100)
            try await transport.shutdown()
            #expect(outcomes.count == 600)
            let failures = outcomes.filter { if case .failure = $0.result { true } else { false } }
            #expect(failures.isEmpty, "\(failures.prefix(3).map { "\($0.result)" })")
            let seen = Self.seen(sink)
            #expect(seen.count == 600)
            #expect(seen.values.allSatisfy { $0 == 1 }, "a push was sent twice")
            #expect(Set(sink.requests.map(\.connectionID)).count == 3)
            #expect(transport.connectionsOpened == 3)
        }
    }

    @Test("a connection reset mid-burst: open streams are reported, waiting requests move; every call returns, none is sent twice")
    func connectionReset() async throws {
        try await RecordingAPNsServer.withServer(maxConcurrentStreams: 40) { sink in
            Self.respondNumbered(sink) { i in HTTP2ServerResponse(status: 200, delay: .milliseconds(2), dropConnection: i == 200) }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 1 }
            let outcomes = try await Self.burst(transport, sink, count: 500, inFlight: 100)
            try await transport.shutdown()
            #expect(outcomes.count == 500)
            var failed = 0
            for o in outcomes {
                switch o.result {
                case .success(let r): #expect(r.status == 200)
                case .failure(let e):
                    failed += 1
                    #expect(e.kind == .connectionFailed, "\(e)")
                    #expect(e.reason.contains("may have been delivered"), "\(e)")
                }
            }
            // Only the streams open at the reset (at most the server's 40) can be in doubt.
            #expect(failed >= 1 && failed <= 40, "\(failed) failed; most streams at once \(sink.requests.map(\.concurrentStreams).max() ?? 0); \(Set(outcomes.compactMap { if case .failure(let e) = $0.result { "\(e)" } else { nil } }))")
            let seen = Self.seen(sink)
            #expect(seen.values.allSatisfy { $0 == 1 }, "a push was sent twice")
            for o in outcomes { if case .success = o.result { #expect(seen[o.id] == 1) } }
            #expect(transport.connectionsOpened == 2)
        }
    }

    @Test("SETTINGS_MAX_CONCURRENT_STREAMS of 1, then raised to 50: the client never exceeds the limit and uses the new one")
    func maxConcurrentStreamsRaised() async throws {
        try await RecordingAPNsServer.withServer(maxConcurrentStreams: 1) { sink in
            Self.respondNumbered(sink) { i in HTTP2ServerResponse(status: 200, delay: .milliseconds(3), maxConcurrentStreams: i == 3 ? 50 : nil) }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 1 }
            let outcomes = try await Self.burst(transport, sink, count: 300, inFlight: 100)
            try await transport.shutdown()
            #expect(outcomes.allSatisfy { if case .success(let r) = $0.result { r.status == 200 } else { false } })
            let requests = sink.requests.sorted { $0.streamID < $1.streamID }
            #expect(requests.count == 300)
            #expect(requests.prefix(3).allSatisfy { $0.concurrentStreams == 1 }, "\(requests.prefix(3).map(\.concurrentStreams))")
            let most = requests.map(\.concurrentStreams).max() ?? 0
            #expect(most > 1 && most <= 50, "at most \(most) streams at once")
            #expect(Set(requests.map(\.connectionID)).count == 1)
        }
    }

    @Test("streams run out on every connection: the pool opens more, up to its limit, each within the server's limit")
    func poolGrowsWhenStreamsRunOut() async throws {
        try await RecordingAPNsServer.withServer(maxConcurrentStreams: 1) { sink in
            sink.setResponder { _ in HTTP2ServerResponse(status: 200, delay: .milliseconds(2)) }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 3 }
            // One request first, so the connection knows the server's limit before the burst (its
            // timeout, as the burst's, only catches a request never answered: a loaded run of the
            // whole suite has kept one waiting past 10 s).
            #expect(try await transport.execute(try Self.request(sink), timeout: .seconds(90)).status == 200)
            let outcomes = try await Self.burst(transport, sink, count: 120, inFlight: 30)
            try await transport.shutdown()
            let failures = outcomes.compactMap { if case .failure(let e) = $0.result { "\(e)" } else { nil } }
            #expect(failures.isEmpty, "\(failures.count) failed: \(Set(failures))")
            #expect(Set(sink.requests.map(\.connectionID)).count == 3)
            #expect(sink.requests.allSatisfy { $0.concurrentStreams == 1 }, "streams at once: \(sink.requests.map(\.concurrentStreams).filter { $0 > 1 })")
        }
    }

    @Test("10,000 pushes over a pool of several connections: every one answered, each sent once")
    func tenThousandOverAPool() async throws {
        try await RecordingAPNsServer.withServer(maxConcurrentStreams: 16) { sink in
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 4 }
            let outcomes = try await Self.burst(transport, sink, count: 10_000, inFlight: 64)
            try await transport.shutdown()
            #expect(outcomes.count == 10_000)
            #expect(outcomes.allSatisfy { if case .success(let r) = $0.result { r.status == 200 && r.value("apns-id") == $0.id } else { false } })
            let seen = Self.seen(sink)
            #expect(seen.count == 10_000)
            #expect(seen.values.allSatisfy { $0 == 1 })
            #expect(Set(sink.requests.map(\.connectionID)).count == 4)
        }
    }

    @Test("a server that stops answering: each request times out at its deadline, the connection stays usable")
    func serverStopsAnswering() async throws {
        try await RecordingAPNsServer.withServer { sink in
            sink.setResponder { r in HTTP2ServerResponse(status: 200, delay: r.value("x-test-slow") != nil ? .seconds(30) : nil) }
            let transport = try Self.transport(sink)
            let started = ContinuousClock.now
            let results = try await withThrowingTaskGroup(of: APNsTransportError?.self) { group in
                for _ in 0..<20 {
                    let r = try Self.request(sink, slow: true)
                    group.addTask {
                        do throws(APNsTransportError) { _ = try await transport.execute(r, timeout: .milliseconds(300)); return nil } catch { return error }
                    }
                }
                return try await group.reduce(into: [APNsTransportError?]()) { $0.append($1) }
            }
            #expect(ContinuousClock.now - started < .seconds(10))
            #expect(results.allSatisfy { $0?.kind == .timedOut }, "\(results)")
            // Fast requests after the timeouts, on the connections the burst opened (a cold burst
            // opens up to the host's limit: each counts as one stream until the server's SETTINGS).
            let opened = transport.connectionsOpened
            #expect(opened >= 1 && opened <= 4)
            for _ in 0..<5 {
                let response = try await transport.execute(try Self.request(sink), timeout: .seconds(10))
                #expect(response.status == 200)
            }
            #expect(transport.connectionsOpened == opened)
            try await transport.shutdown()
        }
    }

    @Test("a listener that never completes TLS: the connect timeout, as timedOut")
    func connectTimeout() async throws {
        let listener = try SilentListener()
        defer { listener.close() }
        let transport = try NIOHTTP2Transport(configuration: .init(connectTimeout: .milliseconds(300)))
        let request = APNsTransportRequest(method: "POST", url: "https://127.0.0.1:\(listener.port)/3/device/\(Samples.token.hex)", headers: [("apns-push-type", "alert")], body: Array("{}".utf8))
        let started = ContinuousClock.now
        do throws(APNsTransportError) {
            _ = try await transport.execute(request, timeout: .seconds(20))
            Issue.record("expected a timeout")
        } catch {
            #expect(error.kind == .timedOut, "\(error)")
        }
        // The 300 ms connect timeout, not the 20 s request timeout, ended it (the margin is wide:
        // a loaded 2-core machine took 5.2 s once).
        #expect(ContinuousClock.now - started < .seconds(15))
        try await transport.shutdown()
    }

    @Test("back-pressure: past the queue limit, requests fail at once as overloaded; the rest are answered")
    func backPressure() async throws {
        try await RecordingAPNsServer.withServer(maxConcurrentStreams: 2) { sink in
            sink.setResponder { _ in HTTP2ServerResponse(status: 200, delay: .milliseconds(500)) }
            let transport = try Self.transport(sink) {
                $0.maximumConnectionsPerHost = 1
                $0.maximumStreamsPerConnection = 2
                $0.maximumQueuedRequests = 10
            }
            // All 40 are sent together: each caller waits at a barrier, so a loaded machine cannot
            // spread them out until the first answers make room.
            let barrier = Barrier(parties: 40)
            let requests = try (0..<40).map { _ in try Self.request(sink) }
            let outcomes = try await withThrowingTaskGroup(of: (String, Result<APNsTransportResponse, APNsTransportError>).self) { group in
                for r in requests {
                    group.addTask {
                        await barrier.arrive()
                        do throws(APNsTransportError) { return (r.value("apns-id")!, .success(try await transport.execute(r, timeout: .seconds(90)))) } catch {
                            return (r.value("apns-id")!, .failure(error))
                        }
                    }
                }
                var all: [(id: String, result: Result<APNsTransportResponse, APNsTransportError>)] = []
                for try await (id, result) in group { all.append((id, result)) }
                return all
            }
            try await transport.shutdown()
            let overloaded = outcomes.filter { if case .failure(let e) = $0.result { e.kind == .overloaded } else { false } }
            let answered = outcomes.filter { if case .success = $0.result { true } else { false } }
            #expect(overloaded.count + answered.count == 40)
            #expect(overloaded.count >= 20, "\(overloaded.count) overloaded")
            #expect(answered.count >= 10)
            #expect(Self.seen(sink).count == answered.count, "an overloaded request reached the server")
        }
    }

    @Test("cancelling the caller cancels its request at once")
    func cancellation() async throws {
        try await RecordingAPNsServer.withServer { sink in
            sink.setResponder { _ in HTTP2ServerResponse(status: 200, delay: .seconds(30)) }
            let transport = try Self.transport(sink)
            let request = try Self.request(sink)
            let task = Task { () -> APNsTransportError? in
                do throws(APNsTransportError) { _ = try await transport.execute(request, timeout: .seconds(60)); return nil } catch { return error }
            }
            try await eventually(within: .seconds(10), "the request reached the sink") { sink.requestCount == 1 }
            let started = ContinuousClock.now
            task.cancel()
            let error = await task.value
            #expect(error?.kind == .cancelled)
            // Well before the answer's 30 s: the caller does not wait for it (the bound leaves room
            // for a loaded machine; the suite shares two cores).
            #expect(ContinuousClock.now - started < .seconds(20))
            try await transport.shutdown()
        }
    }

    @Test("idle connections close after the idle timeout; the next request opens a new one")
    func idleClose() async throws {
        try await RecordingAPNsServer.withServer { sink in
            let transport = try Self.transport(sink) { $0.idleTimeout = .milliseconds(200) }
            #expect(try await transport.execute(try Self.request(sink), timeout: .seconds(90)).status == 200)
            #expect(transport.connectionsOpened == 1)
            try await eventually(within: .seconds(10), "the idle connection closed") { transport.connectionCount == 0 }
            #expect(try await transport.execute(try Self.request(sink), timeout: .seconds(90)).status == 200)
            #expect(transport.connectionsOpened == 2)
            try await transport.shutdown()
        }
    }

    @Test("error bodies over many requests: the connection's flow-control window is replenished")
    func manyErrorBodies() async throws {
        try await RecordingAPNsServer.withServer { sink in
            let padding = String(repeating: "x", count: 200)
            sink.setResponder { _ in RecordingAPNsServer.errorResponse(status: 400, reason: "BadDeviceToken\(padding)") }
            let transport = try Self.transport(sink) { $0.maximumConnectionsPerHost = 1 }
            // 600 × ~230 bytes is twice the initial 65,535-byte connection window.
            let outcomes = try await Self.burst(transport, sink, count: 600, inFlight: 50)
            try await transport.shutdown()
            let bad = outcomes.filter {
                if case .success(let r) = $0.result { !(r.status == 400 && String(decoding: r.body, as: UTF8.self).contains("BadDeviceToken")) } else { true }
            }
            #expect(bad.isEmpty, "\(bad.count) bad: \(bad.prefix(2).map { "\($0.result)".prefix(300) })")
            #expect(transport.connectionsOpened == 1)
        }
    }

    @Test("both transports send the same request and read the same answer", arguments: APNsTransportKind.allCases)
    func bothTransports(_ kind: APNsTransportKind) async throws {
        try await RecordingAPNsServer.withServer { sink in
            sink.enqueueError(status: 410, reason: "Unregistered", timestamp: Samples.now)
            let credentials = try APNsCredentials(keyID: Self.key.keyID, teamID: Self.key.teamID, pem: Self.key.privateKeyPEM)
            let client = try APNsClient(configuration: .init(environment: .custom(url: sink.baseURL, trustRootsPEM: sink.caCertificatePEM), credentials: credentials, transport: kind),
                                        logger: Logger(label: "isle.test"))
            let id = APNsID.random()
            do throws(APNsError) {
                try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID, apnsID: id))
                Issue.record("expected 410")
            } catch {
                #expect(error.response?.status == 410)
                #expect(error.response?.reason == .unregistered)
                #expect(error.response?.invalidSince == Samples.now)
                #expect(error.response?.apnsID == id)
            }
            let ok = try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID, apnsID: id))
            #expect(ok.status == 200 && ok.apnsID == id)
            try await client.shutdown()
            let r = try #require(sink.requests.last)
            #expect(r.path == "/3/device/\(Samples.token.hex)")
            #expect(r.authority == "127.0.0.1:\(sink.server.port)")
            #expect(r.body == Samples.update().encoded)
        }
    }
}

/// Hands out 0, 1, 2, … to concurrent callers.
/// Lets its parties go on together once all have arrived.
final class Barrier: Sendable {
    private let state: Mutex<(waiting: [CheckedContinuation<Void, Never>], arrived: Int)>
    private let parties: Int
    init(parties: Int) {
        self.parties = parties
        state = Mutex(([], 0))
    }
    func arrive() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let release = state.withLock { s -> [CheckedContinuation<Void, Never>] in
                s.arrived += 1
                s.waiting.append(c)
                guard s.arrived >= parties else { return [] }
                defer { s.waiting = [] }
                return s.waiting
            }
            for w in release { w.resume() }
        }
    }
}

final class Ticket: Sendable {
    private let value = Atomic<Int>(0)
    func take() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}

/// A transport that must never be used (for building requests only).
struct UnusedTransport: APNsTransport {
    func execute(_ request: APNsTransportRequest, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse {
        throw APNsTransportError(kind: .other, reason: "unused")
    }
    func shutdown() async throws {}
}

/// A TCP listener on 127.0.0.1 that never accepts: the kernel completes the handshake, nobody speaks TLS.
final class SilentListener: Sendable {
    let fd: Int32
    let port: Int

    init() throws { (fd, port) = try Self.loopbackListener() }

    func close() { _ = Glibc.close(fd) }

    /// A listening TCP socket on 127.0.0.1, port chosen by the kernel.
    static func loopbackListener() throws -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 16) == 0 else { throw DeadlineExceeded(what: "binding a loopback listener", after: .zero) }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return (fd, Int(UInt16(bigEndian: address.sin_port)))
    }
}

/// A TCP relay on 127.0.0.1 to another port that can be frozen: while frozen it forwards nothing in
/// either direction but keeps the connections open — a peer that went silent without closing.
final class FreezableRelay: Sendable {
    let port: Int
    private let listener: Int32
    private let frozen = Atomic<Bool>(false)

    init(to target: Int) throws {
        let (fd, port) = try SilentListener.loopbackListener()
        listener = fd
        self.port = port
        Thread { [self] in
            while true {
                let client = accept(fd, nil, nil)
                guard client >= 0 else { return }
                let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var to = sockaddr_in()
                to.sin_family = sa_family_t(AF_INET)
                to.sin_addr.s_addr = inet_addr("127.0.0.1")
                to.sin_port = UInt16(target).bigEndian
                let ok = withUnsafePointer(to: &to) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                guard ok == 0 else { Glibc.close(client); continue }
                for (from, into) in [(client, upstream), (upstream, client)] {
                    Thread {
                        var buffer = [UInt8](repeating: 0, count: 16_384)
                        while true {
                            let n = buffer.withUnsafeMutableBytes { recv(from, $0.baseAddress, $0.count, 0) }
                            if n <= 0 { shutdown(into, Int32(SHUT_WR)); return }
                            // Frozen: what arrives is swallowed, as by a peer that stopped reading.
                            if self.frozen.load(ordering: .relaxed) { continue }
                            _ = buffer.withUnsafeBytes { send(into, $0.baseAddress, n, Int32(MSG_NOSIGNAL)) }
                        }
                    }.start()
                }
            }
        }.start()
    }

    func freeze(_ on: Bool) { frozen.store(on, ordering: .relaxed) }
    func close() { shutdown(listener, Int32(SHUT_RDWR)); _ = Glibc.close(listener) }
}

@Suite("NIOHTTP2Transport: PING health")
struct HTTP2TransportPingTests {
    @Test("a connection whose peer stops answering (no close, no RST) is found dead by PING and replaced")
    func pingFindsADeadConnection() async throws {
        try await RecordingAPNsServer.withServer { sink in
            let relay = try FreezableRelay(to: sink.server.port)
            defer { relay.close() }
            var configuration = NIOHTTP2Transport.Configuration(trustRootsPEM: sink.caCertificatePEM, connectTimeout: .seconds(5))
            // Short enough for a test, long enough that a busy machine answers a live peer's PING in time.
            configuration.pingInterval = .milliseconds(300)
            configuration.pingTimeout = .seconds(3)
            let transport = try NIOHTTP2Transport(configuration: configuration)
            var request = try HTTP2TransportTests.request(sink)
            request.url = request.url.replacingOccurrences(of: ":\(sink.server.port)/", with: ":\(relay.port)/")
            #expect(try await transport.execute(request, timeout: .seconds(90)).status == 200)
            #expect(transport.connectionCount == 1)
            relay.freeze(true)
            try await eventually(within: .seconds(15), "the silent connection closed") { transport.connectionCount == 0 }
            relay.freeze(false)
            var again = try HTTP2TransportTests.request(sink)
            again.url = request.url
            #expect(try await transport.execute(again, timeout: .seconds(90)).status == 200)
            #expect(transport.connectionsOpened == 2)
            try await transport.shutdown()
        }
    }
}
