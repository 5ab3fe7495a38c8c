import Foundation
import IsleDelivery
import IsleStore
import Synchronization

/// Values read from the store, kept for a short time: API keys and apps are read on every request
/// and every delivery, and an app's row is parsed (schemas) each time. A change (`isle app add`,
/// `isle key revoke`) is seen within `ttl`.
final class ExpiringCache<Value: Sendable>: Sendable {
    private let entries = Mutex<[String: (value: Value, at: ContinuousClock.Instant)]>([:])
    let ttl: Duration
    let capacity: Int
    init(ttl: Duration = .seconds(1), capacity: Int = 10_000) {
        self.ttl = ttl
        self.capacity = capacity
    }
    func value(_ key: String, load: () async throws -> Value) async throws -> Value {
        let now = ContinuousClock.now
        if let e = entries.withLock({ $0[key] }), now - e.at < ttl { return e.value }
        let value = try await load()
        entries.withLock { e in
            if e.count >= capacity { e.removeAll(keepingCapacity: true) }
            e[key] = (value, now)
        }
        return value
    }
}

final class AppCache: Sendable {
    private let cache = ExpiringCache<AppRecord?>()
    func app(_ bundleID: String, store: any AppLookup) async throws -> AppRecord? {
        try await cache.value(bundleID) { try await store.app(bundleID) }
    }
}
