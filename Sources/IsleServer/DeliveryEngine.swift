public import Foundation
import IsleAPNs
public import IsleCore
public import IsleStore
public import IsleDelivery
public import Logging
public import ServiceLifecycle
import Synchronization
import Tracing

/// The heart of the server, a short loop: claim → plan → send → resolve → complete.
///
/// The store hands out lane heads (one job per activity and per channel in flight, in order);
/// ``DeliveryPlanner`` decides what to send; ``OutcomeResolver`` maps the answer to the job's fate;
/// ``AppCircuits`` pauses an app whose configuration is wrong and backs off when APNs is down; the
/// completion is a guarded patch committed with the job's new state. A `Service`.
public final class DeliveryEngine: Service {
    /// What the engine reads and writes: the queue's delivery side, the app and channel of a push,
    /// operators' pauses, retention, and the per-minute history.
    public typealias Store = JobDelivery & AppLookup & ChannelLookup & OperatorPauseReading & Pruning & HistoryRepository
    let store: any Store
    let configuration: ServerConfiguration
    public let clients: APNsClients
    public let circuits: AppCircuits
    let planner: DeliveryPlanner
    /// Priority-10 sends decided and not yet in a claim's count (pushes of one phone claimed together).
    let reservations = PriorityReservations()
    let resolver: OutcomeResolver
    let clock: any WallClock
    let logger: Logger
    let worker: String
    let wakeups: AsyncStream<Void>
    let wakeupContinuation: AsyncStream<Void>.Continuation
    public let counters: EngineCounters
    /// Rung after every completion this process writes (it may have written events).
    public let events = EventBell()
    let pausesRead = Mutex<ContinuousClock.Instant?>(nil)
    /// Per-minute counters for the console's history.
    public let history: HistoryRecorder
    let inFlight = InFlight()
    /// Results waiting to be written together.
    let completions: Batcher<JobCompletion, Bool?>
    /// The engine's task was cancelled: results still unwritten are given up.
    let cancelled = Mutex(false)
    let random: Mutex<SeededRandom>
    let apps = AppCache()

    public init(store: any Store, configuration: ServerConfiguration, clients: APNsClients, clock: any WallClock = SystemWallClock(), logger: Logger, worker: String = "worker-\(UUID().uuidString.prefix(8))") {
        self.store = store
        self.configuration = configuration
        self.clients = clients
        self.clock = clock
        self.logger = logger
        self.worker = worker
        counters = EngineCounters(metrics: ServerMetrics(version: configuration.build.version, commit: configuration.build.commit,
                                                         budget: (configuration.budgetScope, configuration.hourlyHighPriorityBudget, configuration.frequentHourlyHighPriorityBudget)))
        history = HistoryRecorder(store: store, flushEvery: configuration.historyFlush, logger: logger)
        circuits = AppCircuits(settings: configuration.circuit)
        var planner = DeliveryPlanner(hourlyHighPriorityBudget: configuration.hourlyHighPriorityBudget, frequentHourlyHighPriorityBudget: configuration.frequentHourlyHighPriorityBudget,
                                  jobDeadline: configuration.jobDeadline)
        planner.budgetScope = configuration.budgetScope
        self.planner = planner
        resolver = OutcomeResolver(retryBase: configuration.retryBase, retryMaximumDelay: configuration.retryMaximumDelay, suspectTokenAnswers: configuration.suspectTokenAnswers)
        random = Mutex(SeededRandom(seed: configuration.randomSeed ?? UInt64.random(in: 0...UInt64.max)))
        (wakeups, wakeupContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        // A result waits up to 2 ms for others while more sends are in flight; at once when every
        // job in flight has its result waiting.
        let inFlight = self.inFlight
        completions = Batcher(maximumBatch: max(1, min(256, configuration.concurrency)), linger: .milliseconds(2), ready: { waiting in waiting >= inFlight.count })
    }

    /// Tell the engine new work is queued (the API calls this after committing).
    public func wake() { wakeupContinuation.yield(()) }

    /// Wake times of work that comes due later (a retry, a scheduled push, a budget wait, an app's
    /// pause ending), rounded up to 50 ms: one timer per distinct time, so the engine sleeps until
    /// the next thing is due instead of polling for it.
    let timers = Mutex<Set<Int64>>([])
    static let timerResolution: Double = 0.05
    static let maximumTimers = 10_000

    /// Tell the engine work comes due at `due` (at once when that is not in the future).
    public func wake(at due: Date) {
        let now = clock.now
        guard due > now else { return wake() }
        let slot = Int64((due.timeIntervalSince1970 / Self.timerResolution).rounded(.up))
        let isNew = timers.withLock { pending in
            // Past the cap, the next due time is asked of the store again whenever the engine
            // is about to wait (``scheduleNextDue``).
            guard pending.count < Self.maximumTimers else { return false }
            return pending.insert(slot).inserted
        }
        guard isNew else { return }
        let at = Date(timeIntervalSince1970: Double(slot) * Self.timerResolution)
        let clock = self.clock
        Task { [weak self] in
            // On the injected clock: a test's clock wakes it when moved past `at`.
            try? await clock.sleep(until: at)
            guard let self else { return }
            _ = self.timers.withLock { $0.remove(slot) }
            self.wake()
        }
    }

    /// About to wait: a timer for the earliest work the store holds that is not claimable yet (a
    /// retry, a scheduled push, a budget or token wait), so nothing waits for a poll — work
    /// another process queued, or whose timer died with its process, included.
    func scheduleNextDue(held: Set<String>) async {
        let now = clock.now
        do {
            guard let due = try await store.nextDue(after: now, excludingApps: held) else { return }
            if due > now { return wake(at: due) }
            // Due already but not claimed (its lane busy in another process): look again in a
            // moment of real time — not on the injected clock, which a test may never move again.
            Task { [weak self] in
                try? await Task.sleep(for: .milliseconds(50))
                self?.wake()
            }
        } catch {
            // The database is away: the claim that fails next says so and backs off.
            wake(at: now.addingTimeInterval(1))
        }
    }

    /// After a completion: when its job comes due again.
    func wakeWhenDue(_ completion: JobCompletion) {
        switch completion.result {
        // A wait for a token that arrived meanwhile is due at once (the store decided): look now.
        case .retry(let at, _): wake(at: completion.dueNowIfTokenArrived ? clock.now : at)
        case .deadToken(_, _, let graceUntil): wake(at: graceUntil)
        default: break
        }
    }

    public func run() async throws {
        // Claims no running process can finish (SQLite: all of them, one process serves the file;
        // PostgreSQL: those whose lease ran out) go back to their lanes.
        let requeued = try await store.requeueClaimsAtStart(now: clock.now)
        if requeued > 0 { logger.info("re-queued jobs that were in flight when the last process stopped", metadata: ["jobs": "\(requeued)"]) }
        let wakeups = self.wakeups
        await withDiscardingTaskGroup { group in
            // Work queued by another process sharing the store (PostgreSQL's NOTIFY) wakes this engine at once.
            group.addTask { await self.store.listenForWork { self.wake() } }
            // Work comes due by the timers of ``wake(at:)`` and ``scheduleNextDue(held:)``; no
            // poll. The sweep (every `sweepInterval`) is maintenance: it takes back claims whose
            // lease ran out and prunes what is past its retention, and wakes the engine only when
            // it took claims back.
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: self.configuration.sweepInterval)
                    if Task.isCancelled { break }
                    await self.sweep()
                }
            }
            await withTaskCancellationHandler {
                await withGracefulShutdownHandler {
                    await self.loop(wakeups)
                } onGracefulShutdown: {
                    self.logger.notice("stopping: no new claims; the sends in flight finish and are recorded", metadata: ["in.flight": "\(self.inFlight.count)"])
                    self.wakeupContinuation.finish()
                }
            } onCancel: {
                self.cancelled.withLock { $0 = true }
                self.wakeupContinuation.finish()
            }
            group.cancelAll()
        }
    }

    /// Claims whose lease ran out and that no task of this process is working on go back to
    /// their lanes (a worker lost them: its bookkeeping failed, or its process died).
    func sweep() async {
        do {
            let n = try await store.requeueExpiredClaims(now: clock.now, keeping: inFlight.ids)
            if n > 0 {
                logger.warning("took back claims whose lease ran out", metadata: ["jobs": "\(n)"])
                wake()
            }
        } catch {
            logger.log(level: .forStoreFailure(.error, error), "the lease sweep failed; it runs again shortly", metadata: ["error": "\(error)"])
        }
        do {
            let pruned = try await store.prune(now: clock.now, retention: configuration.retention, limit: 5_000)
            if pruned > 0 { logger.debug("pruned finished work past its retention", metadata: ["rows": "\(pruned)"]) }
        } catch {
            logger.log(level: .forStoreFailure(.error, error), "pruning failed; it runs again at the next sweep", metadata: ["error": "\(error)"])
        }
    }

    private func loop(_ wakeups: AsyncStream<Void>) async {
        await withDiscardingTaskGroup { group in
            var iterator = wakeups.makeAsyncIterator()
            // While the database is away, claims pause with a growing delay (one log line when it
            // starts failing, one when it is back), then resume by themselves.
            var failing: Duration?
            while true {
                let busy = inFlight.count
                let room = configuration.concurrency - busy
                var claimed: [ClaimedJob] = []
                let batch = min(room, 256)
                // Claim in batches: once half the slots are free (or nothing is in flight), not on
                // every completion — each claim is a transaction of a fixed number of statements.
                let worthIt = busy == 0 || room >= max(1, configuration.concurrency / 2)
                if batch > 0, worthIt {
                    await refreshOperatorPauses()
                    let now = clock.now
                    do {
                        let mark = reservations.mark()
                        claimed = try await store.claim(limit: batch, now: now, lease: configuration.lease, worker: worker, excludingApps: circuits.held(at: now))
                        for i in claimed.indices { claimed[i].budgetReadMark = mark }
                        if failing != nil {
                            logger.notice("claiming jobs works again; deliveries resume")
                            failing = nil
                        }
                    } catch {
                        if Task.isCancelled { break }
                        if failing == nil { logger.log(level: .forStoreFailure(.error, error), "claiming jobs failed; deliveries pause until the database answers", metadata: ["error": "\(error)"]) }
                        let pause = min((failing ?? .milliseconds(50)) * 2, .seconds(1))
                        failing = pause
                        try? await Task.sleep(for: pause)
                    }
                }
                for job in claimed {
                    inFlight.add(job.job.id)
                    group.addTask {
                        await self.process(job)
                        self.inFlight.remove(job.job.id)
                        self.wake()
                    }
                }
                if claimed.count == batch, batch > 0, worthIt { continue }
                // About to wait: an app held by its circuit comes back when its pause ends; the
                // rest of the store's work when it comes due.
                let now = clock.now
                let held = circuits.held(at: now)
                for app in held where circuits.operatorPause(app) == nil { wake(at: circuits.circuit(app).resumesAt(now)) }
                // An app an operator paused comes back when one resumes it, maybe on another
                // instance: look again every second while any is paused.
                if !circuits.operatorPauses.isEmpty { wake(at: now.addingTimeInterval(1)) }
                // Only once nothing is in flight: each completion wakes the loop again anyway, and
                // under load this keeps the look-up off the hot path.
                if failing == nil, inFlight.count == 0 { await scheduleNextDue(held: held) }
                guard await iterator.next() != nil else { break }
            }
        }
    }

    // MARK: One job

    func process(_ c: ClaimedJob) async {
        guard let tracer = configuration.tracer else {
            await attempt(c)
            return
        }
        // A consumer span per attempt, in the trace of the request that queued the job
        // (docs/server.md, "Tracing"); the APNs request's span is its child.
        var parent = ServiceContext.topLevel
        if let traceParent = c.job.traceParent { tracer.extract(["traceparent": traceParent], into: &parent, using: DictionaryExtractor()) }
        await tracer.withSpan("deliver \(c.job.kind.rawValue)", context: parent, ofKind: .consumer) { span in
            span.updateAttributes { a in
                a["isle.app"] = c.job.bundleID
                a["isle.job.id"] = Int(c.job.id)
                a["isle.job.attempt"] = c.job.attempts
                a["isle.activity.id"] = c.job.activityID
                a["isle.channel.id"] = c.job.channelID
            }
            let completion = await attempt(c)
            span.updateAttributes { a in
                switch completion.result {
                case .finished(let state, let reason):
                    a["isle.job.result"] = state.rawValue
                    a["isle.job.reason"] = reason
                case .retry(let at, let reason):
                    a["isle.job.result"] = "retry"
                    a["isle.job.reason"] = reason
                    a["isle.job.retry_at"] = at.timeIntervalSince1970
                case .deadToken(_, let reason, _):
                    a["isle.job.result"] = "token retired"
                    a["isle.job.reason"] = reason
                }
            }
        }
    }

    /// One attempt at a claimed job, its result committed.
    @discardableResult
    func attempt(_ c: ClaimedJob) async -> JobCompletion {
        var completion: JobCompletion
        do {
            completion = try await handle(c)
        } catch {
            if Task.isCancelled || error is CancellationError {
                // Stopping: the job goes back due now, untouched.
                completion = JobCompletion(claim: c, result: .retry(at: clock.now, reason: "the server stopped before the send"))
            } else {
                // A read failed (the database is busy or gone): the job keeps its place and its lane.
                logger.warning("could not prepare a delivery; it will be tried again", metadata: ["job.id": "\(c.job.id)", "error": "\(error)"])
                completion = JobCompletion(claim: c, result: .retry(at: clock.now.addingTimeInterval(1), reason: "the server could not read what it needed: \(error)"))
            }
        }
        completion.at = clock.now
        await commit(completion)
        reservations.written(job: c.job.id, sentAtTen: completion.highPriorityAt != nil)
        wakeWhenDue(completion)
        return completion
    }

    /// The operators' pauses, read from the store at most four times a second (every instance
    /// sees a pause or a resume within a second; docs/server.md).
    func refreshOperatorPauses() async {
        let due = pausesRead.withLock { last -> Bool in
            let now = ContinuousClock.now
            guard last.map({ now - $0 >= .milliseconds(250) }) ?? true else { return false }
            last = now
            return true
        }
        guard due else { return }
        do { circuits.setOperatorPauses(try await store.operatorPauses()) } catch {
            logger.log(level: .forStoreFailure(.warning, error), "reading the operators' pauses failed; keeping the last known", metadata: ["error": "\(error)"])
        }
    }

    /// Bookkeeping is retried in process until it is written: a failed write never leaves a job
    /// claimed (the sweep would send it again), and never loses what APNs answered. Results are
    /// written in batches (``completions``): one transaction for many.
    func commit(_ completion: JobCompletion) async {
        let written = try? await completions.submit(completion) { batch in
            let results = await self.write(batch)
            return batch.indices.map { .success(results?[$0]) }
        }
        guard let written else { return }
        if !written {
            logger.warning("a claim was lost before its result was written (lease ran out)", metadata: ["job.id": "\(completion.claim.job.id)"])
        } else {
            history.record(completion, now: clock.now)
        }
    }

    /// Writes a batch of results, retrying until it lands (nil: the engine stopped first).
    func write(_ batch: [JobCompletion]) async -> [Bool]? {
        var delay: Duration = .milliseconds(20)
        while true {
            do {
                let written = try await store.complete(batch)
                if written.contains(true) { events.ring() }
                return written
            } catch {
                // Cancelled (not a graceful stop, which lets the work in flight finish): the
                // results are lost to this process; the sweep of a running one sends those jobs again.
                if Task.isCancelled || cancelled.withLock({ $0 }) { return nil }
                logger.log(level: .forStoreFailure(.error, error), "writing delivery results failed; retrying", metadata: ["jobs": "\(batch.map(\.claim.job.id))", "error": "\(error)"])
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
    }

    func handle(_ c: ClaimedJob) async throws -> JobCompletion {
        let job = c.job
        let now = clock.now
        guard let app = try await apps.app(job.bundleID, store: store) else {
            counters.failed(app: job.bundleID)
            return JobCompletion(claim: c, result: .finished(.failed, reason: "the app \(job.bundleID) is no longer registered"))
        }
        // The installation and the hour's priority-10 sends were read with the claim (ClaimReads).
        var context = DeliveryPlanner.Context(job: c, app: app, activity: c.activity, installation: c.installation, highPriorityUsed: c.highPrioritySends,
                                              installationHighPriorityUsed: c.installationHighPrioritySends, now: now)
        if job.kind == .broadcast, let id = job.channelID { context.channel = try await store.channel(id: id) }

        // The installation's budget: what this engine decided that the claim's count cannot hold is
        // added, and a priority-10 send is recorded before the next decision (PriorityReservations).
        let budgetKey = planner.budgetScope == .installation && c.installationHighPrioritySends != nil
            ? (c.activity?.installationID ?? job.installationID).map { BudgetScope.installationKey(bundleID: job.bundleID, installationID: $0) } : nil
        let plan = reservations.decide(key: budgetKey, job: job.id, mark: c.budgetReadMark, { uncounted in
            if uncounted > 0 { context.installationHighPriorityUsed = (context.installationHighPriorityUsed ?? 0) + uncounted }
            return planner.plan(context)
        }, sendsAtTen: { plan in
            if case .send(let push, _) = plan { return push.priority == .high }
            return false
        })
        switch plan {
        case .drop(let why, let patch):
            circuits.noteDone(job.bundleID, jobID: job.id)
            counters.dropped(app: job.bundleID)
            return JobCompletion(claim: c, result: .finished(.dropped, reason: why), activity: patch)
        case .fail(let why):
            circuits.noteDone(job.bundleID, jobID: job.id)
            counters.failed(app: job.bundleID)
            return JobCompletion(claim: c, result: .finished(.failed, reason: why), activity: job.kind == .start ? ActivityPatch(unreachable: .init(reason: why, ifToken: nil)) : nil)
        case .wait(let until, let why):
            if why.hasPrefix(DeliveryPlanner.unconfirmedStartReason), job.lastError?.hasPrefix(DeliveryPlanner.unconfirmedStartReason) != true {
                logger.warning("A push waits for a push-started activity the phone has not confirmed: \(why)", metadata: [
                    "app": "\(app.bundleID)", "job.id": "\(job.id)", "activity.id": "\(job.activityID ?? "")", "installation.id": "\(c.activity?.installationID ?? "")",
                ])
            }
            var waiting = JobCompletion(claim: c, result: .retry(at: until, reason: why))
            // Waiting for the activity's token: one handed over while this was planned makes it due now.
            waiting.dueNowIfTokenArrived = c.activity?.updateToken == nil && job.activityID != nil
            return waiting
        case .send(let push, let deadline):
            let circuit = circuits.circuit(app.bundleID)
            guard circuit.admits(clock.now) else {
                return JobCompletion(claim: c, result: .retry(at: circuit.resumesAt(clock.now), reason: Self.heldReason(circuit)))
            }
            let (outcome, response, latency) = await send(push, c: c, app: app)
            counters.metrics.apnsResponse(status: response?.status ?? 0, reason: response?.reason?.rawValue, milliseconds: latency, app: app.bundleID)
            let sentAt = clock.now
            if Task.isCancelled {
                // The server is stopping under the send: no answer from APNs, nothing to learn. The
                // job goes back due now (same timestamp and apns-id: the device drops a duplicate).
                return JobCompletion(claim: c, result: .retry(at: now, reason: "the server stopped during the send"))
            }
            let resolution = random.withLock { r in
                resolver.resolve(outcome, attempt: job.attempts, answers: job.apnsRequests + (response == nil ? 0 : 1), deadline: deadline, now: sentAt, environmentConfirmed: circuit.environmentConfirmed(push.environment ?? clients.defaultEnvironment), random: &r)
            }
            var delivery = DeliveryRecord(jobID: job.id, activityID: job.activityID, apnsID: c.apnsID, apnsUniqueID: response?.apnsUniqueID, status: response?.status ?? 0,
                                          reason: Self.reason(outcome), latencyMS: latency, priority: push.priority, downgraded: push.downgraded, at: now)
            delivery.deviceNote = response?.deviceNote
            let events = observe(app, outcome: outcome, resolution: resolution, push: push, installation: job.installationID ?? c.activity?.installationID, now: sentAt)
            var done = completion(c, push: push, resolution: resolution, delivery: delivery, now: sentAt)
            done.events = events
            noteRetry(c, app: app, outcome: outcome, result: done.result, now: sentAt)
            return done
        }
    }

    /// Nothing is retried silently: the first answer of APNs that Isle retries is a warning (and
    /// the `push.retrying` event the completion writes); while retried the push shows in `GET
    /// /v1/app`, `/ready` and the console; once done it leaves them.
    func noteRetry(_ c: ClaimedJob, app: AppRecord, outcome: OutcomeResolver.Outcome, result: JobCompletion.Result, now: Date) {
        let job = c.job
        guard case .rejected(let status, let reason, _) = outcome, status != 410 || reason != .unregistered, case .retry(let at, let why) = result else {
            circuits.noteDone(app.bundleID, jobID: job.id)
            return
        }
        let answer = "\(status) \(reason?.rawValue ?? "")".trimmingCharacters(in: .whitespaces)
        let first = circuits.noteRetrying(app.bundleID, jobID: job.id, kind: job.kind.rawValue, answer: answer, reason: why, retryAt: at, now: now)
        let metadata: Logger.Metadata = ["app": "\(app.bundleID)", "job.id": "\(job.id)", "kind": "\(job.kind.rawValue)", "apns.answer": "\(answer)", "retry.at": "\(at)",
                                         "activity.id": "\(job.activityID ?? "")", "installation.id": "\(job.installationID ?? c.activity?.installationID ?? "")"]
        if first && job.apnsRequests == 0 {
            logger.warning("APNs refused a push; retrying it: \(why)", metadata: metadata)
        } else {
            logger.info("APNs refused a push again; retrying it", metadata: metadata)
        }
    }

    /// Feeds the app's circuit and logs its transitions; a pause or a resume is an event for the
    /// backend, written with the completion of the push that caused it.
    func observe(_ app: AppRecord, outcome: OutcomeResolver.Outcome, resolution: OutcomeResolver.Resolution, push: DeliveryPlanner.Push, installation: String?, now: Date) -> [NewEvent] {
        let bundleID = app.bundleID
        let environment = push.environment ?? clients.defaultEnvironment
        // APNs' reason, for the event (the backend may act on it without parsing the sentence).
        var apnsReason: String?
        if case .rejected(_, let reason, _) = outcome { apnsReason = reason?.rawValue }
        let signal: AppCircuit.Signal? = switch resolution {
        case .sent: .accepted(environment)
        case .pauseApp(let why):
            // Which credentials and which APNs: what the person fixing it needs to look at.
            if case .rejected = outcome {
                .configuration("\(why) (key \(app.signingKey(for: environment).keyID)\(app.signingKey(for: environment).environment == nil ? "" : ", \(environment.rawValue)'s own"), team \(app.signingKey(for: environment).teamID), \(environment.rawValue) APNs)")
            }
            else { .configuration("\(why) (\(environment.rawValue) APNs)") }
        case .suspectToken:
            if case .liveActivity(let t) = push.target { .badDeviceToken(token: t.hex, environment: push.environment ?? clients.defaultEnvironment, installation: installation) }
            else if case .widgets(let t) = push.target { .badDeviceToken(token: t.hex, environment: push.environment ?? clients.defaultEnvironment, installation: installation) }
            else if case .controls(let t) = push.target { .badDeviceToken(token: t.hex, environment: push.environment ?? clients.defaultEnvironment, installation: installation) } else { nil }
        case .retry, .deadToken, .fail:
            switch outcome {
            case .unreachable(let why, _): .unavailable(why)
            case .rejected(let status, let reason, _) where status >= 500: .unavailable("\(status) \(reason?.rawValue ?? "")")
            // Any other answer shows APNs is reachable (a 410 after 503s ends the back-off).
            case .rejected: .reachable
            default: nil
            }
        }
        guard let signal else { return [] }
        // The backend hears of a pause once, not at every probe that fails again.
        let wasRunning = circuits.circuit(bundleID).mode == .running
        switch circuits.record(bundleID, signal, now: now) {
        case .none: return []
        case .paused(let until, let reason):
            logger.warning("app paused: its pushes wait until the cause is fixed", metadata: ["app": "\(bundleID)", "reason": "\(reason)", "apns.reason": "\(apnsReason ?? "none")", "probe.at": "\(until)"])
            guard wasRunning else { return [] }
            counters.metrics.appPaused(cause: "configuration")
            var data: JSONObject = ["cause": "configuration", "reason": .string(reason), "probeAt": .int(Int64(until.timeIntervalSince1970))]
            if let apnsReason { data["apnsReason"] = .string(apnsReason) }
            return [NewEvent(bundleID: bundleID, type: .appPaused, data: data, at: now)]
        case .backingOff(let until, let reason):
            logger.warning("backing off from APNs for this app", metadata: ["app": "\(bundleID)", "reason": "\(reason)", "until": "\(until)"])
            guard wasRunning else { return [] }
            counters.metrics.appPaused(cause: "apnsUnavailable")
            return [NewEvent(bundleID: bundleID, type: .appPaused, data: ["cause": "apnsUnavailable", "reason": .string(reason), "probeAt": .int(Int64(until.timeIntervalSince1970))], at: now)]
        case .resumed:
            logger.notice("app resumed: APNs accepted a push again", metadata: ["app": "\(bundleID)"])
            return [NewEvent(bundleID: bundleID, type: .appResumed, data: ["source": .string("apns")], at: now)]
        }
    }

    func completion(_ c: ClaimedJob, push: DeliveryPlanner.Push, resolution: OutcomeResolver.Resolution, delivery: DeliveryRecord, now: Date) -> JobCompletion {
        let job = c.job
        switch resolution {
        case .sent:
            counters.sent(downgraded: push.downgraded, app: job.bundleID)
            counters.metrics.timeInQueue(now.timeIntervalSince(job.createdAt))
            return JobCompletion(claim: c, result: .finished(.sent, reason: nil), delivery: delivery, activity: push.patch, highPriorityAt: push.priority == .high && (job.activityID != nil || job.kind == .broadcast) ? now : nil)
        case .retry(let at, let why):
            counters.retried(app: job.bundleID)
            return JobCompletion(claim: c, result: .retry(at: at, reason: why), delivery: delivery)
        case .suspectToken(let why, let at):
            counters.retried(app: job.bundleID)
            return JobCompletion(claim: c, result: .retry(at: at, reason: "\(why) (kept: no push of this app to this APNs environment was accepted yet, so the environment may be wrong)"), delivery: delivery)
        case .pauseApp(let why):
            let circuit = circuits.circuit(job.bundleID)
            return JobCompletion(claim: c, result: .retry(at: circuit.resumesAt(now), reason: "app paused: \(why)"), delivery: delivery)
        case .deadToken(let why):
            counters.failed(app: job.bundleID)
            switch (job.kind, push.target) {
            case (.start, .liveActivity(let token)):
                let type = job.payload.liveActivity?.attributesType ?? ""
                return JobCompletion(claim: c, result: .finished(.failed, reason: why), delivery: delivery, activity: ActivityPatch(unreachable: .init(reason: why, ifToken: nil)),
                                     installation: job.installationID.map { InstallationPatch(bundleID: job.bundleID, installationID: $0, deadPushToStartToken: (type, token.hex)) })
            case (.widgets, .widgets(let token)):
                return JobCompletion(claim: c, result: .finished(.failed, reason: why), delivery: delivery,
                                     installation: job.installationID.map { InstallationPatch(bundleID: job.bundleID, installationID: $0, deadWidgetToken: token.hex) })
            case (.controls, .controls(let token)):
                return JobCompletion(claim: c, result: .finished(.failed, reason: why), delivery: delivery,
                                     installation: job.installationID.map { InstallationPatch(bundleID: job.bundleID, installationID: $0, deadControlsToken: token.hex) })
            case (_, .liveActivity(let token)):
                return JobCompletion(claim: c, result: .deadToken(token: token.hex, reason: why, graceUntil: now.addingTimeInterval(planner.tokenWait)), delivery: delivery)
            default:
                return JobCompletion(claim: c, result: .finished(.failed, reason: why), delivery: delivery)
            }
        case .fail(let why):
            counters.failed(app: job.bundleID)
            return JobCompletion(claim: c, result: .finished(.failed, reason: why), delivery: delivery,
                                 activity: job.kind == .start ? ActivityPatch(unreachable: .init(reason: why, ifToken: nil)) : nil)
        }
    }

    static func heldReason(_ c: AppCircuit) -> String {
        switch c.mode {
        case .running: "waiting"
        case .backingOff(_, let r): r
        case .paused(_, let r, _): "app paused: \(r)"
        }
    }

    static func reason(_ o: OutcomeResolver.Outcome) -> String? {
        switch o {
        case .accepted: nil
        case .rejected(_, let r, _): r?.rawValue
        case .unreachable(let why, _): "transport: \(why)"
        case .refused: "invalid"
        }
    }

    /// Performs the planned push; never throws. With a tracer, a client span per APNs request
    /// (its apns-id, status and reason), a child of the attempt's.
    func send(_ push: DeliveryPlanner.Push, c: ClaimedJob, app: AppRecord) async -> (OutcomeResolver.Outcome, APNsResponse?, Double) {
        let result: (OutcomeResolver.Outcome, APNsResponse?, Double)
        if let tracer = configuration.tracer {
            let (name, pushType) = switch push.target {
            case .liveActivity: ("APNs POST /3/device", "liveactivity")
            case .widgets: ("APNs POST /3/device", "widgets")
            case .controls: ("APNs POST /3/device", "controls")
            case .broadcast: ("APNs POST /4/broadcast", "liveactivity")
            }
            result = await tracer.withSpan(name, ofKind: .client) { span in
                let r = await sendUntraced(push, c: c, app: app)
                span.updateAttributes { a in
                    a["apns.id"] = c.apnsID.text
                    a["apns.push_type"] = pushType
                    a["apns.priority"] = push.priority.rawValue
                    a["apns.environment"] = (push.environment ?? clients.defaultEnvironment).rawValue
                    a["http.response.status_code"] = r.1?.status
                    a["apns.reason"] = r.1?.reason?.rawValue
                    a["apns.unique_id"] = r.1?.apnsUniqueID
                    a["isle.latency_ms"] = r.2
                }
                if case .accepted = r.0 {} else {
                    span.setStatus(SpanStatus(code: .error, message: Self.reason(r.0)))
                }
                return r
            }
        } else {
            result = await sendUntraced(push, c: c, app: app)
        }
        logger.debug("pushed", metadata: ["job.id": "\(c.job.id)", "apns-id": "\(c.apnsID)", "status": "\(result.1?.status ?? 0)",
                                          "reason": "\(result.1?.reason?.rawValue ?? Self.reason(result.0) ?? "")"])
        return result
    }

    func sendUntraced(_ push: DeliveryPlanner.Push, c: ClaimedJob, app: AppRecord) async -> (OutcomeResolver.Outcome, APNsResponse?, Double) {
        let client: APNsClient
        do { client = try clients.client(for: app, environment: push.environment) } catch {
            return (.unreachable("the app's APNs credentials are unusable: \(error)", configuration: true), nil, 0)
        }
        let start = ContinuousClock.now
        do {
            let response: APNsResponse
            switch push.target {
            case .liveActivity(let token):
                response = try await client.send(APNsPush(deviceToken: token, bundleID: app.bundleID, pushType: .liveactivity, payload: push.payload,
                                                          priority: push.priority, expiration: Self.expiration(push), apnsID: c.apnsID,
                                                          schema: push.attributesType.flatMap(app.schema)))
            case .widgets(let token):
                response = try await client.send(.widgetsReload(token: token, bundleID: app.bundleID, expiration: Self.expiration(push), apnsID: c.apnsID))
            case .controls(let token):
                response = try await client.send(.controlsReload(token: token, bundleID: app.bundleID, expiration: Self.expiration(push), apnsID: c.apnsID))
            case .broadcast(let channelID, let storagePolicy):
                response = try await client.broadcast(BroadcastPush(bundleID: app.bundleID, channelID: channelID, payload: push.payload, priority: push.priority,
                                                                    expiration: Self.expiration(push), storagePolicy: MessageStoragePolicy(rawValue: storagePolicy), requestID: c.apnsID))
            }
            return (.accepted, response, Self.ms(ContinuousClock.now - start))
        } catch {
            // The client throws only APNsError.
            let ms = Self.ms(ContinuousClock.now - start)
            switch error.code {
            case .rejected:
                let r = error.response
                return (.rejected(status: r?.status ?? 0, reason: r?.reason, retryAfter: r?.retryAfter), r, ms)
            case .invalidRequest:
                return (.refused(error.message), nil, ms)
            case .transport:
                let tls = error.transport?.kind == .tlsFailed
                // The server's own setting for the CA it trusts, after the client's advice.
                let why = tls ? error.message + " With isle serve: --apns-ca-cert (against isle sim, the ca.pem its folder holds; isle sim --dir keeps it across restarts)." : error.message
                return (.unreachable(why, configuration: tls), nil, ms)
            }
        }
    }

    /// The plan's storage rule as the header: `0` when APNs should store nothing.
    static func expiration(_ push: DeliveryPlanner.Push) -> APNsExpiration {
        push.storeUntil.map(APNsExpiration.at) ?? .immediately
    }

    static func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }
}

extension Optional {
    func asyncMap<T>(_ f: (Wrapped) async throws -> T) async rethrows -> T? {
        switch self {
        case .some(let w): try await f(w)
        case .none: nil
        }
    }
}
