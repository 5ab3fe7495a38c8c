import Hummingbird
import HTTPTypes
import IsleHTTPAPI
import IsleCore
import IsleStore
import IsleDelivery

/// The request context of Isle's API: Hummingbird's core storage plus who is calling (filled by
/// ``APIKeyMiddleware``) and, for a write sent with an `Idempotency-Key`, the record to commit with
/// the work (filled by ``IdempotencyMiddleware``).
struct IsleRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The authenticated API key's app and scope; nil when no key was sent.
    var caller: Caller?
    /// The pending idempotency record of this write (status and body are filled by the handler).
    var idempotency: IdempotencyRecord?

    /// The client's address (IP, without the port) as the connection shows it; nil if unknown.
    var remoteAddress: String?

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress?.ipAddress
    }

    /// The caller, who must hold a key of `scope`: 401 without a key, 403 with a key of another scope.
    /// Exactly `scope`, never a scope that seems to include it: no key stands in for another, so a
    /// console key (admin, server-admin or the read-only viewer) passes no API check, and a viewer
    /// never an admin one.
    func caller(_ scope: APIKeyScope) throws -> Caller {
        guard let caller else { throw APIError(.unauthorized, "unauthenticated", "send the API key as Authorization: Bearer isle_…") }
        guard caller.scope == scope else {
            throw APIError(.forbidden, "wrongScope", "this endpoint needs a \(scope.rawValue) key; this is a \(caller.scope.rawValue) key")
        }
        return caller
    }

    /// The idempotency record to commit with a write whose answer is known before it commits.
    /// `jobs`: the store adds the ids of the jobs it queues, so a replay is the whole first answer.
    func idempotencyRecord(_ status: HTTPResponse.Status, _ value: JSONValue, jobs: Bool = false) -> IdempotencyRecord? {
        guard var p = idempotency else { return nil }
        p.status = status.code
        p.body = value.jsonString
        p.jobsField = jobs ? "jobs" : nil
        return p
    }

    /// The idempotency record of a write whose answer is made from what it wrote, in its transaction.
    func idempotentAnswer<Record>(_ status: HTTPResponse.Status, _ view: @escaping @Sendable (Record) -> JSONValue) -> IdempotentAnswer<Record>? {
        guard let p = idempotency else { return nil }
        let code = status.code
        return IdempotentAnswer(p) { (code, view($0).jsonString) }
    }
}

/// Who is calling: the app and the key's scope.
struct Caller: Sendable, Hashable {
    var bundleID: String
    var scope: APIKeyScope
    var keyID: String
}
