public import Foundation
public import IsleHTTP2Server
public import Logging
import Synchronization

/// A request the sink received, as it arrived on the wire.
public struct RecordedRequest: Sendable {
    public var method: String
    public var path: String
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    public var connectionID: Int
    public var authority: String? = nil
    /// The HTTP/2 stream id it came on.
    public var streamID: Int = 0
    /// Streams the client had open on that connection when this one started, itself included.
    public var concurrentStreams: Int = 1

    public func values(_ name: String) -> [String] { headers.filter { $0.name == name }.map(\.value) }
    public func value(_ name: String) -> String? { values(name).first }
    public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// A minimal APNs stand-in for client tests and benchmarks: real HTTP/2 over TLS on loopback,
/// records every request, and answers from a script (default: 200 with `apns-id` echoed).
///
/// It checks nothing itself; the full, strict fake is IsleSimulator. Tests make their own
/// assertions on ``requests``.
public final class RecordingAPNsServer: Sendable {
    public typealias Responder = @Sendable (RecordedRequest) -> HTTP2ServerResponse

    public let server: HTTP2TLSServer
    /// PEM of the CA that signed the server's certificate: the client's only trust root.
    public let caCertificatePEM: String
    private let state: Mutex<State>
    private let recordsRequests: Bool

    struct State {
        var requests: [RecordedRequest] = []
        var scripted: [HTTP2ServerResponse] = []
        var responder: Responder?
        var count = 0
    }

    public var baseURL: String { server.baseURL }

    init(server: HTTP2TLSServer, caCertificatePEM: String, recordsRequests: Bool) {
        self.server = server
        self.caCertificatePEM = caCertificatePEM
        self.state = Mutex(State())
        self.recordsRequests = recordsRequests
    }

    /// Binds on 127.0.0.1, port 0. Call ``run()`` (or use ``withServer(recordsRequests:logger:_:)``).
    public static func bind(recordsRequests: Bool = true, maxConcurrentStreams: Int = 1000, logger: Logger = Logger(label: "isle.test.sink")) async throws -> RecordingAPNsServer {
        let ca = try CertificateAuthority(commonName: "Isle Test CA")
        let leaf = try ca.issueServerCertificate()
        let box = Box()
        let server = try await HTTP2TLSServer.bind(
            configuration: .init(certificateChainPEM: leaf.certificatePEM, privateKeyPEM: leaf.privateKeyPEM, maxConcurrentStreams: maxConcurrentStreams),
            logger: logger
        ) { request in
            box.sink.get()!.handle(request)
        }
        let sink = RecordingAPNsServer(server: server, caCertificatePEM: ca.certificatePEM, recordsRequests: recordsRequests)
        box.sink.set(sink)
        return sink
    }

    /// Runs a sink for the duration of `body`, then stops it.
    public static func withServer<R: Sendable>(recordsRequests: Bool = true, maxConcurrentStreams: Int = 1000, logger: Logger = Logger(label: "isle.test.sink"),
                                               _ body: (RecordingAPNsServer) async throws -> R) async throws -> R {
        let sink = try await bind(recordsRequests: recordsRequests, maxConcurrentStreams: maxConcurrentStreams, logger: logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await sink.server.run() }
            do {
                let result = try await body(sink)
                group.cancelAll()
                return result
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }

    public func run() async throws { try await server.run() }

    /// Answers the next requests, in order, with these responses; then falls back to the responder.
    public func enqueue(_ responses: HTTP2ServerResponse...) { state.withLock { $0.scripted += responses } }

    /// Answers with an APNs error: JSON body `{"reason": …}` (and `timestamp` in ms for 410).
    public func enqueueError(status: Int, reason: String, timestamp: Date? = nil, times: Int = 1) {
        for _ in 0..<times { enqueue(Self.errorResponse(status: status, reason: reason, timestamp: timestamp)) }
    }

    /// Decides answers for requests with nothing scripted.
    public func setResponder(_ responder: Responder?) { state.withLock { $0.responder = responder } }

    public var requests: [RecordedRequest] { state.withLock { $0.requests } }
    public var requestCount: Int { state.withLock { $0.count } }
    public func clearRequests() { state.withLock { $0.requests.removeAll() } }

    public static func errorResponse(status: Int, reason: String, timestamp: Date? = nil) -> HTTP2ServerResponse {
        var body = "{\"reason\":\"\(reason)\""
        if let timestamp { body += ",\"timestamp\":\(Int64(timestamp.timeIntervalSince1970 * 1000))" }
        body += "}"
        return HTTP2ServerResponse(status: status, headers: [("content-type", "application/json")], body: Array(body.utf8))
    }

    func handle(_ request: HTTP2ServerRequest) -> HTTP2ServerResponse {
        let recorded = RecordedRequest(method: request.method, path: request.path, headers: request.headers, body: request.body, connectionID: request.connectionID,
                                       authority: request.authority, streamID: request.streamID, concurrentStreams: request.concurrentStreams)
        var response = state.withLock { s -> HTTP2ServerResponse? in
            s.count += 1
            if recordsRequests { s.requests.append(recorded) }
            if !s.scripted.isEmpty { return s.scripted.removeFirst() }
            return s.responder?(recorded)
        } ?? HTTP2ServerResponse(status: 200)
        // Echo ids as APNs does; clients match answers by them.
        if let id = request.value("apns-id"), !response.headers.contains(where: { $0.name == "apns-id" }) {
            response.headers.insert(("apns-id", id), at: 0)
        } else if request.path.hasPrefix("/3/device/"), !response.headers.contains(where: { $0.name == "apns-id" }) {
            response.headers.insert(("apns-id", UUID().uuidString.lowercased()), at: 0)
        }
        if let id = request.value("apns-request-id"), !response.headers.contains(where: { $0.name == "apns-request-id" }) {
            response.headers.insert(("apns-request-id", id), at: 0)
        }
        return response
    }

    /// Breaks the init cycle between the server's handler and the sink.
    final class Box: Sendable {
        let sink = Once<RecordingAPNsServer>()
    }
}

/// A value set once, read many times.
public final class Once<Value: Sendable>: Sendable {
    private let storage = Mutex<Value?>(nil)
    public init() {}
    public func set(_ value: Value) { storage.withLock { $0 = value } }
    public func get() -> Value? { storage.withLock { $0 } }
}
