import Foundation
import Hummingbird
import IsleCore
import IsleServer
import IsleStore
import IsleDelivery
import IsleTesting
import Logging
import OTel
import Synchronization
import Testing
import Tracing

/// An OTLP/HTTP receiver on 127.0.0.1 (JSON encoding): keeps every span it is sent.
final class OTLPReceiver: Sendable {
    struct Span: Sendable, CustomStringConvertible {
        var traceID: String
        var spanID: String
        var parentID: String
        var name: String
        /// OTLP's SpanKind: 2 server, 3 client, 5 consumer.
        var kind: Int
        var attributes: [String: String]
        var description: String { "\(name) [kind \(kind)] \(traceID)/\(spanID) ← \(parentID) \(attributes)" }
    }
    let spans = Mutex<[Span]>([])
    let task = Mutex<Task<Void, any Error>?>(nil)
    let port = Mutex<(Int?, [CheckedContinuation<Int, Never>])>((nil, []))

    /// OTLP/JSON ids: hex, as the specification writes them, or base64 (protobuf's JSON for bytes).
    static func hex(_ text: String?) -> String {
        guard let text, !text.isEmpty else { return "" }
        if text.count % 2 == 0, text.allSatisfy(\.isHexDigit) { return text.lowercased() }
        return Data(base64Encoded: text).map { $0.map { String(format: "%02x", $0) }.joined() } ?? text
    }

    static func value(_ v: JSONValue?) -> String {
        guard let v else { return "" }
        for key in ["stringValue", "intValue", "doubleValue", "boolValue"] {
            if let x = v[key] { return x.stringValue ?? x.numberValue?.literal ?? x.boolValue.map(String.init) ?? "\(x)" }
        }
        return "\(v)"
    }

    func start() async -> Int {
        let router = Router()
        router.post("v1/traces") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 50_000_000)
            let json = try JSONParser.parse(Array(buffer: body))
            var got: [Span] = []
            for resource in json["resourceSpans"]?.arrayValue ?? [] {
                for scope in resource["scopeSpans"]?.arrayValue ?? [] {
                    for s in scope["spans"]?.arrayValue ?? [] {
                        var attributes: [String: String] = [:]
                        for a in s["attributes"]?.arrayValue ?? [] { attributes[a["key"]?.stringValue ?? ""] = Self.value(a["value"]) }
                        got.append(Span(traceID: Self.hex(s["traceId"]?.stringValue), spanID: Self.hex(s["spanId"]?.stringValue), parentID: Self.hex(s["parentSpanId"]?.stringValue),
                                        name: s["name"]?.stringValue ?? "", kind: Int(s["kind"]?.numberValue?.literal ?? "") ?? 0, attributes: attributes))
                    }
                }
            }
            self.spans.withLock { $0 += got }
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: "{}")))
        }
        var logger = Logger(label: "otlp-receiver")
        logger.logLevel = .critical
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)), onServerRunning: { channel in
            let p = channel.localAddress?.port ?? 0
            for w in self.port.withLock({ b -> [CheckedContinuation<Int, Never>] in
                b.0 = p
                defer { b.1 = [] }
                return b.1
            }) { w.resume(returning: p) }
        }, logger: logger)
        task.withLock { $0 = Task { try await app.run() } }
        return await withCheckedContinuation { c in
            if let p = port.withLock({ b -> Int? in
                if let p = b.0 { return p }
                b.1.append(c)
                return nil
            }) { c.resume(returning: p) }
        }
    }

    func stop() { task.withLock { $0?.cancel() } }

    func spans(trace: String) -> [Span] { spans.withLock { $0.filter { $0.traceID == trace } } }
}

/// Keeps every log record with its metadata (the metadata provider's included).
final class LogRecords: Sendable {
    struct Record: Sendable {
        var message: String
        var metadata: [String: String]
        var level: Logger.Level = .info
    }
    let records = Mutex<[Record]>([])

    struct Handler: LogHandler {
        let records: LogRecords
        var metadata: Logger.Metadata = [:]
        var metadataProvider: Logger.MetadataProvider?
        var logLevel: Logger.Level = .debug
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            log(level: event.level, message: event.message, metadata: event.metadata, source: event.source, file: event.file, function: event.function, line: event.line)
        }
        func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
            var all = metadata
            all.merge(metadataProvider?.get() ?? [:]) { _, new in new }
            all.merge(explicit ?? [:]) { _, new in new }
            records.records.withLock { $0.append(Record(message: message.description, metadata: all.mapValues { "\($0)" }, level: level)) }
        }
    }

    func logger() -> Logger {
        var logger = Logger(label: "isle.test.server", factory: { _, _ in Handler(records: self, metadataProvider: OTel.makeLoggingMetadataProvider()) })
        logger.logLevel = .debug
        return logger
    }
}

@Suite("Tracing: one update followed from the API request to the job to the APNs request", .serialized)
struct TracingTests {
    /// Every span exported as JSON to the receiver on `port`, soon after it ends.
    static func configuration(port: Int) -> OTel.Configuration {
        var configuration = OTel.Configuration.default
        configuration.serviceName = "isle-test"
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.traces.enabled = true
        configuration.traces.exporter = .otlp
        configuration.traces.sampler = .parentBasedAlwaysOn
        configuration.traces.otlpExporter.protocol = .httpJSON
        configuration.traces.otlpExporter.endpoint = "http://127.0.0.1:\(port)/v1/traces"
        configuration.traces.batchSpanProcessor.scheduleDelay = .milliseconds(50)
        var quiet = Logger(label: "otel")
        quiet.logLevel = .critical
        configuration.diagnosticLogger = .custom(quiet)
        return configuration
    }

    @Test("the backend's trace continues in the request's span; the delivery attempt is its child, the APNs request the attempt's, with the apns-id and status; the log lines carry the trace id")
    func oneUpdate() async throws {
        let receiver = OTLPReceiver()
        let port = await receiver.start()
        defer { receiver.stop() }
        let (tracer, exporter) = try OTel.makeTracingBackend(configuration: Self.configuration(port: port))
        let exporting = Task { try await exporter.run() }
        defer { exporting.cancel() }
        let logs = LogRecords()

        try await ServerFixture.with(server: { c in c.tracer = tracer }, logger: logs.logger()) { f in
            let (_, id) = try await f.appStartsActivity(key: "order-traced")
            // The backend's own span: the update's trace is the backend's.
            let backendTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
            let backendSpan = "00f067aa0ba902b7"
            let accepted = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Traced")],
                                            headers: [("traceparent", "00-\(backendTrace)-\(backendSpan)-01")])
            #expect(accepted.status == 202)
            try await eventually("delivered") { (try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count ?? 0) == 1 }
            let apnsID = try #require(try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.first?["apnsID"]?.stringValue)

            try await eventually("the request's, the attempt's and the APNs request's spans exported") {
                let kinds = Set(receiver.spans(trace: backendTrace).map(\.kind))
                return kinds.isSuperset(of: [2, 3, 5])
            }
            let spans = receiver.spans(trace: backendTrace)
            let request = try #require(spans.first { $0.kind == 2 }, "\(spans)")
            let attempt = try #require(spans.first { $0.kind == 5 }, "\(spans)")
            let push = try #require(spans.first { $0.kind == 3 }, "\(spans)")
            #expect(spans.count == 3, "\(spans)")
            #expect(request.parentID == backendSpan)
            #expect(request.name.hasPrefix("POST /v1/activities/") && request.name.hasSuffix("/update") && !request.name.contains(id), "\(request.name)")
            #expect(request.attributes["http.response.status_code"] == "202")
            #expect(attempt.parentID == request.spanID)
            #expect(attempt.name == "deliver update" && attempt.attributes["isle.job.result"] == "sent" && attempt.attributes["isle.activity.id"] == id, "\(attempt)")
            #expect(push.parentID == attempt.spanID)
            #expect(push.attributes["apns.id"]?.lowercased() == apnsID.lowercased(), "\(push)")
            #expect(push.attributes["http.response.status_code"] == "200" && push.attributes["apns.push_type"] == "liveactivity", "\(push)")

            // The engine's log line for that push carries the trace and the attempt's span.
            let line = logs.records.withLock { $0.first { $0.message == "pushed" && $0.metadata["apns-id"]?.lowercased() == apnsID.lowercased() } }
            #expect(line?.metadata["trace_id"] == backendTrace, "\(String(describing: line))")
            #expect(line?.metadata["span_id"] == attempt.spanID, "\(String(describing: line))")
        }
    }

    @Test("a malformed or hostile traceparent starts a new trace: the request is served, and the job keeps only the server's own well-formed traceparent")
    func hostileTraceParent() async throws {
        let receiver = OTLPReceiver()
        let port = await receiver.start()
        defer { receiver.stop() }
        // The tracer's own warnings (what it could not parse) recorded too.
        let logs = LogRecords()
        var configuration = Self.configuration(port: port)
        configuration.diagnosticLogger = .custom(logs.logger())
        configuration.diagnosticLogLevel = .trace
        let (tracer, exporter) = try OTel.makeTracingBackend(configuration: configuration)
        let exporting = Task { try await exporter.run() }
        defer { exporting.cancel() }
        try await ServerFixture.with(server: { c in c.tracer = tracer }, logger: logs.logger()) { f in
            let (_, id) = try await f.appStartsActivity(key: "order-hostile")
            // A phone (the device key) does not choose the trace, even with a well-formed traceparent.
            let fromPhone = try await f.call("PUT", "/v1/installations/fixture-phone", key: f.deviceKey, body: ["liveActivitiesEnabled": true],
                                             headers: f.secretHeader() + [("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")])
            #expect((200...299).contains(fromPhone.status), "\(fromPhone.status)")
            let store = try SQLiteStore(path: f.databasePath)
            let hostile = [
                "garbage", "", "00-" + String(repeating: "a", count: 5000), "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ; x=y",
                "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            ]
            var jobs: [Int64] = []
            for (i, value) in hostile.enumerated() {
                let answer = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Hostile \(i)")],
                                              headers: [("traceparent", value)])
                #expect(answer.status == 202, "\(value.prefix(80)): \(answer.status)")
                jobs += (answer.json["jobs"]?.arrayValue ?? []).compactMap { $0.numberValue?.exactInt64Value }
            }
            #expect(jobs.count == hostile.count)
            for jobID in jobs {
                let job = try #require(try await store.job(id: jobID))
                // The server's own span's traceparent: well formed, and a new trace, not the malformed one's.
                let parts = (job.traceParent ?? "").split(separator: "-", omittingEmptySubsequences: false)
                #expect(parts.count == 4 && parts[0] == "00" && parts[1].count == 32 && parts[2].count == 16 && parts[3].count == 2
                        && parts[1].allSatisfy { $0.isHexDigit && !$0.isUppercase } && parts[1].lowercased() != "4bf92f3577b34da6a3ce929d0e0e4736",
                        "job \(jobID): \(job.traceParent ?? "nil")")
            }
            try await eventually("the phone's request's span exported") { receiver.spans.withLock { $0.contains { $0.name.hasPrefix("PUT /v1/installations") } } }
            #expect(receiver.spans(trace: "4bf92f3577b34da6a3ce929d0e0e4736").isEmpty, "\(receiver.spans(trace: "4bf92f3577b34da6a3ce929d0e0e4736"))")
            // No secret in any log line, the tracer's included.
            let secrets = [f.backendKey, f.deviceKey] + f.secretHeader().map(\.1)
            let leaked = logs.records.withLock { records in records.filter { r in secrets.contains { s in r.message.contains(s) || r.metadata.values.contains { $0.contains(s) } } } }
            #expect(leaked.isEmpty, "\(leaked.map(\.message))")
            #expect(logs.records.withLock { !$0.isEmpty })
        }
    }

    @Test("without a tracer no job keeps a trace context, whatever the request carries")
    func offByDefault() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-untraced")
            let answer = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Plain")],
                                          headers: [("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")])
            #expect(answer.status == 202)
            let jobs = (answer.json["jobs"]?.arrayValue ?? []).compactMap { $0.numberValue?.exactInt64Value }
            #expect(jobs.count == 1)
            let store = try SQLiteStore(path: f.databasePath)
            for jobID in jobs { #expect(try #require(try await store.job(id: jobID)).traceParent == nil) }
            try await eventually("delivered") { (try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count ?? 0) == 1 }
        }
    }
}
