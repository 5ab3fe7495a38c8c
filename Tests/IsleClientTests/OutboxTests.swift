import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing
@testable import IsleClient

/// IsleClient on its own: no server, no dependency but Foundation. The network is a URLProtocol
/// that answers each request with what the test scripted (a ``ScriptedServer``), so these tests
/// build with the client alone — as an app's package holds it (docs/client.md). The client
/// against the real server and the simulated iPhone is tested in IsleServerTests.
@Suite(.serialized) struct OutboxTests {
    @Test func installationIsRegisteredAndItsSecretKept() async throws {
        let server = ScriptedServer.start { _ in .json(201, #"{"id":"ignored","installationSecret":"s3cret"}"#) }
        defer { server.stop() }
        let path = temporaryPath()
        let client = try IsleClient(configuration: server.configuration(), storage: FileStorage(path: path), session: server.session)
        let runner = Task { await client.run() }
        await client.reportInstallation(liveActivitiesEnabled: true)
        try await until(server) { await client.isInstallationRegistered }
        let request = try #require(server.requests.first)
        #expect(request.method == "PUT")
        #expect(request.path == "/v1/installations/\(await client.installationID)")
        #expect(request.headers["authorization"] == "Bearer isle_device_test")
        #expect(request.headers["idempotency-key"]?.isEmpty == false)
        let body = try JSONSerialization.jsonObject(with: request.body) as? [String: Any]
        #expect(body?["liveActivitiesEnabled"] as? Bool == true)
        await client.stop()
        runner.cancel()

        // A relaunch reads the installation and its secret back, and has nothing left to send.
        let again = try IsleClient(configuration: server.configuration(), storage: FileStorage(path: path), session: server.session)
        #expect(await again.installationID == (await client.installationID))
        #expect(await again.isInstallationRegistered)
        #expect(await again.pendingReports == 0)
    }

    @Test func reportsSurviveAnOutageAndARelaunchAndGoOutInOrder() async throws {
        // The server is away (503 with Retry-After) for the first three requests.
        let failures = Counter(3)
        let server = ScriptedServer.start { request in
            if failures.take() { return .json(503, #"{"error":{"code":"unavailable","message":"down"}}"#, headers: ["Retry-After": "0"]) }
            if request.path.hasPrefix("/v1/installations/") { return .json(201, #"{"id":"i","installationSecret":"s3cret"}"#) }
            if request.path == "/v1/activities" { return .json(201, #"{"id":"act_1","state":"active"}"#) }
            return .json(200, #"{"id":"act_1","state":"active"}"#)
        }
        defer { server.stop() }
        var configuration = server.configuration()
        configuration.firstRetry = 0.01
        configuration.maximumRetry = 0.05
        let path = temporaryPath()
        // The first launch queues an installation and an activity, then ends before the server is back.
        let first = try IsleClient(configuration: configuration, storage: FileStorage(path: path), session: server.session)
        await first.reportInstallation(liveActivitiesEnabled: true)
        await first.reportToken(activityID: "A", attributesType: "PizzaDeliveryAttributes", token: Data(repeating: 0xAB, count: 32), externalKey: nil)
        await first.reportToken(activityID: "A", attributesType: "PizzaDeliveryAttributes", token: Data(repeating: 0xCD, count: 32), externalKey: nil)
        #expect(await first.pendingReports >= 2)
        await first.stop()

        let second = try IsleClient(configuration: configuration, storage: FileStorage(path: path), session: server.session)
        let runner = Task { await second.run() }
        try await until(server) {
            let id = await second.serverID(of: "A")
            return await second.pendingReports == 0 && id == "act_1"
        }
        await second.stop()
        runner.cancel()

        let answered = server.requests.filter { !$0.wasRefused }
        // The installation first (an activity's registration needs it), then the activity with
        // the newest token: a newer token replaced the one not yet sent.
        #expect(answered.map(\.path).first?.hasPrefix("/v1/installations/") == true)
        let registration = try #require(answered.first { $0.path == "/v1/activities" })
        let body = try JSONSerialization.jsonObject(with: registration.body) as? [String: Any]
        #expect(body?["token"] as? String == String(repeating: "cd", count: 32))
        #expect(registration.headers["isle-installation-secret"] == "s3cret")
        // A retried report keeps its Idempotency-Key: the server may have taken the first try.
        let keys = Dictionary(grouping: server.requests, by: \.path).mapValues { Set($0.compactMap { $0.headers["idempotency-key"] }) }
        #expect(keys.values.allSatisfy { $0.count == 1 })
    }

    @Test func aRefusalIsKeptWithItsReasonAndNotRetried() async throws {
        let server = ScriptedServer.start { request in
            if request.path.hasPrefix("/v1/installations/") { return .json(201, #"{"id":"i","installationSecret":"s"}"#) }
            return .json(422, #"{"error":{"code":"unknownAttributesType","message":"no schema for Nope","field":"attributesType"}}"#)
        }
        defer { server.stop() }
        let client = try IsleClient(configuration: server.configuration(), storage: FileStorage(path: temporaryPath()), session: server.session)
        let runner = Task { await client.run() }
        await client.reportToken(activityID: "B", attributesType: "Nope", token: Data(repeating: 1, count: 32), externalKey: nil)
        // Waited for with a deadline: a client that never settles fails the test instead of hanging it.
        try await until(server) {
            if case .refused = await client.registrationStatus(of: "B") { return true }
            return false
        }
        let status = await client.registrationStatus(of: "B")
        guard case .refused(let refusal) = status else { Issue.record("expected a refusal, got \(status)"); return }
        #expect(refusal.status == 422)
        #expect(refusal.code == "unknownAttributesType")
        #expect(await client.pendingReports == 0)
        let tries = server.requests.filter { $0.path == "/v1/activities" }.count
        #expect(tries == 1)
        await client.stop()
        runner.cancel()
    }

    @Test func environmentIsReadFromTheProvisioningProfile() {
        func profile(_ value: String) -> Data {
            Data("garbage-before<?xml version=\"1.0\" encoding=\"UTF-8\"?><plist version=\"1.0\"><dict><key>Entitlements</key><dict><key>aps-environment</key><string>\(value)</string></dict></dict></plist>garbage-after".utf8)
        }
        #expect(IsleClient.Environment.fromProvisioningProfile(profile("development")) == .sandbox)
        #expect(IsleClient.Environment.fromProvisioningProfile(profile("production")) == .production)
        #expect(IsleClient.Environment.fromProvisioningProfile(profile("something")) == nil)
        #expect(IsleClient.Environment.fromProvisioningProfile(Data("no plist here".utf8)) == nil)
    }
}

// MARK: A scripted server behind URLProtocol

struct Recorded: Sendable {
    var method: String
    var path: String
    var headers: [String: String]
    var body: Data
    var wasRefused: Bool
}

struct Scripted: Sendable {
    var status: Int
    var body: Data
    var headers: [String: String]
    static func json(_ status: Int, _ text: String, headers: [String: String] = [:]) -> Scripted {
        Scripted(status: status, body: Data(text.utf8), headers: headers.merging(["Content-Type": "application/json"]) { a, _ in a })
    }
}

/// Answers requests to `http://isle.test` by the script; each server is a host of its own, so tests
/// running at once do not see each other's requests.
final class ScriptedServer: Sendable {
    let host: String
    let script: @Sendable (Recorded) -> Scripted
    private let log = Locked<[Recorded]>([])
    let session: URLSession
    /// One element per request the client finished (its `Configuration.log`): what `until` waits on.
    let events: AsyncStream<Void>
    private let eventSink: AsyncStream<Void>.Continuation

    private init(script: @escaping @Sendable (Recorded) -> Scripted) {
        host = "isle-\(UUID().uuidString.lowercased()).test"
        self.script = script
        (events, eventSink) = AsyncStream.makeStream(of: Void.self)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.protocolClasses = [ScriptedProtocol.self]
        session = URLSession(configuration: configuration)
    }

    static func start(_ script: @escaping @Sendable (Recorded) -> Scripted) -> ScriptedServer {
        let server = ScriptedServer(script: script)
        ScriptedProtocol.servers.withLock { $0[server.host] = server }
        return server
    }

    func stop() {
        ScriptedProtocol.servers.withLock { $0[host] = nil }
        eventSink.finish()
    }

    var requests: [Recorded] { log.withLock { $0 } }

    func configuration() -> IsleClient.Configuration {
        var c = IsleClient.Configuration(serverURL: URL(string: "http://\(host)")!, deviceKey: "isle_device_test", environment: .sandbox, lifecycle: nil)
        let sink = eventSink
        c.log = { _ in sink.yield() }
        c.firstRetry = 0.01
        c.maximumRetry = 0.05
        return c
    }

    func answer(_ request: URLRequest) -> (Scripted, Recorded) {
        var headers: [String: String] = [:]
        for (k, v) in request.allHTTPHeaderFields ?? [:] { headers[k.lowercased()] = v }
        var recorded = Recorded(method: request.httpMethod ?? "GET", path: request.url?.path ?? "", headers: headers, body: request.httpBody ?? Self.read(request.httpBodyStream), wasRefused: false)
        let answer = script(recorded)
        recorded.wasRefused = answer.status >= 400
        log.withLock { $0.append(recorded) }
        return (answer, recorded)
    }

    static func read(_ stream: InputStream?) -> Data {
        guard let stream else { return Data() }
        stream.open()
        defer { stream.close() }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while stream.hasBytesAvailable {
            let n = stream.read(&buffer, maxLength: buffer.count)
            if n <= 0 { break }
            data.append(contentsOf: buffer[..<n])
        }
        return data
    }
}

/// Foundation makes one per request and drives it from its loading thread; the only shared state
/// is `servers`, behind its lock.
final class ScriptedProtocol: URLProtocol {
    static let servers = Locked<[String: ScriptedServer]>([:])

    override class func canInit(with request: URLRequest) -> Bool { true }
    override class func canonicalRequest(for request: URLRequest) -> URLRequest { request }

    override func startLoading() {
        guard let host = request.url?.host, let server = Self.servers.withLock({ $0[host] }) else {
            client?.urlProtocol(self, didFailWithError: URLError(.cannotConnectToHost))
            return
        }
        let (answer, _) = server.answer(request)
        let response = HTTPURLResponse(url: request.url!, statusCode: answer.status, httpVersion: "HTTP/1.1", headerFields: answer.headers)!
        client?.urlProtocol(self, didReceive: response, cacheStoragePolicy: .notAllowed)
        client?.urlProtocol(self, didLoad: answer.body)
        client?.urlProtocolDidFinishLoading(self)
    }

    override func stopLoading() {}
}

/// A value behind a lock (Foundation's NSLock: this target depends on nothing else).
final class Locked<Value>: @unchecked Sendable {
    // @unchecked: every access to `value` goes through `lock`.
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// Counts down: `take()` is true `n` times.
final class Counter: Sendable {
    private let left: Locked<Int>
    init(_ n: Int) { left = Locked(n) }
    func take() -> Bool { left.withLock { if $0 > 0 { $0 -= 1; return true }; return false } }
}

func temporaryPath() -> String {
    NSTemporaryDirectory() + "/isle-client-tests-\(UUID().uuidString)/state.json"
}

/// Waits until `condition` holds: checked now and after each request the client finishes (the
/// server's `events`), for at most `seconds` — a deadline, never a sleep that times a result.
func until(_ server: ScriptedServer, _ seconds: Double = 20, _ condition: @escaping @Sendable () async -> Bool) async throws {
    let held = try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask {
            if await condition() { return true }
            for await _ in server.events {
                // The client applies an answer in the same actor turn that logs it: by the time
                // this reads its state, the request's outcome is in.
                if await condition() { return true }
            }
            return await condition()
        }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return false
        }
        let first = try await group.next() ?? false
        group.cancelAll()
        return first
    }
    if !held {
        Issue.record("the condition did not hold within \(seconds) s")
        throw CancellationError()
    }
}
