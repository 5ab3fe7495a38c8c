import Foundation
import IsleHTTPAPI
import IsleCore
import IsleStore
import IsleDelivery
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

    /// Reads `10/s` (burst: one second's worth), `10/s,burst=60`, `0.5/s,burst=20` or `off`; nil
    /// when `text` is none of these.
    public init?(parsing text: String) {
        let t = text.trimmingCharacters(in: .whitespaces).lowercased()
        if t == "off" {
            self = .off
            return
        }
        let parts = t.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        guard (1...2).contains(parts.count), parts[0].hasSuffix("/s"),
              let rate = Double(parts[0].dropLast(2)), rate.isFinite, rate > 0, rate <= 1_000_000 else { return nil }
        var burst = max(1, rate.rounded(.up))
        if parts.count == 2 {
            guard parts[1].hasPrefix("burst="), let b = Double(parts[1].dropFirst(6)), b.isFinite, b >= 1, b <= 10_000_000 else { return nil }
            burst = b
        }
        self.init(perSecond: rate, burst: burst)
    }

    /// `10/s,burst=60` or `off`: what ``init(parsing:)`` reads.
    public var text: String {
        guard perSecond > 0 else { return "off" }
        func n(_ v: Double) -> String { v == v.rounded() && abs(v) < 1e15 ? String(Int64(v)) : String(v) }
        return "\(n(perSecond))/s,burst=\(n(burst))"
    }
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

/// Token buckets by any key (an installation, a client address): 429s that protect the fleet from
/// one flooding client. Buckets that refilled completely are forgotten, so memory stays bounded by
/// the clients active in the last `burst / perSecond` seconds.
final class KeyedRateLimiter: Sendable {
    let limit: RateLimit
    let clock: any WallClock
    let what: String
    private let buckets = Mutex<(map: [String: TokenBucket], lastSweep: Date)>(([:], .distantPast))

    init(_ limit: RateLimit, what: String, clock: any WallClock) {
        self.limit = limit
        self.clock = clock
        self.what = what
    }

    /// Takes one token for `key`; nil when allowed, else the seconds until it would be.
    func take(_ key: String) -> TimeInterval? {
        guard limit.perSecond > 0 else { return nil }
        let now = clock.now
        return buckets.withLock { b -> TimeInterval? in
            if now.timeIntervalSince(b.lastSweep) > 60 {
                let full = limit.burst / limit.perSecond
                b.map = b.map.filter { now.timeIntervalSince($0.value.updated) < full }
                b.lastSweep = now
            }
            var bucket = b.map[key] ?? TokenBucket(tokens: limit.burst, updated: now)
            let wait = bucket.take(limit, now: now)
            b.map[key] = bucket
            return wait
        }
    }

    /// Whether `key` has no token left, without taking one.
    func isExhausted(_ key: String) -> Bool {
        guard limit.perSecond > 0 else { return false }
        let now = clock.now
        return buckets.withLock { b in
            guard var bucket = b.map[key] else { return false }
            let elapsed = max(0, now.timeIntervalSince(bucket.updated))
            bucket.tokens = min(limit.burst, bucket.tokens + elapsed * limit.perSecond)
            return bucket.tokens < 1
        }
    }

    /// Takes one token for `key` or throws 429 `rateLimited` with `Retry-After`.
    func check(_ key: String) throws {
        if let wait = take(key) { throw Self.tooMany(what, limit, wait) }
    }

    static func tooMany(_ what: String, _ limit: RateLimit, _ wait: TimeInterval) -> APIError {
        APIError(.tooManyRequests, "rateLimited",
                 "\(what) sent more than \(limit.perSecond < 1 ? String(format: "%.1f", limit.perSecond) : String(Int(saturating: limit.perSecond))) requests a second (burst \(Int(saturating: limit.burst))); retry after the Retry-After seconds",
                 retryAfter: min(86_400, max(1, Int(saturating: wait.rounded(.up)))))
    }
}

/// What one client address may create with the public device key in an hour — installations,
/// activities (docs/security.md, "Limits"): registering is free to anyone holding the app, so
/// without this one address could fill the disk. A token bucket of `perHour`, refilled evenly,
/// as full as `perHour` at once; 0 turns it off. 429 `quotaExceeded` with `Retry-After` past it.
final class CreationQuota: Sendable {
    let perHour: Int
    let what: String
    private let buckets: KeyedRateLimiter

    init(perHour: Int, what: String, clock: any WallClock) {
        self.perHour = perHour
        self.what = what
        buckets = KeyedRateLimiter(perHour > 0 ? RateLimit(perSecond: Double(perHour) / 3600, burst: Double(perHour)) : .off, what: what, clock: clock)
    }

    /// Counts one creation from `address`, or throws 429 when its hour's allowance is spent.
    func take(_ address: String) throws {
        guard let wait = buckets.take(address) else { return }
        throw APIError(.tooManyRequests, "quotaExceeded",
                       "this address created more than \(perHour) \(what) in an hour, the most this server accepts (isle serve --max-new-\(what)-per-address); retry after the Retry-After seconds",
                       retryAfter: min(86_400, max(1, Int(saturating: wait.rounded(.up)))))
    }
}
