public import Foundation
public import IsleAPNs
public import IsleCore
public import IsleStore
public import Logging
public import ServiceLifecycle
import Synchronization

/// The heart of the server: claims due jobs from the durable queue and delivers them, in order
/// per activity, with Isle's priority policy, retries and token hygiene. A `Service`.
public final class DeliveryEngine: Service {
    let store: any IsleStore
    let configuration: ServerConfiguration
    public let clients: APNsClients
    let clock: any WallClock
    let logger: Logger
    let worker: String
    let wakeups: AsyncStream<Void>
    let wakeupContinuation: AsyncStream<Void>.Continuation
    public let counters = EngineCounters()

    public init(store: any IsleStore, configuration: ServerConfiguration, clients: APNsClients, clock: any WallClock = SystemWallClock(), logger: Logger, worker: String = "worker-\(UUID().uuidString.prefix(8))") {
        self.store = store
        self.configuration = configuration
        self.clients = clients
        self.clock = clock
        self.logger = logger
        self.worker = worker
        (wakeups, wakeupContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Tell the engine new work is queued (the API calls this after committing).
    public func wake() { wakeupContinuation.yield(()) }

    public func run() async throws {
        let requeued = try await store.requeueExpiredClaims(now: .distantFuture)
        if requeued > 0 { logger.info("re-queued jobs that were in flight when the last process stopped", metadata: ["jobs": "\(requeued)"]) }
        let wakeups = self.wakeups
        await withDiscardingTaskGroup { group in
            // A ticker so scheduled pushes and retries come due without an API call.
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: self.configuration.pollInterval)
                    self.wake()
                }
            }
            await withTaskCancellationHandler {
                await withGracefulShutdownHandler {
                    await self.loop(wakeups)
                } onGracefulShutdown: {
                    self.wakeupContinuation.finish()
                }
            } onCancel: {
                self.wakeupContinuation.finish()
            }
            group.cancelAll()
        }
    }

    private func loop(_ wakeups: AsyncStream<Void>) async {
        let inFlight = InFlight()
        await withDiscardingTaskGroup { group in
            var iterator = wakeups.makeAsyncIterator()
            while true {
                let room = configuration.concurrency - inFlight.count
                var claimed: [ClaimedJob] = []
                if room > 0 {
                    do {
                        claimed = try await store.claim(limit: min(room, 256), now: clock.now, lease: configuration.lease, worker: worker)
                    } catch {
                        logger.error("claiming jobs failed", metadata: ["error": "\(error)"])
                    }
                }
                for job in claimed {
                    inFlight.add()
                    group.addTask {
                        await self.deliver(job)
                        inFlight.remove()
                        self.wake()
                    }
                }
                if claimed.count == min(room, 256), room > 0 { continue }
                guard await iterator.next() != nil else { break }
            }
        }
    }

    // MARK: One job

    func deliver(_ c: ClaimedJob) async {
        let job = c.job
        let now = clock.now
        do {
            guard let app = try await store.app(job.bundleID) else {
                _ = try await store.finish(c, state: .failed, error: "the app \(job.bundleID) is no longer registered", delivery: nil, activity: nil, highPriorityAt: nil)
                return
            }
            switch job.kind {
            case .update, .end:
                try await deliverToActivity(c, app: app, now: now)
            case .start:
                try await deliverStart(c, app: app, now: now)
            case .widgets:
                try await deliverWidgets(c, app: app, now: now)
            case .broadcast:
                try await deliverBroadcast(c, app: app, now: now)
            }
        } catch {
            logger.error("delivery bookkeeping failed; the job will be retried when its lease ends", metadata: ["job.id": "\(job.id)", "error": "\(error)"])
        }
    }

    func deliverToActivity(_ c: ClaimedJob, app: AppRecord, now: Date) async throws {
        guard var activity = c.activity else {
            _ = try await store.finish(c, state: .dropped, error: "the activity no longer exists", delivery: nil, activity: nil, highPriorityAt: nil)
            return
        }
        // The server's record follows the device's rules: nothing after the end or past 8 hours.
        if activity.state.acceptsPushes, now.timeIntervalSince(activity.startedAt) >= 8 * 3600 {
            activity.state = .ended
            activity.endedAt = activity.startedAt.addingTimeInterval(8 * 3600)
            activity.stateReason = "the system ends a Live Activity after 8 hours"
            _ = try await store.finish(c, state: .dropped, error: "the activity passed its 8-hour life", delivery: nil, activity: activity, highPriorityAt: nil)
            counters.dropped()
            return
        }
        guard activity.state.acceptsPushes else {
            _ = try await store.finish(c, state: .dropped, error: "the activity is \(activity.state.rawValue)", delivery: nil, activity: nil, highPriorityAt: nil)
            counters.dropped()
            return
        }
        guard let tokenHex = activity.updateToken, let token = try? DeviceToken(hex: tokenHex) else {
            // Push-started and no update token yet: wait for the device to register it.
            try await retryOrFail(c, error: "the activity has no update token yet", delivery: nil)
            return
        }
        let installation = try await activity.installationID.asyncMap { try await store.installation(id: $0) } ?? nil
        let (priority, downgraded) = try await choosePriority(c, app: app, installation: installation, now: now)
        var aps = c.job.aps.objectValue ?? [:]
        aps["timestamp"] = .int(c.timestamp)
        let payload: [UInt8] = JSONValue.object(["aps": .object(Self.ordered(aps))]).jsonBytes
        let push = APNsPush(deviceToken: token, bundleID: app.bundleID, pushType: .liveactivity, payload: payload, priority: priority,
                            apnsID: UUID(uuidString: c.apnsID), schema: app.schema(activity.attributesType))
        let outcome = await send(push, app: app)
        let delivery = DeliveryRecord(jobID: c.job.id, activityID: activity.id, apnsID: c.apnsID, apnsUniqueID: outcome.response?.apnsUniqueID,
                                      status: outcome.response?.status ?? 0, reason: outcome.reason, latencyMS: outcome.latencyMS, priority: priority.rawValue,
                                      downgraded: downgraded, at: now)
        switch outcome.verdict {
        case .sent:
            Self.apply(aps, kind: c.job.kind, to: &activity, at: now)
            _ = try await store.finish(c, state: .sent, error: nil, delivery: delivery, activity: activity, highPriorityAt: priority == .high ? now : nil)
            counters.sent(downgraded: downgraded)
        case .deadToken(let why):
            activity.state = .unreachable
            activity.stateReason = why
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: activity, highPriorityAt: nil)
            counters.failed()
        case .retry(let why):
            try await retryOrFail(c, error: why, delivery: delivery)
        case .fail(let why):
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.failed()
        }
    }

    func deliverStart(_ c: ClaimedJob, app: AppRecord, now: Date) async throws {
        guard let installationID = c.job.installationID, var installation = try await store.installation(id: installationID),
              let type = c.job.aps["attributes-type"]?.stringValue
        else {
            _ = try await store.finish(c, state: .dropped, error: "the installation no longer exists", delivery: nil, activity: nil, highPriorityAt: nil)
            return
        }
        guard let hex = installation.pushToStartTokens[type], let token = try? DeviceToken(hex: hex) else {
            _ = try await store.finish(c, state: .failed, error: "the installation has no push-to-start token for \(type)", delivery: nil, activity: nil, highPriorityAt: nil)
            return
        }
        var aps = c.job.aps.objectValue ?? [:]
        aps["timestamp"] = .int(c.timestamp)
        let payload = JSONValue.object(["aps": .object(Self.ordered(aps))]).jsonBytes
        let push = APNsPush(deviceToken: token, bundleID: app.bundleID, pushType: .liveactivity, payload: payload, priority: .high, apnsID: UUID(uuidString: c.apnsID), schema: app.schema(type))
        let outcome = await send(push, app: app)
        let delivery = DeliveryRecord(jobID: c.job.id, activityID: c.job.activityID, apnsID: c.apnsID, apnsUniqueID: outcome.response?.apnsUniqueID,
                                      status: outcome.response?.status ?? 0, reason: outcome.reason, latencyMS: outcome.latencyMS, priority: 10, downgraded: false, at: now)
        var activity = c.activity
        switch outcome.verdict {
        case .sent:
            _ = try await store.finish(c, state: .sent, error: nil, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.sent(downgraded: false)
        case .deadToken(let why):
            installation.pushToStartTokens[type] = nil
            try await store.upsertInstallation(installation)
            activity?.state = .unreachable
            activity?.stateReason = why
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: activity, highPriorityAt: nil)
            counters.failed()
        case .retry(let why):
            try await retryOrFail(c, error: why, delivery: delivery)
        case .fail(let why):
            activity?.state = .unreachable
            activity?.stateReason = why
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: activity, highPriorityAt: nil)
            counters.failed()
        }
    }

    func deliverWidgets(_ c: ClaimedJob, app: AppRecord, now: Date) async throws {
        guard let id = c.job.installationID, var installation = try await store.installation(id: id), let hex = installation.widgetToken, let token = try? DeviceToken(hex: hex) else {
            _ = try await store.finish(c, state: .failed, error: "the installation has no widget push token", delivery: nil, activity: nil, highPriorityAt: nil)
            return
        }
        let outcome = await send(.widgetsReload(token: token, bundleID: app.bundleID, apnsID: UUID(uuidString: c.apnsID)), app: app)
        let delivery = DeliveryRecord(jobID: c.job.id, activityID: nil, apnsID: c.apnsID, apnsUniqueID: outcome.response?.apnsUniqueID, status: outcome.response?.status ?? 0,
                                      reason: outcome.reason, latencyMS: outcome.latencyMS, priority: 10, downgraded: false, at: now)
        switch outcome.verdict {
        case .sent:
            _ = try await store.finish(c, state: .sent, error: nil, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.sent(downgraded: false)
        case .deadToken(let why):
            installation.widgetToken = nil
            try await store.upsertInstallation(installation)
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.failed()
        case .retry(let why):
            try await retryOrFail(c, error: why, delivery: delivery)
        case .fail(let why):
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.failed()
        }
    }

    func deliverBroadcast(_ c: ClaimedJob, app: AppRecord, now: Date) async throws {
        guard let id = c.job.channelID, let channel = try await store.channel(id: id) else {
            _ = try await store.finish(c, state: .dropped, error: "the channel no longer exists", delivery: nil, activity: nil, highPriorityAt: nil)
            return
        }
        var aps = c.job.aps.objectValue ?? [:]
        aps["timestamp"] = .int(c.timestamp)
        let priority: PushPriority = c.job.requestedPriority == 10 || (c.job.requestedPriority == nil && c.job.hasAlert) ? .high : .low
        let push = BroadcastPush(bundleID: app.bundleID, channelID: id, payload: JSONValue.object(["aps": .object(Self.ordered(aps))]).jsonBytes, priority: priority,
                                 expiration: .immediately, storagePolicy: MessageStoragePolicy(rawValue: channel.storagePolicy), requestID: UUID(uuidString: c.apnsID))
        let start = ContinuousClock.now
        var verdict: Verdict
        var response: APNsResponse?
        do {
            response = try await clients.client(for: app).broadcast(push)
            verdict = .sent
        } catch let error as APNsError {
            response = error.response
            switch error.remedy {
            case .retryLater, .newProviderToken, .openNewConnection: verdict = .retry(error.message)
            default: verdict = .fail(error.message)
            }
        } catch {
            verdict = .fail("\(error)")
        }
        let delivery = DeliveryRecord(jobID: c.job.id, activityID: nil, apnsID: c.apnsID, apnsUniqueID: response?.apnsUniqueID, status: response?.status ?? 0,
                                      reason: response?.reason?.rawValue, latencyMS: Self.ms(ContinuousClock.now - start), priority: priority.rawValue, downgraded: false, at: now)
        switch verdict {
        case .sent:
            _ = try await store.finish(c, state: .sent, error: nil, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.sent(downgraded: false)
        case .retry(let why):
            try await retryOrFail(c, error: why, delivery: delivery)
        case .fail(let why), .deadToken(let why):
            _ = try await store.finish(c, state: .failed, error: why, delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.failed()
        }
    }

    // MARK: Policy

    /// Low priority by default; high when asked or for an alert; over the hourly budget, high is
    /// downgraded to low and the delivery says so.
    func choosePriority(_ c: ClaimedJob, app: AppRecord, installation: InstallationRecord?, now: Date) async throws -> (PushPriority, Bool) {
        let wantsHigh = c.job.requestedPriority == 10 || (c.job.requestedPriority == nil && c.job.hasAlert)
        guard wantsHigh, let activityID = c.job.activityID else { return (.low, false) }
        let frequent = app.frequentUpdatesDeclared && (installation?.frequentPushesEnabled ?? false)
        let budget = frequent ? configuration.frequentHourlyHighPriorityBudget : configuration.hourlyHighPriorityBudget
        let used = try await store.highPrioritySends(activityID: activityID, since: now.addingTimeInterval(-3600))
        return used >= budget ? (.low, true) : (.high, false)
    }

    enum Verdict { case sent, deadToken(String), retry(String), fail(String) }
    struct SendOutcome {
        var verdict: Verdict
        var response: APNsResponse?
        var reason: String?
        var latencyMS: Double
    }

    func send(_ push: APNsPush, app: AppRecord) async -> SendOutcome {
        let client: APNsClient
        do { client = try clients.client(for: app) } catch {
            return SendOutcome(verdict: .fail("the app's APNs credentials are unusable: \(error)"), reason: nil, latencyMS: 0)
        }
        let start = ContinuousClock.now
        do {
            let r = try await client.send(push)
            return SendOutcome(verdict: .sent, response: r, reason: nil, latencyMS: Self.ms(ContinuousClock.now - start))
        } catch {
            let ms = Self.ms(ContinuousClock.now - start)
            let reason = error.response?.reason?.rawValue ?? error.transport.map { "transport: \($0.kind.rawValue)" }
            switch error.code {
            case .invalidRequest:
                return SendOutcome(verdict: .fail(error.message), response: nil, reason: "invalid", latencyMS: ms)
            case .transport:
                return SendOutcome(verdict: .retry(error.message), response: nil, reason: reason, latencyMS: ms)
            case .rejected:
                let why = error.response?.summary ?? error.message
                switch error.remedy {
                case .dropToken: return SendOutcome(verdict: .deadToken(why), response: error.response, reason: reason, latencyMS: ms)
                case .retryLater, .newProviderToken, .openNewConnection: return SendOutcome(verdict: .retry(why), response: error.response, reason: reason, latencyMS: ms)
                case .fixRequest, .fixConfiguration: return SendOutcome(verdict: .fail(why), response: error.response, reason: reason, latencyMS: ms)
                }
            }
        }
    }

    func retryOrFail(_ c: ClaimedJob, error: String, delivery: DeliveryRecord?) async throws {
        if c.job.attempts >= configuration.maximumAttempts {
            _ = try await store.finish(c, state: .failed, error: "gave up after \(c.job.attempts) attempts: \(error)", delivery: delivery, activity: nil, highPriorityAt: nil)
            counters.failed()
            return
        }
        let exponent = Double(max(0, c.job.attempts - 1))
        let base = min(configuration.retryMaximumDelay, configuration.retryBase * pow(2, exponent))
        let delay = base * Double.random(in: 0.5...1.0)
        _ = try await store.retry(c, runAt: clock.now.addingTimeInterval(delay), error: error, delivery: delivery)
        counters.retried()
    }

    /// What a successful push changed, in the server's record of the activity.
    static func apply(_ aps: JSONObject, kind: PushJobKind, to a: inout ActivityRecord, at now: Date) {
        if let state = aps["content-state"] { a.content = state }
        if let score = aps["relevance-score"]?.numberValue?.doubleValue { a.relevanceScore = score }
        a.staleDate = aps["stale-date"]?.numberValue?.int64Value.map { Date(timeIntervalSince1970: Double($0)) }
        if kind == .end {
            a.state = .ended
            a.endedAt = now
            if let d = aps["dismissal-date"]?.numberValue?.int64Value { a.dismissedAt = Date(timeIntervalSince1970: Double(min(d, Int64(now.timeIntervalSince1970) + 4 * 3600))) }
        }
    }

    /// `aps` keys in Isle's wire order.
    static func ordered(_ aps: JSONObject) -> JSONObject {
        let order = ["timestamp", "event", "content-state", "attributes-type", "attributes", "alert", "stale-date", "dismissal-date", "relevance-score", "input-push-token", "input-push-channel"]
        var out = JSONObject()
        for k in order { if let v = aps[k] { out[k] = v } }
        for (k, v) in aps where out[k] == nil { out[k] = v }
        return out
    }

    static func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }
}

/// One APNs client per app, made on first use and shared by every worker (one JWT per key).
public final class APNsClients: Sendable {
    let environment: APNsEnvironment
    let requestTimeout: Duration
    let clock: any WallClock
    let logger: Logger
    private let clients = Mutex<[String: (keyID: String, client: APNsClient)]>([:])
    /// Clients replaced after a key change, closed at shutdown.
    private let retired = Mutex<[APNsClient]>([])

    public init(environment: APNsEnvironment, requestTimeout: Duration = .seconds(30), clock: any WallClock = SystemWallClock(), logger: Logger) {
        self.environment = environment
        self.requestTimeout = requestTimeout
        self.clock = clock
        self.logger = logger
    }

    public func client(for app: AppRecord) throws -> APNsClient {
        var replaced: APNsClient?
        let client = try clients.withLock { c throws -> APNsClient in
            if let existing = c[app.bundleID], existing.keyID == app.keyID { return existing.client }
            // Made under the lock: two workers must not each make one and drop the other unclosed.
            let credentials = try APNsCredentials(keyID: app.keyID, teamID: app.teamID, pem: app.keyPEM)
            let client = try APNsClient(configuration: .init(environment: environment, credentials: credentials, requestTimeout: requestTimeout), clock: clock, logger: logger)
            replaced = c[app.bundleID]?.client
            c[app.bundleID] = (app.keyID, client)
            return client
        }
        if let replaced { retired.withLock { $0.append(replaced) } }
        return client
    }

    public func shutdown() async {
        let all = clients.withLock { c in defer { c.removeAll() }; return c.values.map(\.client) } + retired.withLock { r in defer { r.removeAll() }; return r }
        for c in all { try? await c.shutdown() }
    }
}

/// Delivery counters for /metrics.
public final class EngineCounters: Sendable {
    private let values = Mutex<[String: Int]>([:])
    func bump(_ k: String) { values.withLock { $0[k, default: 0] += 1 } }
    func sent(downgraded: Bool) {
        bump("sent")
        if downgraded { bump("downgraded") }
    }
    func failed() { bump("failed") }
    func retried() { bump("retried") }
    func dropped() { bump("dropped") }
    public var snapshot: [String: Int] { values.withLock { $0 } }
}

final class InFlight: Sendable {
    private let n = Mutex(0)
    func add() { n.withLock { $0 += 1 } }
    func remove() { n.withLock { $0 -= 1 } }
    var count: Int { n.withLock { $0 } }
}

extension Optional {
    func asyncMap<T>(_ f: (Wrapped) async throws -> T) async rethrows -> T? {
        switch self {
        case .some(let w): try await f(w)
        case .none: nil
        }
    }
}
