import HTTPTypes
public import Hummingbird
import IsleDelivery
public import Tracing

/// A server span per API request (docs/server.md, "Tracing"), a child of the caller's span when
/// the request carries a W3C `traceparent`. While the request is served, the span is the current
/// context (so the logs carry its trace id) and ``TraceParent/current`` holds its `traceparent`,
/// which every job the request queues keeps: the delivery's spans join this trace.
struct RequestTracingMiddleware<Context: RequestContext>: RouterMiddleware {
    let tracer: any Tracer

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var parent = ServiceContext.current ?? .topLevel
        tracer.extract(request.headers, into: &parent, using: HeaderExtractor())
        let method = request.method.rawValue
        let span = tracer.startSpan(method, context: parent, ofKind: .server)
        defer { span.end() }
        span.updateAttributes { a in
            a["http.request.method"] = method
            a["url.path"] = request.uri.path
        }
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

/// Reads W3C trace context headers (`traceparent`, `tracestate`) from a request.
struct HeaderExtractor: Extractor {
    func extract(key: String, from headers: HTTPFields) -> String? {
        HTTPField.Name(key).flatMap { headers[$0] }
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
