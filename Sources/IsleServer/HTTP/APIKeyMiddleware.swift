import Crypto
import Hummingbird
import HTTPTypes
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery

/// Authenticates `Authorization: Bearer isle_…` and puts the caller in the context; routes say
/// which scope they need (``IsleRequestContext/caller(_:)``). A key that is sent but unknown or
/// revoked is a 401 here, and counts against the client address's failure budget (past it: 429
/// before any look-up). Each key is rate-limited (429 with `Retry-After`); the device key — the
/// whole fleet's — first per client address and per installation, and only then against the
/// fleet's allowance: a request one address's own limit refuses takes nothing from the fleet, so
/// one flooding copy of the app cannot starve the genuine ones (docs/security.md, "Limits").
struct APIKeyMiddleware: RouterMiddleware {
    typealias Context = IsleRequestContext
    let keys: APIKeyDirectory
    let limiter: RateLimiter?
    var authFailures: KeyedRateLimiter?
    var perInstallation: KeyedRateLimiter?
    var perAddress: KeyedRateLimiter?

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization] else { return try await next(request, context) }
        guard header.count > 7, header.prefix(7).lowercased() == "bearer " else {
            throw APIError(.unauthorized, "unauthenticated", "send the API key as Authorization: Bearer isle_…")
        }
        let secret = String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        let address = context.remoteAddress ?? "unknown"
        let hash = APIKeys.hash(secret)
        guard let key = try await keys.current(hash: hash) else {
            // Wrong keys are throttled per address (a valid key from the same address is not).
            if let authFailures, let wait = authFailures.take(address) { throw KeyedRateLimiter.tooMany("this address sent unknown API keys: it", authFailures.limit, wait) }
            throw APIError(.unauthorized, "unauthenticated", "the API key is unknown or revoked")
        }
        if key.scope == .device {
            // The caller's own buckets first: what they refuse costs the fleet nothing.
            try perAddress?.check(key.id + " " + address)
            if let installation = Self.installation(of: request) { try perInstallation?.check(key.id + " " + installation) }
        }
        try limiter?.check(keyID: key.id, scope: key.scope)
        var context = context
        context.caller = Caller(bundleID: key.bundleID, scope: key.scope, keyID: key.id)
        AccessLogNote.current?.noteCaller(keyID: key.id, app: key.bundleID)
        return try await next(request, context)
    }
}

extension APIKeyMiddleware {
    /// Which installation a device request acts for, as its bucket's name: the path's
    /// (`/v1/installations/{id}…`) together with the secret the request presents, else the secret
    /// alone (activity calls); nil without either (limited per address only). The secret is part of
    /// the name, so requests without the installation's secret — anyone else's — fill a bucket of
    /// their own and never the installation's: the limit counts only what could pass the secret
    /// check the controller then makes (its hash is compared there, in constant time).
    static func installation(of request: Request) -> String? {
        let path = request.uri.path
        let secret = request.headers[InstallationSecret.header].flatMap { $0.isEmpty ? nil : $0 }
        let presented = secret.map { String(InstallationSecret.hash($0).prefix(32)) } ?? "-"
        if path.hasPrefix("/v1/installations/") {
            return "i:" + String(path.dropFirst("/v1/installations/".count).prefix { $0 != "/" }.prefix(Limits.id * 3)) + " " + presented
        }
        if secret != nil { return "s:" + presented }
        return nil
    }
}

/// The API keys as the server checks them, for the API and the console alike: the key with a
/// secret's hash, nil when unknown or revoked, read at most once a second per key — so a
/// revocation takes effect everywhere within a second.
final class APIKeyDirectory: Sendable {
    let store: any APIKeyRepository
    private let cache = ExpiringCache<APIKeyRecord?>()
    private let byID = ExpiringCache<APIKeyRecord?>()
    init(store: any APIKeyRepository) { self.store = store }

    func current(hash: String) async throws -> APIKeyRecord? {
        let key = try await cache.value(hash) { try await store.apiKey(secretHash: hash) }
        return key?.revokedAt == nil ? key : nil
    }

    /// Whether the key `id` of `bundleID` is still valid (read at most once a second): a request
    /// that outlives a revocation — a long poll — checks it again before it answers.
    func isCurrent(id: String, bundleID: String, fresh: Bool = false) async throws -> Bool {
        let load = { try await self.store.apiKeys(bundleID: bundleID).first { $0.id == id } }
        let key = fresh ? try await load() : try await byID.value(bundleID + "\n" + id, load: load)
        return key != nil && key?.revokedAt == nil
    }

    /// The key with this secret, as ``current(hash:)``.
    func current(secret: String) async throws -> APIKeyRecord? {
        guard !secret.isEmpty else { return nil }
        return try await current(hash: APIKeys.hash(secret))
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
