import Synchronization
public import Foundation
public import IsleAPNs
public import IsleCore
public import IsleStore
public import IsleDelivery
public import Tracing

/// How `isle serve` runs. Built in one place from flags > environment > file > defaults.
public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 8080
    /// The database: a SQLite file's path, or a `postgres://` URL (docs/server.md, "Scale out").
    public var database = "./isle.sqlite"
    /// The environment of tokens whose installation did not say (`--sandbox`, `--production`).
    public var defaultEnvironment: PushEnvironment = .sandbox
    /// Where each environment's pushes go: Apple's hosts, or any APNs-compatible server (such as
    /// isle sim) per environment.
    public var apnsTargets: [PushEnvironment: APNsEnvironment] = [.sandbox: .sandbox, .production: .production]
    /// Sends both environments' pushes to one APNs-compatible server (one `isle sim`).
    public mutating func sendBothEnvironments(to target: APNsEnvironment) {
        apnsTargets = [.sandbox: target, .production: target]
    }

    /// "sandbox (default) → sandbox; production → custom (https://…)".
    public var apnsDescription: String {
        PushEnvironment.allCases.map { e in "\(e.rawValue)\(e == defaultEnvironment ? " (default)" : "") → \(target(e).name)" }.joined(separator: "; ")
    }

    public func target(_ environment: PushEnvironment) -> APNsEnvironment {
        apnsTargets[environment] ?? (environment == .production ? .production : .sandbox)
    }
    /// Concurrent deliveries in flight.
    public var concurrency = 256
    /// How long a claimed job belongs to a worker before the sweep may hand it to another. Longer
    /// than the worst-case send: connect + JWT minting + the request timeout, with room to spare.
    public var lease: TimeInterval = 120
    /// How often the engine looks for claims whose lease ran out (and that it is not working on).
    public var sweepInterval: Duration = .seconds(15)
    /// How long finished jobs, deliveries and budget records are kept (pruned at each sweep);
    /// idempotency records live 24 hours.
    public var retention = Retention()
    /// Requests per API key (429 with Retry-After beyond them); `.off` turns a scope's limit off.
    public var rateLimits: [APIKeyScope: RateLimit] = [.backend: RateLimit(perSecond: 10_000, burst: 20_000), .device: RateLimit(perSecond: 1_000, burst: 2_000)]
    /// The device key is shared by the whole fleet, so it is also limited per installation and per
    /// client address: one flooding copy of the app cannot starve the genuine ones
    /// (docs/security.md). `.off` turns one off.
    public var deviceInstallationLimit = RateLimit(perSecond: 5, burst: 60)
    public var deviceAddressLimit = RateLimit(perSecond: 100, burst: 1_000)
    /// Failed sign-ins and unknown API keys per client address (429 beyond it).
    public var authFailureLimit = RateLimit(perSecond: 0.5, burst: 20)
    /// How much one installation and one user may hold (docs/security.md).
    public var quotas = Quotas()
    /// How long a connection may take to send its request head, its body, and how long it may
    /// stay open doing nothing.
    public var timeouts = HTTPTimeouts()
    /// The console's session cookie carries `Secure` (set when the API is served over TLS, or
    /// behind a proxy that terminates TLS).
    public var secureCookies = false
    /// Retries of transient failures (429, 5xx, no connection): exponential backoff from
    /// `retryBase`, capped at `retryMaximumDelay`, with jitter, until the job can no longer matter
    /// (the activity's 8-hour life, a plain update's stale date, or `jobDeadline`).
    public var retryBase: TimeInterval = 1
    public var retryMaximumDelay: TimeInterval = 15 * 60
    /// `BadDeviceToken` answers a push takes, before any push of its app to that APNs environment
    /// was accepted, before its token is taken for dead (``OutcomeResolver/suspectTokenAnswers``).
    public var suspectTokenAnswers = 10
    /// How long after it was accepted a push can still matter.
    public var jobDeadline: TimeInterval = 8 * 3600
    /// A topic's channel with no broadcast for this long and no live follower is closed, unless
    /// the topic says otherwise (docs/server.md, "Topics as audiences").
    public var topicIdle: TimeInterval = 24 * 3600
    /// How long before the system's 8-hour end a renewed activity's successor is started
    /// (docs/server.md, "Activities that outlive 8 hours").
    public var renewalLead: TimeInterval = 30 * 60
    /// Channels per app and APNs environment: Apple allows 10,000. At the limit the idlest topic
    /// channel with no live follower is closed to make room; with none, a new one is refused.
    public var channelLimit = 10_000
    /// When an app's configuration is wrong or APNs keeps failing: how the app pauses and backs off.
    public var circuit = AppCircuit.Settings()
    /// Seeds the retry jitter (nil: random). Tests and soak runs set it to replay a run.
    public var randomSeed: UInt64?
    /// Priority-10 pushes per hour (per installation, or per activity: ``budgetScope``) before Isle downgrades to 5 (the device's budget is
    /// not published; these are Isle's defaults), and with frequent updates on.
    public var hourlyHighPriorityBudget = 15
    public var frequentHourlyHighPriorityBudget = 120
    /// Whose budget a priority-10 push spends: the app's on one phone (all the installation's
    /// activities and channels together, as a phone may count it) or each activity's
    /// (docs/server.md, "The priority-10 budget").
    public var budgetScope: BudgetScope = .installation
    public var requestTimeout: Duration = .seconds(30)
    /// Opens the apps' sealed `.p8` keys (see ``MasterKey``).
    public var masterKey: MasterKey?
    /// TLS on the API (`--tls-cert`, `--tls-key`): nil serves plain HTTP (behind a proxy that
    /// terminates TLS).
    public var tls: TLSCredentials?
    /// A line at info for every request (method, route, status, duration, key id); at debug when
    /// off. Shared by reference: `isle serve` turns it on or off at SIGHUP.
    public var accessLog = AccessLogSwitch(false)
    /// The build, for `isle_build_info` (`isle serve` sets it from `isle --version`).
    public var build: (version: String, commit: String) = ("dev", "unknown")
    /// Follow an `isle sim --virtual-clock`'s clock (its control API) instead of the system's:
    /// for end-to-end tests only (``SimulatorClock``).
    public var clockURL: String?
    /// How often the certificate files are looked at for a renewal.
    public var tlsReloadInterval: Duration = .seconds(10)
    /// Reverse proxies whose `X-Forwarded-For` names the client (per-address limits, sign-in
    /// throttling); empty: the connection's own address always.
    public var trustedProxies: [AddressRange] = []
    /// How webhooks are sent (docs/events.md).
    public var webhooks = WebhookSettings()
    /// How often the per-minute delivery history is written (the console's charts).
    public var historyFlush: Duration = .seconds(5)
    /// The HTTP/2 client that carries pushes to APNs.
    public var apnsTransport: APNsTransportKind = .default
    /// Where spans go (docs/server.md, "Tracing"): a span per API request, per delivery attempt
    /// and per APNs request, linked in one trace. Nil (the default): no span is made at all.
    public var tracer: (any Tracer)?

    public init() {}
}

/// What one installation and one user may hold.
public struct Quotas: Sendable, Hashable {
    /// Live (starting or active) activities of one installation; iOS itself shows a handful per app.
    public var liveActivitiesPerInstallation = 20
    /// Installations the backend may bind to one user.
    public var installationsPerUser = 50
    /// New installations one client address may register in an hour (0: no limit). Enough for a
    /// carrier-grade NAT's share of a large app; junk registrations from one address stop here.
    public var newInstallationsPerAddressPerHour = 200
    /// New activities one client address may register in an hour (0: no limit).
    public var newActivitiesPerAddressPerHour = 1_000
    /// Open connections one client address may hold to the API at once (0: no limit): past it a
    /// new connection is closed at once, so one address cannot take every file descriptor.
    public var connectionsPerAddress = 256
    public init() {}
}

/// Connection timeouts of the HTTP API.
public struct HTTPTimeouts: Sendable, Hashable {
    /// From the first byte of a request to the end of its head.
    public var header: Duration = .seconds(10)
    /// From the end of the head to the end of the body.
    public var body: Duration = .seconds(30)
    /// A connection with no request in progress.
    public var idle: Duration = .seconds(60)
    public init() {}
}


/// Whether every request gets an access-log line at info (``ServerConfiguration/accessLog``).
public final class AccessLogSwitch: Sendable {
    private let value: Atomic<Bool>
    public init(_ on: Bool) { value = Atomic(on) }
    public var on: Bool {
        get { value.load(ordering: .relaxed) }
        set { value.store(newValue, ordering: .relaxed) }
    }
}
