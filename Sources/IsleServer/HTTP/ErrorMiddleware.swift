import Hummingbird
import HTTPTypes
import IsleHTTPAPI
import IsleStore
import Logging

/// Turns any error that is not an API error into the error envelope: the database going away is a
/// 503 with `Retry-After`, a documented path asked with the wrong method a 405 with `Allow`, and
/// anything unexpected a 500 without details (logged). Bad input never gets here as a 500 —
/// handlers answer it with 4xx.
struct ErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    let logger: Logger
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let e as APIError {
            throw e
        } catch let e as StoreError where e.code == .unavailable || e.code == .refused {
            logger.error("the database is unavailable", metadata: ["http.path": "\(request.uri.path)", "error": "\(e.message)"])
            throw APIError(.serviceUnavailable, "databaseUnavailable", "the database is unavailable right now; nothing was changed — retry shortly", retryAfter: 1)
        } catch let e as HTTPError {
            // No route: a documented path asked with a method it does not take is a 405 naming
            // the ones it does.
            if e.status == .notFound, let allowed = OpenAPIDocument.methods(forPath: request.uri.path), !allowed.isEmpty {
                throw APIError(.methodNotAllowed, "methodNotAllowed", "\(request.uri.path) takes \(allowed.joined(separator: ", ")), not \(request.method.rawValue)", allow: allowed.joined(separator: ", "))
            }
            throw APIError(e.status, e.status == .notFound ? "notFound" : "badRequest", e.body ?? "\(e.status.reasonPhrase)")
        } catch {
            logger.error("request failed", metadata: ["http.path": "\(request.uri.path)", "error": "\(error)"])
            throw APIError(.internalServerError, "internal", "the server could not complete the request")
        }
    }
}

/// Times every API write (POST, PUT, DELETE under /v1) for `isle_api_write_seconds{status}`:
/// labels are the status only, never an id or a path with ids in it.
struct APIMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: ServerMetrics
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.method != .get, request.method != .head, request.uri.path.hasPrefix("/v1/") else { return try await next(request, context) }
        let start = ContinuousClock.now
        do {
            let response = try await next(request, context)
            metrics.accepted(status: response.status.code, duration: ContinuousClock.now - start)
            return response
        } catch let error as any HTTPResponseError {
            metrics.accepted(status: error.status.code, duration: ContinuousClock.now - start)
            throw error
        }
    }
}
