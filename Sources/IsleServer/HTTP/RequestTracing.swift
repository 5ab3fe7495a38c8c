import HTTPTypes
import Hummingbird
import IsleDelivery
import Tracing

/// A server span per API request (docs/server.md, "Tracing"). A request with a backend key that
/// carries a W3C `traceparent` continues the backend's trace; any other starts one of its own (the
/// device key ships in every copy of the app: a phone does not choose traces or their sampling).
/// While the request is served, the span is the current context (so the logs carry its trace id)
/// and ``TraceParent/current`` holds its `traceparent`, which every job the request queues keeps:
/// the delivery's spans join this trace.
///
/// "A backend key" is a key the directory knows as a current backend key (a cached look-up, the
/// one the API then makes): the prefix alone is anyone's to send, and a caller answered 401 must
/// not steer the server's traces or their sampling.
struct RequestTracingMiddleware<Context: RequestContext>: RouterMiddleware {
    let tracer: any Tracer
    let keys: APIKeyDirectory

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var parent = ServiceContext.current ?? .topLevel
        if let header = request.headers[.authorization], header.hasPrefix("Bearer isle_backend_"),
           (try? await keys.current(hash: APIKeys.hash(String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces))))??.scope == .backend {
            // Only the two trace-context headers: the tracer may log what it could not parse, and
            // the other headers hold secrets.
            var carrier: [String: String] = [:]
            for name in ["traceparent", "tracestate"] {
                if let field = HTTPField.Name(name), let value = request.headers[field] { carrier[name] = value }
            }
            if !carrier.isEmpty { tracer.extract(carrier, into: &parent, using: DictionaryExtractor()) }
        }
        let method = request.method.rawValue
        let span = tracer.startSpan(method, context: parent, ofKind: .server)
        defer { span.end() }
        // The route names the span, never the path: paths hold orders' and users' keys.
        span.updateAttributes { a in a["http.request.method"] = method }
        var carrier: [String: String] = [:]
        tracer.inject(span.context, into: &carrier, using: DictionaryInjector())
        do {
            let response = try await ServiceContext.$current.withValue(span.context) {
                try await TraceParent.$current.withValue(carrier["traceparent"]) { try await next(request, context) }
            }
            finish(span, route: context.endpointPath, method: method, status: Int(response.status.code))
            return response
        } catch {
            let status = (error as? any HTTPResponseError).map { Int($0.status.code) } ?? 500
            finish(span, route: context.endpointPath, method: method, status: status)
            span.recordError(error)
            throw error
        }
    }

    func finish(_ span: any Span, route: String?, method: String, status: Int) {
        // Named by its route ("POST /v1/activities/{id}/update"), never by ids in the path.
        if let route { span.operationName = "\(method) \(route)" }
        span.updateAttributes { a in
            a["http.route"] = route
            a["http.response.status_code"] = status
        }
        if status >= 500 { span.setStatus(SpanStatus(code: .error)) }
    }
}

/// Writes trace context into a dictionary (the `traceparent` a job keeps).
struct DictionaryInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}

/// Reads trace context from a dictionary (a job's stored `traceparent`).
struct DictionaryExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

/// The W3C `traceparent` (https://www.w3.org/TR/trace-context/) of the API request being served,
/// set by the tracing middleware when tracing is on, nil otherwise: a job queued while serving it
/// carries it (``NewPushJob/traceParent``, set by ``stamped(_:)``), so its delivery joins the
/// request's trace.
public enum TraceParent {
    @TaskLocal public static var current: String?

    /// The jobs, each carrying the request's `traceparent` (unchanged when there is none).
    static func stamped(_ jobs: [NewPushJob]) -> [NewPushJob] {
        guard let parent = current else { return jobs }
        return jobs.map { job in
            var j = job
            j.traceParent = parent
            return j
        }
    }
}
