import Crypto
import Hummingbird
import HTTPTypes
import IsleCore
import IsleHTTPAPI
import IsleStore

/// Authenticates `Authorization: Bearer isle_…` and puts the caller in the context; routes say
/// which scope they need (``IsleRequestContext/caller(_:)``). A key that is sent but unknown or
/// revoked is a 401 here; each key is rate-limited (429 with `Retry-After`).
struct APIKeyMiddleware: RouterMiddleware {
    typealias Context = IsleRequestContext
    let store: any IsleStore
    let limiter: RateLimiter?
    /// Read at most once a second per key: a revocation takes effect within a second.
    let keys = ExpiringCache<APIKeyRecord?>()

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization] else { return try await next(request, context) }
        guard header.count > 7, header.prefix(7).lowercased() == "bearer " else {
            throw APIError(.unauthorized, "unauthenticated", "send the API key as Authorization: Bearer isle_…")
        }
        let secret = String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        let hash = APIKeys.hash(secret)
        guard let key = try await keys.value(hash, load: { try await store.apiKey(secretHash: hash) }), key.revokedAt == nil else {
            throw APIError(.unauthorized, "unauthenticated", "the API key is unknown or revoked")
        }
        try limiter?.check(keyID: key.id, scope: key.scope)
        var context = context
        context.caller = Caller(bundleID: key.bundleID, scope: key.scope, keyID: key.id)
        return try await next(request, context)
    }
}

enum APIKeys {
    /// A new secret: `isle_<scope>_<40 hex>`; only its hash is stored.
    static func newSecret(scope: APIKeyScope) -> String {
        "isle_\(scope.rawValue)_" + Hex.encode((0..<20).map { _ in UInt8.random(in: 0...255) })
    }

    static func hash(_ secret: String) -> String {
        Hex.encode(SHA256.hash(data: Array(secret.utf8)))
    }
}
