import Foundation
import Logging
import OTel
import ServiceLifecycle
import Tracing

/// `isle serve`'s traces (docs/server.md, "Tracing"): off unless the environment asks for them
/// with OpenTelemetry's usual variables; then spans go out over OTLP (HTTP, protobuf or JSON).
struct ServeTracing {
    let tracer: any Tracer
    let service: any Service
    /// Where the spans go, for the banner.
    let destination: String

    /// Tracing is on when `OTEL_TRACES_EXPORTER` is `otlp`, or an OTLP endpoint is set;
    /// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off. Another exporter
    /// (swift-otel 1.6 has no other for traces, `console` included) is a configuration error.
    static func wanted(_ environment: [String: String]) throws -> Bool {
        if environment["OTEL_SDK_DISABLED"]?.lowercased() == "true" { return false }
        if let exporter = environment["OTEL_TRACES_EXPORTER"]?.lowercased(), !exporter.isEmpty {
            switch exporter {
            case "none": return false
            case "otlp": return true
            default: throw CLIError.configuration("OTEL_TRACES_EXPORTER=\(exporter): isle serve exports traces over OTLP only; set it to otlp (or none)")
            }
        }
        return ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].contains { !(environment[$0] ?? "").isEmpty }
    }

    /// What is wrong with the OTEL_* variables isle serve's tracing reads, all at once. swift-otel
    /// 1.6 stops the process (a trap) on a protocol, sampler or propagator it does not have, and
    /// silently ignores a value it cannot read: both are refused here, before it sees them.
    static func problems(_ environment: [String: String]) -> [String] {
        var problems: [String] = []
        func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
        for name in ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] {
            guard let v = value(name) else { continue }
            switch v.lowercased() {
            case "http/protobuf", "http/json": break
            case "grpc": problems.append("\(name)=grpc: isle serve exports OTLP over HTTP; use http/protobuf (a collector's port 4318) or http/json")
            default: problems.append("\(name)=\(v): use http/protobuf or http/json")
            }
        }
        for name in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] {
            guard let v = value(name) else { continue }
            let url = URLComponents(string: v)
            if !["http", "https"].contains(url?.scheme?.lowercased() ?? "") || (url?.host ?? "").isEmpty {
                problems.append("\(name)=\(v): give an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318")
            }
        }
        let ratioSamplers = ["traceidratio", "parentbased_traceidratio"]
        if let v = value("OTEL_TRACES_SAMPLER") {
            let known = ["always_on", "always_off", "parentbased_always_on", "parentbased_always_off"] + ratioSamplers
            if !known.contains(v.lowercased()) {
                problems.append("OTEL_TRACES_SAMPLER=\(v): isle serve samples with \(known.joined(separator: ", "))")
            } else if ratioSamplers.contains(v.lowercased()), let arg = value("OTEL_TRACES_SAMPLER_ARG"), !(Double(arg).map { (0...1).contains($0) } ?? false) {
                problems.append("OTEL_TRACES_SAMPLER_ARG=\(arg): the ratio of traces kept, from 0 to 1")
            }
        }
        if let v = value("OTEL_PROPAGATORS") {
            for p in v.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }) where !["tracecontext", "none"].contains(p) {
                problems.append("OTEL_PROPAGATORS: \(p) is not available; isle serve propagates W3C trace context (tracecontext) or none")
            }
        }
        for (name, minimum) in [("OTEL_BSP_SCHEDULE_DELAY", 0), ("OTEL_BSP_EXPORT_TIMEOUT", 0), ("OTEL_BSP_MAX_QUEUE_SIZE", 1), ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1),
                                ("OTEL_EXPORTER_OTLP_TIMEOUT", 0), ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 0)] {
            guard let v = value(name) else { continue }
            if !(Int(v).map { $0 >= minimum } ?? false) { problems.append("\(name)=\(v): a whole number, \(minimum) or more") }
        }
        for name in ["OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"] {
            guard let v = value(name) else { continue }
            if !["gzip", "none"].contains(v.lowercased()) { problems.append("\(name)=\(v): use gzip or none") }
        }
        for name in ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"] {
            guard let v = value(name) else { continue }
            // Never echoed: headers hold the collector's credentials.
            if v.split(separator: ",").contains(where: { !$0.contains("=") || $0.hasPrefix("=") }) {
                problems.append("\(name): write key=value pairs separated by commas")
            }
        }
        return problems
    }

    /// The tracer and the service that exports its spans, or nil when tracing is off. swift-otel
    /// reads the rest of the OTEL_* variables (endpoint, protocol, headers, sampler, batching)
    /// from the process's environment; `environment` is that environment, except in tests.
    static func start(_ environment: [String: String], logger: Logger) throws -> ServeTracing? {
        guard try wanted(environment) else { return nil }
        let problems = problems(environment)
        guard problems.isEmpty else {
            throw CLIError.configuration("tracing: \(problems.joined(separator: "; ")) (docs/server.md, \"Tracing\")")
        }
        var configuration = OTel.Configuration.default
        configuration.serviceName = "isle"
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.traces.enabled = true
        configuration.diagnosticLogger = .custom(logger)
        // swift-otel sets its logger's level from this, not from the logger given.
        configuration.diagnosticLogLevel = .error
        do {
            let (tracer, service) = try OTel.makeTracingBackend(configuration: configuration)
            let endpoint = environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"].map { $0.hasSuffix("/") ? $0 + "v1/traces" : $0 + "/v1/traces" }
                ?? "http://localhost:4318/v1/traces"
            let proto = environment["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] ?? environment["OTEL_EXPORTER_OTLP_PROTOCOL"] ?? "http/protobuf"
            return ServeTracing(tracer: tracer, service: service, destination: "OTLP \(proto) to \(endpoint)")
        } catch {
            throw CLIError.configuration("tracing: \(error); check the OTEL_* variables (docs/server.md, \"Tracing\"), or unset them to serve without traces")
        }
    }
}
