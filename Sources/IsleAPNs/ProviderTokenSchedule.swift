public import Foundation
public import IsleCore
import Synchronization

/// When to mint a new provider token (docs/protocol.md, Wire; docs/protocol.md §1.3):
/// one token per (team, key) for the whole process, minted on first use, refreshed after
/// 50 minutes, never replaced sooner than 20 minutes (APNs answers 429
/// `TooManyProviderTokenUpdates` to a connection that sees tokens change faster).
///
/// A pure state machine: tell it the time, it says what to do.
public struct ProviderTokenSchedule: Sendable, Hashable {
    public static let defaultRefreshInterval: TimeInterval = 50 * 60
    public static let minimumInterval: TimeInterval = 20 * 60

    public enum Action: Sendable, Hashable {
        /// Keep using the token issued at this time.
        case useCurrent
        /// Mint a new token now.
        case mint
    }

    public let refreshInterval: TimeInterval
    public private(set) var issuedAt: Date?
    /// APNs rejected the current token as expired; replace it once the 20-minute floor allows.
    public private(set) var rejectedAsExpired = false

    public init(refreshInterval: TimeInterval = Self.defaultRefreshInterval) {
        precondition(refreshInterval >= Self.minimumInterval && refreshInterval < 3600, "the refresh interval must be between 20 and 60 minutes")
        self.refreshInterval = refreshInterval
    }

    public func action(now: Date) -> Action {
        guard let issuedAt else { return .mint }
        let age = now.timeIntervalSince(issuedAt)
        if age >= refreshInterval { return .mint }
        if rejectedAsExpired, age >= Self.minimumInterval { return .mint }
        return .useCurrent
    }

    public mutating func didMint(issuedAt: Date) {
        self.issuedAt = issuedAt
        rejectedAsExpired = false
    }

    /// APNs answered 403 `ExpiredProviderToken` to the token issued at `tokenIssuedAt`.
    /// Returns true when a retry can use a different token (a newer one exists, or one may be
    /// minted now); false when the 20-minute floor forbids replacing it yet.
    public mutating func didReject(tokenIssuedAt: Date, now: Date) -> Bool {
        guard let issuedAt, issuedAt == tokenIssuedAt else { return true }
        rejectedAsExpired = true
        return action(now: now) == .mint
    }
}

/// Hands out the shared provider token for one set of credentials, minting per the schedule.
/// Thread-safe; share one instance across all connections and workers.
public final class ProviderTokenProvider: Sendable {
    private struct State {
        var schedule: ProviderTokenSchedule
        var current: ProviderToken?
        var minted = 0
    }

    public let credentials: APNsCredentials
    private let clock: any WallClock
    private let state: Mutex<State>

    public init(credentials: APNsCredentials, clock: any WallClock = SystemWallClock(), refreshInterval: TimeInterval = ProviderTokenSchedule.defaultRefreshInterval) {
        self.credentials = credentials
        self.clock = clock
        state = Mutex(State(schedule: ProviderTokenSchedule(refreshInterval: refreshInterval)))
    }

    /// The token to put in `authorization: bearer …` now.
    public func currentToken() -> ProviderToken {
        let now = clock.now
        return state.withLock { s in
            if s.schedule.action(now: now) == .mint || s.current == nil {
                let token = credentials.makeProviderToken(issuedAt: now)
                s.schedule.didMint(issuedAt: token.issuedAt)
                s.current = token
                s.minted += 1
            }
            return s.current!
        }
    }

    /// Report a 403 `ExpiredProviderToken`. True when retrying with ``currentToken()`` will use
    /// a different token.
    public func reportExpired(_ token: ProviderToken) -> Bool {
        let now = clock.now
        return state.withLock { $0.schedule.didReject(tokenIssuedAt: token.issuedAt, now: now) }
    }

    /// How many tokens have been minted (for metrics and tests).
    public var mintedCount: Int { state.withLock { $0.minted } }
}
