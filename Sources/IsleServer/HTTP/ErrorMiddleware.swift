import Foundation
import Hummingbird
import HTTPTypes
import IsleHTTPAPI
import IsleStore
import IsleDelivery
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
            // A 404 names what was not found, often an id taken from the path: never echo more
            // than a bounded piece of what the client sent.
            guard e.status == .notFound || e.status == .methodNotAllowed else { throw e }
            var bounded = e
            bounded.message = PathEcho.clipping(request.uri.path, in: e.message)
            throw bounded
        } catch let e as StoreError where e.code == .unavailable || e.code == .refused {
            logger.log(level: e.alreadyLogged ? .debug : .error, "the database is unavailable", metadata: ["http.path": "\(request.uri.path)", "error": "\(e.message)"])
            throw APIError(.serviceUnavailable, "databaseUnavailable", "the database is unavailable right now; nothing was changed — retry shortly", retryAfter: 1)
        } catch let e as HTTPError {
            // No route: a documented path asked with a method it does not take is a 405 naming
            // the ones it does.
            if e.status == .notFound, let allowed = OpenAPIDocument.methods(forPath: request.uri.path), !allowed.isEmpty {
                throw APIError(.methodNotAllowed, "methodNotAllowed", "\(PathEcho.clipped(request.uri.path)) takes \(allowed.joined(separator: ", ")), not \(request.method.rawValue)", allow: allowed.joined(separator: ", "))
            }
            let message = e.body ?? "\(e.status.reasonPhrase)"
            throw APIError(e.status, e.status == .notFound ? "notFound" : "badRequest", e.status == .notFound ? PathEcho.clipping(request.uri.path, in: message) : message)
        } catch {
            logger.error("request failed", metadata: ["http.path": "\(request.uri.path)", "error": "\(error)"])
            throw APIError(.internalServerError, "internal", "the server could not complete the request")
        }
    }
}

/// What error bodies repeat of the request's path: a bounded piece of it. A 5,000-character path
/// is not sent back whole (a reflection and amplification aid).
enum PathEcho {
    /// The most characters of the path, or of one of its segments, an error body repeats.
    static let limit = 100

    /// `text` cut to ``limit`` characters, with "…" when it was cut.
    static func clipped(_ text: String) -> String {
        text.count <= limit ? text : String(text.prefix(limit)) + "…"
    }

    /// `message` with every long piece of `path` it repeats — the whole path, a segment as sent or
    /// percent-decoded (as handlers read ids) — cut to ``limit`` characters.
    static func clipping(_ path: String, in message: String) -> String {
        guard message.count > limit else { return message }
        var pieces: Set<String> = [path]
        for segment in path.split(separator: "/").map(String.init) {
            pieces.insert(segment)
            if let decoded = segment.removingPercentEncoding { pieces.insert(decoded) }
        }
        var out = message
        // Longest first: the whole path before the segments it contains.
        for piece in pieces.filter({ $0.count > limit }).sorted(by: { $0.count > $1.count }) {
            out = out.replacingOccurrences(of: piece, with: clipped(piece))
        }
        return out
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

extension Logger.Level {
    /// `self` for a failed store call, or debug when the store has said its cause already
    /// (PostgreSQL away: one line when it goes, one when it is back — not one per retry).
    static func forStoreFailure(_ level: Logger.Level, _ error: any Error) -> Logger.Level {
        (error as? StoreError)?.alreadyLogged == true ? .debug : level
    }
}
