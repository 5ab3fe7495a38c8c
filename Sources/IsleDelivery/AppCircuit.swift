public import Foundation
public import IsleCore
import Synchronization

/// Per app: whether Isle sends for it now. A configuration error (a revoked key, the wrong
/// environment, a topic the key may not use) pauses the app instead of failing its pushes and
/// killing its tokens; APNs failing again and again (5xx, no connection) makes it back off rather
/// than hammer APNs. Either way the app's jobs wait in their lanes, and a probe after the pause
/// (doubling up to a cap) resumes the app on its first accepted push. Pure value type on an
/// injected time.
public struct AppCircuit: Sendable, Hashable {
    public enum Mode: Sendable, Hashable {
        case running
        /// APNs keeps failing: nothing is sent for the app until `until`.
        case backingOff(until: Date, reason: String)
        /// A configuration error: nothing is sent for the app until `until` (then one probe).
        case paused(until: Date, reason: String, since: Date)
    }

    public struct Settings: Sendable, Hashable {
        /// Consecutive 5xx / connection failures that open the circuit.
        public var unavailableThreshold = 5
        /// Distinct installations whose tokens were answered `BadDeviceToken` before any accepted
        /// push: the environment is wrong. Counted per installation, never per token, so one
        /// installation (say one copy of the app registering junk tokens with the public device
        /// key) cannot pause the app alone; a token with no installation is no evidence.
        public var suspectTokenThreshold = 5
        public var firstBackoff: TimeInterval = 1
        public var maximumBackoff: TimeInterval = 60
        public var firstPause: TimeInterval = 30
        public var maximumPause: TimeInterval = 600
        public init() {}
    }

    public enum Signal: Sendable, Hashable {
        /// APNs accepted a push to a token (or channel) of this environment.
        case accepted(PushEnvironment)
        case unavailable(String)
        /// APNs answered with a status below 500 that is not about the app's set-up (a 410, a
        /// 400, a 429): it is reachable, so a back-off for unavailability ends.
        case reachable
        case configuration(String)
        /// APNs answered `BadDeviceToken` for `token` of `installation` (nil: not known).
        case badDeviceToken(token: String, environment: PushEnvironment, installation: String?)
    }

    public enum Transition: Sendable, Hashable {
        case none
        case backingOff(until: Date, reason: String)
        case paused(until: Date, reason: String)
        case resumed
    }

    public private(set) var mode: Mode = .running
    /// The environments in which a push of this app was accepted since the process started: there
    /// the target is right, so `BadDeviceToken` means a bad token.
    public private(set) var confirmedEnvironments: Set<PushEnvironment> = []
    var consecutiveUnavailable = 0
    var suspects: [PushEnvironment: Set<String>] = [:]
    var backoffs = 0
    var pauses = 0
    public var settings: Settings

    public init(settings: Settings = Settings()) { self.settings = settings }

    /// A push of this app to `environment` was accepted since the process started.
    public func environmentConfirmed(_ environment: PushEnvironment) -> Bool { confirmedEnvironments.contains(environment) }

    /// Whether the app's jobs may be claimed at `now` (during a pause: once the probe time came).
    public func admits(_ now: Date) -> Bool {
        switch mode {
        case .running: true
        case .backingOff(let until, _), .paused(let until, _, _): now >= until
        }
    }

    /// When a job held back by the circuit should look again.
    public func resumesAt(_ now: Date) -> Date {
        switch mode {
        case .running: now
        case .backingOff(let until, _), .paused(let until, _, _): max(until, now)
        }
    }

    public mutating func record(_ signal: Signal, now: Date) -> Transition {
        switch signal {
        case .accepted(let environment):
            confirmedEnvironments.insert(environment)
            consecutiveUnavailable = 0
            suspects[environment] = nil
            backoffs = 0
            pauses = 0
            guard mode != .running else { return .none }
            mode = .running
            return .resumed
        case .unavailable(let why):
            consecutiveUnavailable += 1
            guard consecutiveUnavailable >= settings.unavailableThreshold else { return .none }
            if case .backingOff(let until, _) = mode, now < until { return .none }
            backoffs += 1
            // A failed probe opens again at once, for twice as long.
            consecutiveUnavailable = settings.unavailableThreshold - 1
            let until = now.addingTimeInterval(min(settings.maximumBackoff, settings.firstBackoff * pow(2, Double(min(backoffs - 1, 30)))))
            let reason = "APNs failed \(settings.unavailableThreshold) times in a row (last: \(why)); backing off"
            mode = .backingOff(until: until, reason: reason)
            return .backingOff(until: until, reason: reason)
        case .reachable:
            consecutiveUnavailable = 0
            backoffs = 0
            guard case .backingOff = mode else { return .none }
            mode = .running
            return .resumed
        case .configuration(let why):
            // `why` says what is wrong and what to do (APNsReason.pauseExplanation, or the transport's TLS failure).
            return pause(why, now: now)
        case .badDeviceToken(_, let environment, let installation):
            // Evidence of a wrong target only while no push of the app was accepted at all: once
            // another environment works, the app's credentials are right and pausing it would stop
            // that environment's pushes for the sake of this one's (whose jobs keep retrying).
            // Only tokens that were pushed to count (this is an APNs answer), and only one per
            // installation: one installation alone never pauses the app.
            guard confirmedEnvironments.isEmpty, let installation else { return .none }
            suspects[environment, default: []].insert(installation)
            let count = suspects[environment]?.count ?? 0
            guard count >= settings.suspectTokenThreshold else { return .none }
            return pause("BadDeviceToken for the tokens of \(count) different installations (\(environment.rawValue)) and no push accepted yet: the tokens are probably for the other APNs environment (check the environment the app reports, or --sandbox/--production for apps that do not say)", now: now)
        }
    }

    mutating func pause(_ reason: String, now: Date) -> Transition {
        if case .paused(let until, _, _) = mode, now < until { return .none }
        pauses += 1
        let since: Date = if case .paused(_, _, let s) = mode { s } else { now }
        let until = now.addingTimeInterval(min(settings.maximumPause, settings.firstPause * pow(2, Double(min(pauses - 1, 30)))))
        mode = .paused(until: until, reason: reason, since: since)
        return .paused(until: until, reason: reason)
    }

    /// An operator fixed the cause: probe now.
    public mutating func resume(now: Date) {
        switch mode {
        case .running: break
        case .backingOff(_, let r): mode = .backingOff(until: now, reason: r)
        case .paused(_, let r, let s): mode = .paused(until: now, reason: r, since: s)
        }
    }
}

/// An operator paused the app by hand (the console): nothing is sent for it, on any instance,
/// until an operator resumes it. Stored, so it holds across restarts and instances.
public struct OperatorPause: Sendable, Hashable {
    public var bundleID: String
    /// The admin key that paused it.
    public var keyID: String
    public var reason: String
    public var at: Date
    public init(bundleID: String, keyID: String, reason: String, at: Date) {
        self.bundleID = bundleID
        self.keyID = keyID
        self.reason = reason
        self.at = at
    }
}

/// The circuits of every app, shared by the engine's workers and read by the API.
public final class AppCircuits: Sendable {
    private let circuits = Mutex<[String: AppCircuit]>([:])
    private let pauses = Mutex<[String: OperatorPause]>([:])
    /// The operators' pauses as last read from the store (the engine reads them every second).
    public func setOperatorPauses(_ list: [OperatorPause]) { pauses.withLock { $0 = Dictionary(list.map { ($0.bundleID, $0) }, uniquingKeysWith: { a, _ in a }) } }
    public func operatorPause(_ bundleID: String) -> OperatorPause? { pauses.withLock { $0[bundleID] } }
    public var operatorPauses: [String: OperatorPause] { pauses.withLock { $0 } }
    let settings: AppCircuit.Settings

    public init(settings: AppCircuit.Settings = .init()) { self.settings = settings }

    public func record(_ bundleID: String, _ signal: AppCircuit.Signal, now: Date) -> AppCircuit.Transition {
        circuits.withLock { c in c[bundleID, default: AppCircuit(settings: settings)].record(signal, now: now) }
    }
    public func circuit(_ bundleID: String) -> AppCircuit { circuits.withLock { $0[bundleID] ?? AppCircuit(settings: settings) } }
    /// Apps whose jobs must not be claimed at `now`.
    public func held(at now: Date) -> Set<String> {
        circuits.withLock { c in Set(c.filter { !$0.value.admits(now) }.keys) }.union(pauses.withLock { Set($0.keys) })
    }
    public var all: [String: AppCircuit] { circuits.withLock { $0 } }
    public func resume(_ bundleID: String, now: Date) { circuits.withLock { $0[bundleID]?.resume(now: now) } }

    // MARK: Pushes being retried (nothing is retried silently: docs/server.md)

    private let retrying = Mutex<[String: [Int64: RetryingPush]]>([:])
    /// How long after its next try an entry stays without news (another instance sent the push, or
    /// it was cancelled): then it is no longer shown.
    static let retryingGrace: TimeInterval = 120

    /// APNs refused the push with an answer Isle retries; it is tried again at `retryAt`. Answers
    /// whether it is the push's first such answer in this process.
    @discardableResult
    public func noteRetrying(_ bundleID: String, jobID: Int64, kind: String, answer: String, reason: String, retryAt: Date, now: Date) -> Bool {
        retrying.withLock { r in
            let since = r[bundleID]?[jobID]?.since
            r[bundleID, default: [:]][jobID] = RetryingPush(jobID: jobID, kind: kind, since: since ?? now, lastAnswer: answer, reason: reason, retryAt: retryAt)
            return since == nil
        }
    }
    /// The push was sent, failed or dropped: no longer retried.
    public func noteDone(_ bundleID: String, jobID: Int64) {
        retrying.withLock { r in
            guard r[bundleID]?[jobID] != nil else { return }
            r[bundleID]![jobID] = nil
            if r[bundleID]!.isEmpty { r[bundleID] = nil }
        }
    }
    /// The app's pushes this process is retrying after an APNs refusal, oldest first.
    public func retrying(_ bundleID: String, now: Date) -> [RetryingPush] {
        retrying.withLock { r in
            r[bundleID]?.values.filter { now < $0.retryAt.addingTimeInterval(Self.retryingGrace) }.sorted { ($0.since, $0.jobID) < ($1.since, $1.jobID) } ?? []
        }
    }
    /// Apps with pushes being retried after an APNs refusal.
    public func appsRetrying(now: Date) -> Set<String> {
        retrying.withLock { r in Set(r.filter { $0.value.values.contains { now < $0.retryAt.addingTimeInterval(Self.retryingGrace) } }.keys) }
    }
}

/// A push APNs refused with an answer Isle retries: since when, its last answer, the next try.
public struct RetryingPush: Sendable, Hashable {
    public var jobID: Int64
    public var kind: String
    public var since: Date
    /// APNs' answer: status and reason ("400 BadDeviceToken").
    public var lastAnswer: String
    /// What Isle makes of it and what to do.
    public var reason: String
    public var retryAt: Date
}
