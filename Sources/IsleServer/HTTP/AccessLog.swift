import Hummingbird
import HTTPTypes
import Logging
import Synchronization

/// One log line per request (docs/server.md, "Logs"): method, route template (never the path: it
/// holds orders' and users' keys), status, duration and, for a request with a valid API key, its
/// key id and app — never the key, a token or a body. At info with `--access-log`, at debug
/// without it; nothing is measured when neither level is logged. Inside the request's span when
/// tracing is on, so the line carries its trace id.
struct AccessLogMiddleware<Context: RequestContext>: RouterMiddleware {
    let logger: Logger
    let enabled: AccessLogSwitch

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let level: Logger.Level = enabled.on ? .info : .debug
        guard logger.logLevel <= level else { return try await next(request, context) }
        let note = AccessLogNote()
        let started = ContinuousClock.now
        do {
            let response = try await AccessLogNote.$current.withValue(note) { try await next(request, context) }
            write(level, request, route: context.endpointPath, status: Int(response.status.code), started: started, note: note)
            return response
        } catch {
            let status = (error as? any HTTPResponseError).map { Int($0.status.code) } ?? 500
            write(level, request, route: context.endpointPath, status: status, started: started, note: note)
            throw error
        }
    }

    func write(_ level: Logger.Level, _ request: Request, route: String?, status: Int, started: ContinuousClock.Instant, note: AccessLogNote) {
        let (seconds, attoseconds) = (ContinuousClock.now - started).components
        let milliseconds = Double(seconds) * 1000 + Double(attoseconds) / 1e15
        var metadata: Logger.Metadata = [
            "http.method": "\(request.method.rawValue)",
            "http.route": "\(route ?? "unmatched")",
            "http.status": "\(status)",
            "duration.ms": "\((milliseconds * 100).rounded() / 100)",
        ]
        if let (keyID, app) = note.caller {
            metadata["key.id"] = "\(keyID)"
            metadata["app"] = "\(app)"
        }
        logger.log(level: level, "request", metadata: metadata)
    }
}

/// What the API-key middleware learned of the caller, for the access log (a task-local box: the
/// key check runs inside the request, on a copy of its context).
final class AccessLogNote: Sendable {
    @TaskLocal static var current: AccessLogNote?
    private let value = Mutex<(keyID: String, app: String)?>(nil)
    var caller: (keyID: String, app: String)? { value.withLock { $0 } }
    func noteCaller(keyID: String, app: String) { value.withLock { $0 = (keyID, app) } }
}
