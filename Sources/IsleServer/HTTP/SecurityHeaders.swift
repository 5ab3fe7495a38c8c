import Hummingbird
import HTTPTypes

/// `Strict-Transport-Security` on every answer when the API serves HTTPS itself (`--tls-cert`):
/// a browser that reached the console once over HTTPS never again sends its admin cookie or an
/// API key over plain HTTP to this host, even when a link or a network attacker says `http://`.
/// One year, the value the HSTS preload list asks for; no `includeSubDomains`, because Isle speaks
/// only for its own host, not for sibling sites that may still need plain HTTP. Behind a proxy that
/// terminates TLS the proxy sets it: this is added only when ``ServerConfiguration/tls`` is set.
struct HSTSMiddleware: RouterMiddleware {
    typealias Context = IsleRequestContext

    static let value = "max-age=31536000"

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            var response = try await next(request, context)
            response.headers[.strictTransportSecurity] = Self.value
            return response
        } catch let error as any HTTPResponseError {
            // Errors too (401, 404, 429…): the header must be on whatever the browser sees first.
            var response = try error.response(from: request, context: context)
            response.headers[.strictTransportSecurity] = Self.value
            return response
        }
    }
}
