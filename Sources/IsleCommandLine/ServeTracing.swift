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

    /// Tracing is on when `OTEL_TRACES_EXPORTER` is `otlp` or `console`, or an OTLP endpoint is
    /// set; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off. Another exporter
    /// is a configuration error.
    static func wanted(_ environment: [String: String]) throws -> Bool {
        if environment["OTEL_SDK_DISABLED"]?.lowercased() == "true" { return false }
        if let exporter = environment["OTEL_TRACES_EXPORTER"]?.lowercased(), !exporter.isEmpty {
            switch exporter {
            case "none": return false
            case "otlp", "console": return true
            default: throw CLIError.configuration("OTEL_TRACES_EXPORTER=\(exporter): isle serve exports traces with otlp or console (or none)")
            }
        }
        return ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].contains { !(environment[$0] ?? "").isEmpty }
    }

    /// The tracer and the service that exports its spans, or nil when tracing is off. swift-otel
    /// reads the rest of the OTEL_* variables (endpoint, protocol, headers, sampler, batching)
    /// from the process's environment; `environment` is that environment, except in tests.
    static func start(_ environment: [String: String], logger: Logger) throws -> ServeTracing? {
        guard try wanted(environment) else { return nil }
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
            let exporter = environment["OTEL_TRACES_EXPORTER"]?.lowercased() ?? "otlp"
            let endpoint = environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"].map { $0.hasSuffix("/") ? $0 + "v1/traces" : $0 + "/v1/traces" }
                ?? "http://localhost:4318/v1/traces"
            let proto = environment["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] ?? environment["OTEL_EXPORTER_OTLP_PROTOCOL"] ?? "http/protobuf"
            return ServeTracing(tracer: tracer, service: service, destination: exporter == "otlp" ? "OTLP \(proto) to \(endpoint)" : exporter)
        } catch {
            throw CLIError.configuration("tracing: \(error); check the OTEL_* variables (docs/server.md, \"Tracing\"), or unset them to serve without traces")
        }
    }
}
