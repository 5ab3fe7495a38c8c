import Foundation
import IsleHTTPAPI
import IsleCore
import IsleStore
import Synchronization

/// A rate: `perSecond` sustained, `burst` at once. `perSecond` 0 turns the limit off.
public struct RateLimit: Sendable, Hashable {
    public var perSecond: Double
    public var burst: Double
    public init(perSecond: Double, burst: Double) {
        self.perSecond = perSecond
        self.burst = burst
    }
    public static let off = RateLimit(perSecond: 0, burst: 0)
}

/// A token bucket: pure, on an injected time.
struct TokenBucket: Sendable, Hashable {
    var tokens: Double
    var updated: Date

    /// Takes one token at `now`; when none is left, the seconds until one is.
    mutating func take(_ limit: RateLimit, now: Date) -> TimeInterval? {
        let elapsed = max(0, now.timeIntervalSince(updated))
        tokens = min(limit.burst, tokens + elapsed * limit.perSecond)
        updated = now
        if tokens >= 1 {
            tokens -= 1
            return nil
        }
        return (1 - tokens) / limit.perSecond
    }
}

/// Per-API-key limits (the device key is public: one copy of the app must not starve the others,
/// nor the backend). Answers 429 with `Retry-After`.
final class RateLimiter: Sendable {
    let limits: [APIKeyScope: RateLimit]
    let clock: any WallClock
    private let buckets = Mutex<[String: TokenBucket]>([:])

    init(limits: [APIKeyScope: RateLimit], clock: any WallClock) {
        self.limits = limits
        self.clock = clock
    }

    func check(keyID: String, scope: APIKeyScope) throws {
        guard let limit = limits[scope], limit.perSecond > 0 else { return }
        let now = clock.now
        let wait = buckets.withLock { b -> TimeInterval? in
            var bucket = b[keyID] ?? TokenBucket(tokens: limit.burst, updated: now)
            let wait = bucket.take(limit, now: now)
            b[keyID] = bucket
            return wait
        }
        if let wait {
            throw APIError(.tooManyRequests, "rateLimited",
                           "this \(scope.rawValue) key sent more than \(Int(saturating: limit.perSecond)) requests a second (burst \(Int(saturating: limit.burst))); retry after the Retry-After seconds",
                           retryAfter: min(86_400, max(1, Int(saturating: wait.rounded(.up)))))
        }
    }
}
