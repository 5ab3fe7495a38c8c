import Crypto
import Foundation
import HTTPTypes
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery
import IsleWire
import Logging

/// What the controllers share: the store, the engine (to wake it and reach APNs), the clock.
struct APIServices: Sendable {
    /// What the helpers below read (apps, activities, installations) and a lane's wake-up: each
    /// controller holds its own narrow view of the store besides.
    let lookups: any AppLookup & ActivityRepository & InstallationRepository & JobIntake
    let engine: DeliveryEngine
    /// Topics' broadcast channels: made on demand, closed when due.
    let topics: TopicAudiences
    /// Activities renewed past the system's 8 hours.
    let renewals: Renewals
    let clock: any WallClock
    let logger: Logger
    /// Where pushes go (APNs production, sandbox, or a custom server such as isle sim).
    var environmentName = "sandbox"
    /// The server's configuration (limits, quotas, cookies).
    var configuration = ServerConfiguration()
    /// Failed sign-ins and unknown API keys, per client address.
    var authFailures: KeyedRateLimiter
    /// The API keys, as the API and the console check them.
    var apiKeys: APIKeyDirectory
    /// What one client address may create in an hour (installations, activities).
    var newInstallations: CreationQuota
    var newActivities: CreationQuota

    /// Rung when this process writes events (``EventBell``).
    var events: EventBell { engine.events }

    /// The app, as the engine sees it (read at most once a second).
    func app(_ bundleID: String) async throws -> AppRecord {
        guard let app = try await engine.apps.app(bundleID, store: lookups) else { throw APIError.notFound("app \(bundleID)") }
        return app
    }

    /// The caller's own activity; another app's is not found.
    func ownActivity(_ caller: Caller, _ id: String) async throws -> ActivityRecord {
        guard let a = try await lookups.activity(id: id), a.bundleID == caller.bundleID else { throw APIError.notFound("activity \(id)") }
        return a
    }

    /// ``ownActivity(_:_:)`` as accepting a push needs it (no attributes, content or topics).
    func ownActivityForPush(_ caller: Caller, _ id: String) async throws -> ActivityRecord {
        guard let a = try await lookups.activityForPush(id: id), a.bundleID == caller.bundleID else { throw APIError.notFound("activity \(id)") }
        return a
    }

    /// The caller's own installation; another app's is not found.
    func ownInstallation(_ caller: Caller, _ id: String) async throws -> InstallationRecord {
        guard let i = try await lookups.installation(bundleID: caller.bundleID, id: id) else { throw APIError.notFound("installation \(id)") }
        return i
    }

    /// The priority-10 budget the activity's pushes spend, as the engine counts it (its
    /// installation's, or its own: ``ServerConfiguration/budgetScope``), in the last hour.
    func budget(of a: ActivityRecord, history: any DeliveryHistory) async throws -> API.Budget {
        let app = try await lookups.app(a.bundleID)
        let installation = try await a.installationID.asyncMap { try await lookups.installation(bundleID: a.bundleID, id: $0) }
        let frequent = (app?.frequentUpdatesDeclared ?? false) && (installation??.frequentPushesEnabled ?? false)
        let limit = frequent ? configuration.frequentHourlyHighPriorityBudget : configuration.hourlyHighPriorityBudget
        let since = clock.now.addingTimeInterval(-3600)
        if configuration.budgetScope == .installation, let inst = a.installationID {
            // One kept in hand, as the planner does (DeliveryPlanner.budgetUsed).
            return API.Budget(per: .installation, used: try await history.highPrioritySends(activityID: BudgetScope.installationKey(bundleID: a.bundleID, installationID: inst), since: since),
                              limit: limit - 1)
        }
        return API.Budget(per: .activity, used: try await history.highPrioritySends(activityID: a.id, since: since), limit: limit)
    }

    /// A lane's waiting head may go now (the token it waited for arrived).
    func wakeLane(_ activityID: String) async throws {
        try await lookups.wakeLane(activityID: activityID, now: clock.now)
        engine.wake()
    }
}

/// Installation secrets (docs/security.md): handed to the app once, at its installation's first
/// registration; every later device call for the installation and its activities presents it.
enum InstallationSecret {
    static let header = HTTPField.Name("Isle-Installation-Secret")!

    /// 32 random bytes, base64url.
    static func make() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return "isle_inst_" + Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// Whether a secret the app chose itself may become its installation's (at the first
    /// registration): at least 32 characters of printable ASCII, as hard to guess as one Isle makes.
    static func acceptable(_ secret: String) -> Bool {
        (32...200).contains(secret.utf8.count) && secret.utf8.allSatisfy { (0x21...0x7e).contains($0) }
    }

    static func hash(_ secret: String) -> String { Hex.encode(SHA256.hash(data: Array(secret.utf8))) }

    /// Compares two hashes without an early exit.
    static func same(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<x.count { difference |= x[i] ^ y[i] }
        return difference == 0
    }

    /// The device must present the installation's secret (when it has one).
    static func check(_ presented: String?, of installation: InstallationRecord) throws {
        guard let hash = installation.secretHash else { return }
        guard let presented, !presented.isEmpty else {
            throw APIError(.forbidden, "installationSecretRequired", "installation \(installation.id) is registered: present its secret in the Isle-Installation-Secret header", field: "Isle-Installation-Secret")
        }
        guard same(Self.hash(presented), hash) else {
            throw APIError(.forbidden, "wrongInstallationSecret", "the Isle-Installation-Secret header does not match installation \(installation.id)'s secret", field: "Isle-Installation-Secret")
        }
    }
}
