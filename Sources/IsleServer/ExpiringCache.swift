import Foundation
import IsleDelivery
import IsleStore
import Synchronization

/// Values read from the store, kept for a short time: API keys and apps are read on every request
/// and every delivery, and an app's row is parsed (schemas) each time. A change (`isle app add`,
/// `isle key revoke`) is seen within `ttl`.
///
/// With `sharedRefresh`, when an entry expires one caller reads it again while the others keep the
/// value they had (for at most another `ttl`): at 256 deliveries in flight, every one of them
/// reading the app the moment its entry expired was 12 reads of `apps` per 100 fan-out deliveries
/// on PostgreSQL. Without it (API keys: a revoked key must stop within `ttl`) each caller that
/// finds the entry expired reads it.
final class ExpiringCache<Value: Sendable>: Sendable {
    private struct Entry {
        var value: Value
        var at: ContinuousClock.Instant
        var refreshing = false
    }
    private let entries = Mutex<[String: Entry]>([:])
    let ttl: Duration
    let capacity: Int
    let sharedRefresh: Bool
    init(ttl: Duration = .seconds(1), capacity: Int = 10_000, sharedRefresh: Bool = false) {
        self.ttl = ttl
        self.capacity = capacity
        self.sharedRefresh = sharedRefresh
    }
    func value(_ key: String, load: () async throws -> Value) async throws -> Value {
        let now = ContinuousClock.now
        let cached = entries.withLock { e -> Value? in
            guard var entry = e[key] else { return nil }
            if now - entry.at < ttl { return entry.value }
            // Expired: this caller reads it again; others meanwhile keep the old value, not past 2 × ttl.
            guard sharedRefresh else { return nil }
            if entry.refreshing, now - entry.at < ttl * 2 { return entry.value }
            entry.refreshing = true
            e[key] = entry
            return nil
        }
        if let cached { return cached }
        let value: Value
        do { value = try await load() } catch {
            entries.withLock { e in e[key]?.refreshing = false }
            throw error
        }
        entries.withLock { e in
            if e.count >= capacity { e.removeAll(keepingCapacity: true) }
            e[key] = Entry(value: value, at: now)
        }
        return value
    }
}

final class AppCache: Sendable {
    /// Read again every half second, by one caller: a change (`isle app add`) is seen within a second.
    private let cache = ExpiringCache<AppRecord?>(ttl: .milliseconds(500), sharedRefresh: true)
    func app(_ bundleID: String, store: any AppLookup) async throws -> AppRecord? {
        try await cache.value(bundleID) { try await store.app(bundleID) }
    }
}
