import AsyncHTTPClient
import Foundation
import IsleCore
import NIOCore

/// One answer of a real `isle serve` under a fault, with when it was asked and answered.
struct TimedAnswer: Sendable {
    var started: ContinuousClock.Instant
    var ended: ContinuousClock.Instant
    var status: Int
    var retryAfter: String?
    /// The jobs a 202 named.
    var jobs: [Int64]
    var took: Duration { ended - started }
}

/// The requests the real-process fault tests send (PostgreSQL away, a full disk).
enum ProcessTraffic {
    /// A backend's `POST /v1/activities/{id}/update`.
    static func update(_ client: HTTPClient, port: Int, activity: String, key: String, body: JSONValue, idempotencyKey: String? = nil) async throws -> TimedAnswer {
        var r = HTTPClientRequest(url: "http://127.0.0.1:\(port)/v1/activities/\(activity)/update")
        r.method = .POST
        r.headers.add(name: "authorization", value: "Bearer \(key)")
        r.headers.add(name: "content-type", value: "application/json")
        if let idempotencyKey { r.headers.add(name: "idempotency-key", value: idempotencyKey) }
        r.body = .bytes(ByteBuffer(bytes: body.jsonBytes))
        let started = ContinuousClock.now
        let response = try await client.execute(r, timeout: .seconds(60))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        let json = (try? JSONParser.parse(Array(buffer: bytes))) ?? .null
        let jobs = json["jobs"]?.arrayValue?.compactMap { $0.numberValue?.int64Value } ?? []
        return TimedAnswer(started: started, ended: .now, status: Int(response.status.code), retryAfter: response.headers.first(name: "retry-after"), jobs: jobs)
    }

    /// `GET /ready`.
    static func ready(_ client: HTTPClient, port: Int) async throws -> TimedAnswer {
        let started = ContinuousClock.now
        let response = try await client.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port)/ready"), timeout: .seconds(60))
        _ = try await response.body.collect(upTo: 1 << 16)
        return TimedAnswer(started: started, ended: .now, status: Int(response.status.code), retryAfter: response.headers.first(name: "retry-after"), jobs: [])
    }
}
