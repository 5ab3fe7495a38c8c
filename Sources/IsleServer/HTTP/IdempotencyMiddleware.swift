import Crypto
import Foundation
import Hummingbird
import HTTPTypes
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery
import NIOCore

/// Runs a write at most once per `Idempotency-Key` (docs/server.md, "Idempotency"):
///
/// - a repeat within 24 hours gets the first answer, byte for byte, with `Idempotent-Replay: true`;
/// - the same key with another request (method, path or body) is a 409 `idempotencyKeyReused`;
/// - a repeat while the first is still being processed is a 409 `idempotencyKeyInUse`.
///
/// The middleware only prepares the record (in the context); the handler commits it in the same
/// transaction as its work, so work and answer are stored together or not at all. Keys live per
/// app and per key scope: a device cannot take a key the backend will use.
struct IdempotencyMiddleware: RouterMiddleware {
    typealias Context = IsleRequestContext
    static let header = HTTPField.Name("Idempotency-Key")!
    static let replayHeader = HTTPField.Name("Idempotent-Replay")!
    let store: any IdempotencyRepository
    let clock: any WallClock
    /// The largest body a write takes (as the handlers do).
    let bodyLimit: Int

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard [.post, .put, .patch, .delete].contains(request.method), let key = request.headers[Self.header], let caller = context.caller else {
            return try await next(request, context)
        }
        guard !key.isEmpty, key.utf8.count <= 255, key.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw APIError.invalid("Idempotency-Key", "Idempotency-Key must be 1 to 255 printable ASCII characters, without spaces")
        }
        var request = request
        let body: ByteBuffer
        do { body = try await request.collectBody(upTo: bodyLimit) } catch {
            throw APIError(.contentTooLarge, "bodyTooLarge", "the request body is over \(bodyLimit >> 20) MiB")
        }
        let hash = Hex.encode(SHA256.hash(data: Array("\(request.method.rawValue) \(request.uri.path)\n".utf8) + Array(buffer: body)))
        let scopedKey = "\(caller.scope.rawValue):\(key)"
        if let answer = try await replay(bundleID: caller.bundleID, key: scopedKey, hash: hash) { return answer }
        var context = context
        context.idempotency = IdempotencyRecord(key: scopedKey, bundleID: caller.bundleID, requestHash: hash, status: 0, body: "", createdAt: clock.now)
        do {
            return try await next(request, context)
        } catch let error as StoreError where error.code == .idempotencyKeyTaken {
            // A concurrent request with the same key committed first: its answer is this one's.
            if let answer = try await replay(bundleID: caller.bundleID, key: scopedKey, hash: hash) { return answer }
            throw APIError(.conflict, "idempotencyKeyInUse", "a request with this Idempotency-Key is being processed; retry it shortly", field: "Idempotency-Key")
        } catch let error as APIError {
            // Refused — possibly because a concurrent request with this key already did the work
            // (the activity it registered now holds the key): then the answer is that request's.
            if let answer = try await replay(bundleID: caller.bundleID, key: scopedKey, hash: hash) { return answer }
            throw error
        }
    }

    func replay(bundleID: String, key: String, hash: String) async throws -> Response? {
        guard let done = try await store.idempotencyRecord(bundleID: bundleID, key: key), !done.isExpired(now: clock.now) else { return nil }
        guard done.requestHash == hash else {
            throw APIError(.conflict, "idempotencyKeyReused", "this Idempotency-Key was used for a different request in the last 24 hours", field: "Idempotency-Key")
        }
        var headers: HTTPFields = [.contentType: "application/json", Self.replayHeader: "true"]
        if done.body.isEmpty { headers[.contentType] = nil }
        return Response(status: .init(code: done.status), headers: headers, body: .init(byteBuffer: ByteBuffer(string: done.body)))
    }
}
