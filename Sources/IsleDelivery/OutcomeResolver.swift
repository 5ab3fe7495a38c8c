public import Foundation
public import IsleCore

/// Maps what APNs (or the network) answered to what happens to the job: sent; retried at a time
/// (backoff with jitter, capped, honouring `retry-after`, until the job can no longer matter); the
/// token is dead; the app's configuration is wrong (pause the app, keep the job); or failed for
/// good. Pure: the jitter comes from the caller's random source. (docs/protocol.md §3.4, §3.5)
public struct OutcomeResolver: Sendable {
    public var retryBase: TimeInterval
    public var retryMaximumDelay: TimeInterval
    /// How many `BadDeviceToken` answers a push takes, while no push of the app to that APNs
    /// environment has been accepted, before its token is taken for dead (docs/server.md, "When a
    /// push is retried, and when it fails"): with the default back-off, 4 to 9 minutes of tries —
    /// long enough for a wrong environment to show across installations (which pauses the app
    /// instead), far shorter than the job's deadline.
    public var suspectTokenAnswers: Int

    public init(retryBase: TimeInterval = 1, retryMaximumDelay: TimeInterval = 15 * 60, suspectTokenAnswers: Int = 10) {
        self.retryBase = retryBase
        self.retryMaximumDelay = retryMaximumDelay
        self.suspectTokenAnswers = suspectTokenAnswers
    }

    public enum Outcome: Sendable, Hashable {
        case accepted
        /// An HTTP answer other than 2xx, with APNs' reason (IsleCore's table, docs/protocol.md §3.4, §7.4).
        case rejected(status: Int, reason: APNsReason?, retryAfter: TimeInterval?)
        /// No answer: connect, TLS, timeout, connection lost. `configuration` when it cannot
        /// work until someone fixes something (a TLS trust failure).
        case unreachable(String, configuration: Bool)
        /// Isle itself refused to send it (the request would be rejected).
        case refused(String)
    }

    public enum Resolution: Sendable, Hashable {
        case sent
        case retry(at: Date, why: String)
        case deadToken(why: String)
        /// The app's credentials, topic or environment are wrong: every push of the app would fail
        /// the same way. Pause the app; the job keeps its place.
        case pauseApp(why: String)
        /// `BadDeviceToken` while no push of the app has been accepted yet: the token may be fine
        /// and the environment wrong. Retry later; the app's circuit counts these.
        case suspectToken(why: String, retryAt: Date)
        case fail(why: String)
    }

    /// The delay before attempt `attempt + 1`: `retryBase · 2^(attempt−1)`, capped, times a jitter
    /// in [0.5, 1).
    public func backoff(attempt: Int, random: inout some RandomNumberGenerator) -> TimeInterval {
        let exponent = Double(min(max(0, attempt - 1), 40))
        let base = min(retryMaximumDelay, retryBase * pow(2, exponent))
        return base * Double.random(in: 0.5..<1.0, using: &random)
    }

    /// `attempt` is how many times the job has been sent, this one included; `answers` how many
    /// of them APNs answered, this one included.
    public func resolve(_ outcome: Outcome, attempt: Int, answers: Int = 1, deadline: DeliveryPlanner.Deadline, now: Date, environmentConfirmed: Bool,
                        random: inout some RandomNumberGenerator) -> Resolution {
        func retry(_ why: String, after minimum: TimeInterval? = nil) -> Resolution {
            var delay = backoff(attempt: attempt, random: &random)
            if let minimum { delay = max(delay, minimum) }
            let at = now.addingTimeInterval(delay)
            guard at < deadline.at else { return .fail(why: "gave up: \(deadline.why) comes before the next try; last answer: \(why)") }
            return .retry(at: at, why: why)
        }
        switch outcome {
        case .accepted:
            return .sent
        case .refused(let why):
            return .fail(why: why)
        case .unreachable(let why, let configuration):
            return configuration ? .pauseApp(why: why) : retry(why)
        case .rejected(let status, let reason, let retryAfter):
            // What each reason means and what to do is IsleCore's table (APNsReason); unknown
            // reasons are judged by status there too.
            let why = reason.map { "\(status) \($0)" } ?? "\(status)"
            if let reason, reason.concernsEveryPush { return .pauseApp(why: reason.pauseExplanation(status: status)) }
            if reason == .badDeviceToken, !environmentConfirmed, answers >= suspectTokenAnswers {
                // Kept long enough: had the environment been wrong, other installations' tokens
                // would have paused the app by now. The token is stale.
                return .deadToken(why: "\(why) to all \(answers) tries, with no push of this app to this APNs environment accepted meanwhile: APNs does not know this token for the app here — a reinstalled or rebuilt app, a restarted simulator, or a token of the other environment. Have the app register its current token (IsleClient does at launch); if every installation's pushes fail so, the server's APNs environment is wrong (docs/server.md)")
            }
            if reason == .badDeviceToken, !environmentConfirmed {
                // The token may be fine and the environment wrong: the app's circuit counts these.
                let at = now.addingTimeInterval(backoff(attempt: attempt, random: &random))
                guard at < deadline.at else { return .fail(why: "gave up: \(deadline.why) comes before the next try; last answer: \(why)") }
                return .suspectToken(why: why, retryAt: at)
            }
            switch reason?.remedy(status: status) ?? APNsReason.remedy(forStatus: status) {
            case .dropToken: return .deadToken(why: why)
            case .retryLater, .newProviderToken, .openNewConnection: return retry(why, after: retryAfter)
            case .fixRequest, .fixConfiguration: return .fail(why: why)
            }
        }
    }
}

extension APNsReason {
    /// Why an app's pushes stop when APNs answers this to all of them (``APNsReason/concernsEveryPush``),
    /// in words a person can act on: what is wrong and what to do with Isle's server and CLI
    /// (docs/server.md, "When APNs refuses the app's set-up"). Here, not in IsleCore: IsleCore
    /// holds Apple's vocabulary; this names Isle's own commands and routes.
    func pauseExplanation(status: Int) -> String {
        let answer = "\(status) \(rawValue)"
        switch self {
        case .expiredProviderToken:
            return "APNs says the provider token is expired (\(answer)) although this server signed it minutes ago (and again when told): this machine's clock is probably behind by an hour or more. Correct the clock (NTP); pushes resume at the next probe, or at once with POST /v1/app/resume."
        case .invalidProviderToken:
            return "APNs refused the provider token (\(answer)): the key file is not the key with this key id, the key was revoked, the team id is wrong, or this machine's clock is ahead. Check the key under Certificates, Identifiers & Profiles › Keys, then run isle app add again with the right --key, --key-id and --team-id."
        case .badEnvironmentKeyIdInToken:
            return "APNs refused this key for this environment (\(answer)): the key is limited to the other APNs environment (sandbox or production). Give this environment a key of its own (isle app environment-key set --environment sandbox|production --key … --key-id … --team-id …), or use a key enabled for both (isle app add); pushes resume at the next probe, or at once with POST /v1/app/resume."
        case .missingProviderToken, .unrelatedKeyIdInToken:
            return "APNs refused the provider token (\(answer)): \(info?.meaning ?? rawValue). Check the app's key id and team id (isle app add)."
        case .badTopic, .topicDisallowed, .topicMismatch:
            return "APNs refused the topic derived from the app's bundle id (\(answer)): \(info?.meaning ?? rawValue). Check that the bundle id registered with isle app add is the app's, and that its key may push to it."
        default:
            return "APNs refused the app's set-up (\(answer)): \(info?.meaning ?? rawValue). \(Self.advice(remedy(status: status)))"
        }
    }
}
