public import Foundation
public import IsleCore
import Synchronization

/// Everything in memory, behind one lock: for unit tests and for checking that the contract suite
/// describes the queue, not SQLite. Same rules as ``SQLiteStore`` (lanes and coalescing are
/// ``LanePlanner``'s), nothing durable.
public final class MemoryStore: IsleStore {
    struct Job {
        var job: PushJob
        var isHead: Bool
        var supersedable: Bool
        var carriesContent: Bool
        var timestamp: Int64?
        var apnsID: String?
    }

    struct State {
        var apps: [String: AppRecord] = [:]
        var keys: [String: APIKeyRecord] = [:]
        var installations: [String: InstallationRecord] = [:]
        var activities: [String: ActivityRecord] = [:]
        var activityOrder: [String] = []
        var channels: [String: ChannelRecord] = [:]
        var channelOrder: [String] = []
        var channelTimestamps: [String: Int64] = [:]
        var jobs: [Int64: Job] = [:]
        var nextJobID: Int64 = 1
        var nextSeq: Int64 = 1
        var deliveries: [DeliveryRecord] = []
        /// Each delivery's app, by its job (the job may be pruned before it).
        var deliveryApps: [Int64: String] = [:]
        var idempotency: [String: IdempotencyRecord] = [:]
        var highPriority: [(String, Date)] = []
        var events: [StoredEvent] = []
        var nextEventSeq: Int64 = 1
        var webhooks: [String: WebhookRecord] = [:]
        var webhookHolds: [String: (worker: String, until: Date)] = [:]
        var audit: [AuditEntry] = []
        var pauses: [String: OperatorPause] = [:]
        var history: [String: Int64] = [:]

        mutating func append(_ new: [NewEvent]) {
            for e in new {
                events.append(StoredEvent(seq: nextEventSeq, event: e))
                nextEventSeq += 1
            }
        }
    }

    private let state = Mutex(State())

    public init() {}

    public func migrate() async throws {}

    public func holdForServing() throws -> any ServingHold { NoHold() }
    struct NoHold: ServingHold { func release() {} }

    /// Runs `body` on a copy of the state and keeps the copy only if it did not throw: a
    /// transaction.
    private func transaction<T>(_ body: (inout State) throws -> T) throws -> T {
        try state.withLock { s in
            var copy = s
            let result = try body(&copy)
            s = copy
            return result
        }
    }

    // MARK: Apps and keys

    public func upsertApp(_ app: AppRecord) async throws {
        state.withLock { s in
            var a = app
            if let old = s.apps[app.bundleID] { a.createdAt = old.createdAt }
            s.apps[app.bundleID] = a
        }
    }
    public func app(_ bundleID: String) async throws -> AppRecord? { state.withLock { $0.apps[bundleID] } }
    public func apps() async throws -> [AppRecord] { state.withLock { $0.apps.values.sorted { $0.bundleID < $1.bundleID } } }
    public func appRowCounts(_ bundleID: String) async throws -> [String: Int] {
        state.withLock { s in
            var copy = s
            return Self.removeApp(&copy, bundleID)
        }
    }

    public func removeApp(_ bundleID: String) async throws -> [String: Int]? {
        try transaction { s in s.apps[bundleID] == nil ? nil : Self.removeApp(&s, bundleID) }
    }

    /// Removes the app's rows of every kind; how many of each, by the table that holds them in the
    /// other stores (``Schema/appRows``).
    static func removeApp(_ s: inout State, _ bundleID: String) -> [String: Int] {
        var removed: [String: Int] = [:]
        func count(_ table: String, _ n: Int) { removed[table, default: 0] += n }
        let activities = Set(s.activities.values.filter { $0.bundleID == bundleID }.map(\.id))
        let jobs = Set(s.jobs.values.filter { $0.job.bundleID == bundleID }.map(\.job.id))
        func drop<Key, Value>(_ d: inout [Key: Value], _ table: String, _ belongs: (Key, Value) -> Bool) {
            let gone = d.filter { belongs($0.key, $0.value) }.map(\.key)
            for k in gone { d[k] = nil }
            count(table, gone.count)
        }
        func drop<Element>(_ a: inout [Element], _ table: String, _ belongs: (Element) -> Bool) {
            let before = a.count
            a.removeAll(where: belongs)
            count(table, before - a.count)
        }
        drop(&s.deliveries, "deliveries") { d in s.deliveryApps[d.jobID] == bundleID || jobs.contains(d.jobID) || d.activityID.map(activities.contains) == true }
        drop(&s.highPriority, "high_priority_sends") { activities.contains($0.0) }
        count("activity_topics", s.activities.values.filter { $0.bundleID == bundleID }.reduce(0) { $0 + $1.topics.count })
        drop(&s.jobs, "jobs") { _, j in j.job.bundleID == bundleID }
        drop(&s.activities, "activities") { _, a in a.bundleID == bundleID }
        s.activityOrder.removeAll { !s.activities.keys.contains($0) }
        drop(&s.channels, "channels") { _, c in c.bundleID == bundleID }
        s.channelOrder.removeAll { !s.channels.keys.contains($0) }
        drop(&s.installations, "installations") { _, i in i.bundleID == bundleID }
        drop(&s.idempotency, "idempotency") { _, r in r.bundleID == bundleID }
        drop(&s.events, "events") { $0.event.bundleID == bundleID }
        drop(&s.webhooks, "webhooks") { _, w in w.bundleID == bundleID }
        drop(&s.audit, "audit_log") { $0.bundleID == bundleID }
        drop(&s.history, "history") { k, _ in k.hasPrefix(bundleID + "\n") }
        drop(&s.pauses, "app_pauses") { k, _ in k == bundleID }
        drop(&s.keys, "api_keys") { _, k in k.bundleID == bundleID }
        drop(&s.apps, "apps") { k, _ in k == bundleID }
        return removed
    }

    public func insertAPIKey(_ key: APIKeyRecord) async throws {
        try transaction { s in
            guard s.keys[key.secretHash] == nil, !s.keys.values.contains(where: { $0.id == key.id }) else { throw StoreError(.conflict, "the API key exists") }
            s.keys[key.secretHash] = key
        }
    }
    public func apiKey(secretHash: String) async throws -> APIKeyRecord? { state.withLock { $0.keys[secretHash] } }
    public func apiKeys(bundleID: String?) async throws -> [APIKeyRecord] {
        state.withLock { s in s.keys.values.filter { bundleID == nil || $0.bundleID == bundleID }.sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) } }
    }
    public func revokeAPIKey(id: String, at: Date) async throws -> Bool {
        state.withLock { s in
            guard let (hash, key) = s.keys.first(where: { $0.value.id == id }), key.revokedAt == nil else { return false }
            s.keys[hash]?.revokedAt = at
            return true
        }
    }

    // MARK: Installations

    /// Installations are keyed by app and id (ids are namespaced per app).
    static func key(_ bundleID: String, _ id: String) -> String { bundleID + "\n" + id }
    public func upsertInstallation(_ installation: InstallationRecord) async throws {
        state.withLock { $0.installations[Self.key(installation.bundleID, installation.id)] = installation }
    }
    public func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                                   _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void,
                                   idempotency: IdempotentAnswer<InstallationRecord>?) async throws -> InstallationRecord {
        try transaction { s in
            var i = s.installations[Self.key(bundleID, id)] ?? create()
            try change(&i)
            s.installations[Self.key(bundleID, id)] = i
            if let idempotency { try Self.insertIdempotency(&s, idempotency.record(for: i)) }
            return i
        }
    }
    public func installation(bundleID: String, id: String) async throws -> InstallationRecord? { state.withLock { $0.installations[Self.key(bundleID, id)] } }
    public func installations(bundleID: String, userID: String) async throws -> [InstallationRecord] {
        state.withLock { s in s.installations.values.filter { $0.bundleID == bundleID && $0.userID == userID }.sorted { $0.id < $1.id } }
    }

    // MARK: Activities

    public func insertActivity(_ activity: ActivityRecord, idempotency: IdempotencyRecord?) async throws {
        try transaction { s in
            let a = activity
            if let key = a.externalKey,
               let holder = s.activities.values.first(where: { $0.bundleID == a.bundleID && $0.externalKey == key && $0.state.acceptsPushes && ($0.installationID == nil || $0.installationID != a.installationID) }) {
                throw StoreError(.conflict, "\(key) is the key of live activity \(holder.id)")
            }
            try Self.insert(&s, activity)
            if let idempotency { try Self.insertIdempotency(&s, idempotency) }
        }
    }

    /// Stores an idempotent answer in the caller's transaction; a live record with the key means
    /// another request committed first.
    static func insertIdempotency(_ s: inout State, _ r: IdempotencyRecord) throws {
        let k = r.bundleID + "\n" + r.key
        if let old = s.idempotency[k], old.createdAt >= r.createdAt.addingTimeInterval(-IdempotencyRecord.lifetime) {
            throw StoreError(.idempotencyKeyTaken, "another request with this Idempotency-Key was accepted first")
        }
        s.idempotency[k] = r
    }

    static func insert(_ s: inout State, _ a: ActivityRecord) throws {
        guard s.activities[a.id] == nil else { throw StoreError(.conflict, "activity \(a.id) exists") }
        var a = a
        a.topics = Array(Set(a.topics)).sorted()
        s.activities[a.id] = a
        s.activityOrder.append(a.id)
    }

    public func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void,
                               idempotency: IdempotentAnswer<ActivityRecord>?, reportedBy: Events.Source?) async throws -> ActivityRecord? {
        try transaction { s in
            guard let old = s.activities[id] else { return nil }
            var a = old
            try change(&a)
            a.topics = Array(Set(a.topics)).sorted()
            s.activities[id] = a
            if let idempotency { try Self.insertIdempotency(&s, idempotency.record(for: a)) }
            if let reportedBy { s.append(Events.activityChanged(from: old, to: a, by: reportedBy)) }
            return a
        }
    }

    public func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String],
                                    idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord? {
        try transaction { s in
            let match = s.activityOrder.compactMap { s.activities[$0] }.first {
                $0.bundleID == bundleID && $0.externalKey == externalKey && $0.attributesType == attributesType && $0.state == .starting
                    && (installationID == nil || $0.installationID == installationID)
            }
            guard var a = match else { return nil }
            try ActivityLifecycle.apply(.startLinked(token: token, topics: topics), to: &a)
            s.activities[a.id] = a
            if let idempotency { try Self.insertIdempotency(&s, idempotency.record(for: a)) }
            return a
        }
    }

    public func activity(id: String) async throws -> ActivityRecord? { state.withLock { $0.activities[id] } }
    public func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord? {
        state.withLock { s in
            s.activityOrder.reversed().compactMap { s.activities[$0] }
                .filter { $0.bundleID == bundleID && $0.externalKey == externalKey }
                .max { $0.startedAt < $1.startedAt }
        }
    }
    public func liveActivities(bundleID: String, externalKey: String) async throws -> [ActivityRecord] {
        state.withLock { s in s.activityOrder.compactMap { s.activities[$0] }.filter { $0.bundleID == bundleID && $0.externalKey == externalKey && $0.state.acceptsPushes } }
    }
    public func activity(bundleID: String, updateToken: String) async throws -> ActivityRecord? {
        state.withLock { s in s.activityOrder.compactMap { s.activities[$0] }.first { $0.bundleID == bundleID && $0.updateToken == updateToken } }
    }
    public func liveActivityCount(bundleID: String, installationID: String) async throws -> Int {
        try await liveActivities(bundleID: bundleID, installationID: installationID).count
    }

    public func liveActivities(bundleID: String, installationID: String) async throws -> [ActivityRecord] {
        state.withLock { s in
            s.activityOrder.compactMap { s.activities[$0] }.filter { $0.bundleID == bundleID && $0.installationID == installationID && $0.state.acceptsPushes }
                .sorted { ($0.startedAt, $0.id) < ($1.startedAt, $1.id) }
        }
    }
    public func recentActivities(bundleID: String, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        self.state.withLock { s in
            Array(s.activityOrder.reversed().compactMap { s.activities[$0] }.filter { $0.bundleID == bundleID && (state == nil || $0.state == state) }
                .sorted { ($0.startedAt, $0.id) > ($1.startedAt, $1.id) }.prefix(max(0, limit)))
        }
    }

    public func activities(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        state.withLock { s in
            s.activityOrder.compactMap { s.activities[$0] }.filter { $0.bundleID == bundleID && $0.state.acceptsPushes && $0.topics.contains(topic) }
                .sorted { ($0.startedAt, $0.id) < ($1.startedAt, $1.id) }
        }
    }

    // MARK: Channels

    public func insertChannel(_ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws {
        try transaction { s in
            guard s.channels[channel.id] == nil else { throw StoreError(.conflict, "channel \(channel.id) exists") }
            s.channels[channel.id] = channel
            s.channelOrder.append(channel.id)
            if let idempotency { try Self.insertIdempotency(&s, idempotency) }
        }
    }
    public func channels(bundleID: String) async throws -> [ChannelRecord] {
        state.withLock { s in s.channelOrder.compactMap { s.channels[$0] }.filter { $0.bundleID == bundleID } }
    }
    public func channel(id: String) async throws -> ChannelRecord? { state.withLock { $0.channels[id] } }
    public func deleteChannel(id: String, idempotency: IdempotencyRecord?) async throws {
        try transaction { s in
            s.channels[id] = nil
            s.channelOrder.removeAll { $0 == id }
            if let idempotency { try Self.insertIdempotency(&s, idempotency) }
        }
    }

    // MARK: Reads

    public func deliveries(activityID: String) async throws -> [DeliveryRecord] { state.withLock { $0.deliveries.filter { $0.activityID == activityID } } }
    public func deliveries(activityID: String, before: Int64?, limit: Int) async throws -> [DeliveryRecord] {
        state.withLock { s in
            let numbered = s.deliveries.enumerated().map { i, d -> DeliveryRecord in
                var d = d
                d.id = d.id ?? Int64(i + 1)
                return d
            }
            return Array(numbered.filter { $0.activityID == activityID && $0.id! < (before ?? Int64.max) }.suffix(limit))
        }
    }
    public func delivery(apnsID: String) async throws -> DeliveryRecord? { state.withLock { $0.deliveries.last { $0.apnsID == apnsID } } }
    public func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord? { state.withLock { $0.idempotency[bundleID + "\n" + key] } }
    public func prune(now: Date, retention: Retention, limit: Int) async throws -> Int {
        state.withLock { s in
            let finished: Set<PushJobState> = [.sent, .failed, .superseded, .dropped]
            let oldJobs = s.jobs.values.filter { finished.contains($0.job.state) && $0.job.createdAt < now.addingTimeInterval(-retention.finishedJobs) }.prefix(limit).map(\.job.id)
            for id in oldJobs { s.jobs[id] = nil }
            let deliveriesBefore = s.deliveries.count
            var dropped = 0
            s.deliveries.removeAll { d in
                guard dropped < limit, d.at < now.addingTimeInterval(-retention.deliveries) else { return false }
                dropped += 1
                return true
            }
            let sendsBefore = s.highPriority.count
            s.highPriority.removeAll { $0.1 < now.addingTimeInterval(-retention.highPrioritySends) }
            let keys = s.idempotency.filter { $0.value.isExpired(now: now) }.keys.prefix(limit)
            for k in keys { s.idempotency[k] = nil }
            let ended = s.activities.values.filter { !$0.state.acceptsPushes && $0.startedAt < now.addingTimeInterval(-retention.endedActivities) }.prefix(limit).map(\.id)
            for id in ended { s.activities[id] = nil }
            if !ended.isEmpty { s.activityOrder.removeAll { s.activities[$0] == nil } }
            let live = Set(s.activities.values.filter(\.state.acceptsPushes).compactMap { a in a.installationID.map { Self.key(a.bundleID, $0) } })
            let silent = s.installations.filter { $0.value.updatedAt < now.addingTimeInterval(-retention.staleInstallations) && !live.contains($0.key) }.keys.prefix(limit)
            for k in silent { s.installations[k] = nil }
            // Registrations that never became useful: live activities nothing was pushed to, and
            // installations with no user and no activity that stopped reporting.
            let unpushed = s.activities.values.filter { $0.state.acceptsPushes && $0.lastTimestamp == nil && $0.startedAt < now.addingTimeInterval(-retention.unusedActivities) }.prefix(limit).map(\.id)
            for id in unpushed { s.activities[id] = nil }
            if !unpushed.isEmpty { s.activityOrder.removeAll { s.activities[$0] == nil } }
            let withActivities = Set(s.activities.values.compactMap { a in a.installationID.map { Self.key(a.bundleID, $0) } })
            let unused = s.installations.filter { $0.value.userID == nil && $0.value.updatedAt < now.addingTimeInterval(-retention.unusedInstallations) && !withActivities.contains($0.key) }.keys.prefix(limit)
            for k in unused { s.installations[k] = nil }
            let historyBefore = s.history.count
            let cutoff = now.addingTimeInterval(-retention.history).timeIntervalSince1970
            for key in s.history.keys.filter({ k in (Double(k.split(separator: "\n")[1]) ?? 0) < cutoff }).prefix(limit) { s.history[key] = nil }
            let eventsBefore = s.events.count
            var droppedEvents = 0
            let newest = s.events.last?.seq
            s.events.removeAll { e in
                guard droppedEvents < limit, e.seq != newest, e.event.at < now.addingTimeInterval(-retention.events) else { return false }
                droppedEvents += 1
                return true
            }
            return (historyBefore - s.history.count) + (eventsBefore - s.events.count) + oldJobs.count + (deliveriesBefore - s.deliveries.count) + (sendsBefore - s.highPriority.count) + keys.count + ended.count + silent.count + unpushed.count + unused.count
        }
    }

    public func highPrioritySends(activityID: String, since: Date) async throws -> Int {
        state.withLock { s in s.highPriority.filter { $0.0 == activityID && $0.1 >= since }.count }
    }

    // MARK: Queue

    public func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        try transaction { s in
            for a in activities { try Self.insert(&s, a) }
            var ids: [Int64] = []
            for j in jobs {
                let head = LanePlanner.lane(kind: j.kind, activityID: j.activityID, channelID: j.channelID).flatMap { Self.openHead(s, $0) }
                let p = LanePlanner.place(j, now: now) { _ in head }
                let id = s.nextJobID
                s.nextJobID += 1
                var seq: Int64?
                if !p.scheduled {
                    seq = s.nextSeq
                    s.nextSeq += 1
                }
                s.jobs[id] = Job(
                    job: PushJob(id: id, bundleID: j.bundleID, kind: j.kind, activityID: j.activityID, installationID: j.installationID, channelID: j.channelID, aps: j.aps,
                                 hasAlert: j.hasAlert, requestedPriority: j.requestedPriority, runAt: j.runAt, state: p.scheduled ? .scheduled : .queued, attempts: 0, claimedBy: nil,
                                 claimedUntil: nil, lastError: nil, createdAt: now, lane: p.lane, seq: seq),
                    isHead: p.isHead, supersedable: p.supersedable, carriesContent: p.carriesContent)
                s.jobs[id]?.job.encodedAPS = Array(j.apsText.utf8)
                s.jobs[id]?.job.traceParent = j.traceParent
                ids.append(id)
                if p.coalescesLane, let lane = p.lane { _ = Self.coalesce(&s, lane: lane, now: now) }
            }
            if var r = idempotency {
                r.body = r.body(withJobs: ids)
                try Self.insertIdempotency(&s, r)
            }
            return ids
        }
    }

    /// The unfinished jobs of a lane, in lane order.
    static func open(_ s: State, _ lane: String) -> [Job] {
        s.jobs.values.filter { $0.job.lane == lane && ($0.job.state == .queued || $0.job.state == .claimed) }.sorted { ($0.job.seq ?? 0) < ($1.job.seq ?? 0) }
    }
    static func openHead(_ s: State, _ lane: String) -> LanePlanner.Head? {
        open(s, lane).first.map { LanePlanner.Head(id: $0.job.id, isHead: $0.isHead, claimed: $0.job.state == .claimed, supersedable: $0.supersedable) }
    }
    static func fixHead(_ s: inout State, _ lane: String?) {
        guard let lane, let id = openHead(s, lane)?.id else { return }
        s.jobs[id]?.isHead = true
    }

    static func coalesce(_ s: inout State, lane: String, now: Date) -> Int64? {
        let entries = open(s, lane).map {
            LanePlanner.Entry(id: $0.job.id, supersedable: $0.supersedable, carriesContent: $0.carriesContent, due: $0.job.runAt <= now, claimed: $0.job.state == .claimed)
        }
        let d = LanePlanner.decide(entries)
        for id in d.superseded where s.jobs[id]?.job.state == .queued {
            s.jobs[id]?.job.state = .superseded
            s.jobs[id]?.isHead = false
            s.jobs[id]?.job.lastError = "superseded by newer content before it was sent"
        }
        if !d.superseded.isEmpty { fixHead(&s, lane) }
        return d.claim
    }

    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        guard limit > 0 else { return [] }
        return try transaction { s in
            // Scheduled jobs that came due take their place in their lanes.
            for var j in s.jobs.values.filter({ $0.job.state == .scheduled && $0.job.runAt <= now }).sorted(by: { ($0.job.runAt, $0.job.id) < ($1.job.runAt, $1.job.id) }) {
                let head = j.job.lane.flatMap { Self.openHead(s, $0) }
                let joined = LanePlanner.join(lane: j.job.lane, carriesContent: j.carriesContent) { _ in head }
                j.job.state = .queued
                j.job.seq = s.nextSeq
                s.nextSeq += 1
                j.isHead = joined.isHead
                s.jobs[j.job.id] = j
                if joined.coalescesLane, let lane = j.job.lane { _ = Self.coalesce(&s, lane: lane, now: now) }
            }
            let heads = s.jobs.values.filter { $0.isHead && $0.job.state == .queued && $0.job.runAt <= now && !excludingApps.contains($0.job.bundleID) }
                .sorted { ($0.job.runAt, $0.job.seq ?? 0) < ($1.job.runAt, $1.job.seq ?? 0) }
                .prefix(limit)
            var claimed: [ClaimedJob] = []
            for head in heads {
                var id = head.job.id
                if let lane = head.job.lane, head.supersedable {
                    guard let pick = Self.coalesce(&s, lane: lane, now: now) else { continue }
                    id = pick
                }
                guard var j = s.jobs[id] else { continue }
                var activity = j.job.activityID.flatMap { s.activities[$0] }
                if j.timestamp == nil {
                    let channel = j.job.kind == .broadcast ? j.job.channelID : nil
                    let ts = ClaimedJob.firstTimestamp(now: now, afterActivity: activity?.lastTimestamp, afterChannel: channel.flatMap { s.channelTimestamps[$0] })
                    if let c = channel { s.channelTimestamps[c] = ts }
                    j.timestamp = ts
                    if let a = activity?.id {
                        s.activities[a]?.lastTimestamp = ts
                        activity?.lastTimestamp = ts
                    }
                }
                if j.apnsID == nil { j.apnsID = ClaimedJob.newAPNsID(now: now) }
                j.job.markClaimed(by: worker, until: now.addingTimeInterval(lease))
                s.jobs[id] = j
                let reads = ClaimReads(j.job, activity: activity, now: now)
                let installation = reads.installation.flatMap { s.installations[Self.key($0.bundleID, $0.id)] }
                let sends = reads.highPriorityActivity.map { a in s.highPriority.filter { $0.0 == a && $0.1 >= reads.since }.count } ?? 0
                claimed.append(ClaimedJob(job: j.job, timestamp: j.timestamp!, apnsID: j.apnsID!, worker: worker, activity: activity, installation: installation, highPrioritySends: sends))
            }
            return claimed
        }
    }

    public func complete(_ c: JobCompletion) async throws -> Bool {
        try transaction { s in
            let id = c.claim.job.id
            guard var j = s.jobs[id], j.job.state == .claimed, j.job.claimedBy == c.claim.worker, j.job.attempts == c.claim.job.attempts else { return false }
            let w = c.writes(currentToken: j.job.activityID.flatMap { s.activities[$0]?.updateToken })
            j.job.claimedBy = nil
            j.job.claimedUntil = nil
            switch w.job {
            case .finish(let state, let reason):
                j.job.state = state
                j.job.lastError = reason
                j.isHead = false
                s.jobs[id] = j
                Self.fixHead(&s, j.job.lane)
            case .requeue(let at, let reason):
                j.job.state = .queued
                j.job.runAt = at
                j.job.lastError = reason
                s.jobs[id] = j
            }
            if let d = w.delivery {
                s.deliveries.append(d)
                s.deliveryApps[d.jobID] = j.job.bundleID
            }
            if let p = w.activity {
                if let a = j.job.activityID {
                    Self.apply(&s, p, to: a)
                } else if j.job.kind == .broadcast, let channel = j.job.channelID {
                    for (id, a) in s.activities where a.channelID == channel { Self.apply(&s, p, to: id) }
                }
            }
            if let p = w.installation, var i = s.installations[Self.key(p.bundleID, p.installationID)] {
                _ = p.apply(to: &i)
                s.installations[Self.key(p.bundleID, p.installationID)] = i
            }
            if let at = w.highPriorityAt, let a = j.job.activityID { s.highPriority.append((a, at)) }
            s.append(Events.of(c, w))
            return true
        }
    }

    static func apply(_ s: inout State, _ p: ActivityPatch, to id: String) {
        guard var a = s.activities[id] else { return }
        // A push never throws: it changes a live activity or nothing.
        try? ActivityLifecycle.apply(.pushed(p), to: &a)
        s.activities[id] = a
    }

    public func nextDue(after now: Date, excludingApps: Set<String>) async throws -> Date? {
        state.withLock { s in
            let waiting = s.jobs.values.filter { j in
                !excludingApps.contains(j.job.bundleID) && (j.job.state == .scheduled || (j.job.state == .queued && j.isHead))
            }
            return waiting.map(\.job.runAt).min()
        }
    }

    public func requeueClaimsAtStart(now: Date) async throws -> Int { try await requeueExpiredClaims(now: .distantFuture, keeping: []) }

    public func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int {
        state.withLock { s in
            var n = 0
            for (id, j) in s.jobs where j.job.state == .claimed && (j.job.claimedUntil ?? .distantFuture) < now && !keeping.contains(id) {
                s.jobs[id]?.job.state = .queued
                s.jobs[id]?.job.claimedBy = nil
                s.jobs[id]?.job.claimedUntil = nil
                n += 1
            }
            return n
        }
    }

    public func wakeLane(activityID: String, now: Date) async throws {
        state.withLock { s in
            for (id, j) in s.jobs where j.job.lane == "a:" + activityID && j.isHead && j.job.state == .queued && j.job.runAt > now { s.jobs[id]?.job.runAt = now }
        }
    }

    public func wakeApp(bundleID: String, now: Date) async throws {
        state.withLock { s in
            for (id, j) in s.jobs where j.job.bundleID == bundleID && j.isHead && j.job.state == .queued && j.job.runAt > now { s.jobs[id]?.job.runAt = now }
        }
    }

    public func job(id: Int64) async throws -> PushJob? { state.withLock { $0.jobs[id]?.job } }

    public func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob] {
        state.withLock { s in
            Array(s.jobs.values.map(\.job).filter { j in
                j.bundleID == bundleID && (activityID == nil || j.activityID == activityID) && [.scheduled, .queued, .claimed].contains(j.state)
            }.sorted { ($0.runAt, $0.id) < ($1.runAt, $1.id) }.prefix(max(0, limit)))
        }
    }

    public func cancelJob(id: Int64, bundleID: String, reason: String) async throws -> PushJob? {
        state.withLock { s in
            guard let j = s.jobs[id], j.job.bundleID == bundleID, j.job.state == .scheduled || j.job.state == .queued else { return nil }
            let before = j.job
            s.jobs[id]?.job.state = .dropped
            s.jobs[id]?.job.lastError = reason
            s.jobs[id]?.isHead = false
            Self.fixHead(&s, before.lane)
            return before
        }
    }

    public func retryJobNow(id: Int64, bundleID: String, now: Date) async throws -> Bool {
        state.withLock { s in
            guard let j = s.jobs[id], j.job.bundleID == bundleID, j.job.state == .queued else { return false }
            if j.job.runAt > now { s.jobs[id]?.job.runAt = now }
            return true
        }
    }
    public func openJobCounts() async throws -> [PushJobState: Int] {
        let all = try await jobCounts()
        return [.scheduled: all[.scheduled] ?? 0, .queued: all[.queued] ?? 0, .claimed: all[.claimed] ?? 0]
    }

    public func ping() async throws {}

    public func jobCounts() async throws -> [PushJobState: Int] {
        state.withLock { s in s.jobs.values.reduce(into: [:]) { $0[$1.job.state, default: 0] += 1 } }
    }
}

// MARK: Events and webhooks

extension MemoryStore {
    public func appendEvents(_ events: [NewEvent]) async throws { state.withLock { $0.append(events) } }

    public func events(bundleID: String, after seq: Int64, limit: Int) async throws -> [StoredEvent] {
        state.withLock { s in Array(s.events.lazy.filter { $0.seq > seq && $0.event.bundleID == bundleID }.prefix(max(0, limit))) }
    }

    public func lastEventSeq(bundleID: String) async throws -> Int64 {
        state.withLock { s in s.events.last { $0.event.bundleID == bundleID }?.seq ?? 0 }
    }

    public func insertWebhook(_ w: WebhookRecord) async throws {
        try state.withLock { s in
            guard s.webhooks[w.id] == nil else { throw StoreError(.conflict, "webhook \(w.id) exists") }
            s.webhooks[w.id] = w
        }
    }

    public func webhooks(bundleID: String) async throws -> [WebhookRecord] {
        state.withLock { s in s.webhooks.values.filter { $0.bundleID == bundleID }.sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) } }
    }

    public func allWebhooks() async throws -> [WebhookRecord] {
        state.withLock { s in s.webhooks.values.sorted { ($0.createdAt, $0.id) < ($1.createdAt, $1.id) } }
    }

    public func webhook(id: String) async throws -> WebhookRecord? { state.withLock { $0.webhooks[id] } }

    public func deleteWebhook(id: String) async throws -> Bool { state.withLock { $0.webhooks.removeValue(forKey: id) != nil } }

    public func saveWebhookProgress(_ w: WebhookRecord) async throws -> Bool {
        state.withLock { s in
            guard let old = s.webhooks[w.id] else { return false }
            var new = w
            new.url = old.url
            new.secret = old.secret
            new.bundleID = old.bundleID
            new.createdAt = old.createdAt
            new.cursor = max(old.cursor, w.cursor)
            s.webhooks[w.id] = new
            return true
        }
    }

    public func holdWebhook(id: String, worker: String, now: Date, lease: TimeInterval) async throws -> Bool {
        state.withLock { s in
            guard s.webhooks[id] != nil else { return false }
            if let h = s.webhookHolds[id], h.worker != worker, h.until >= now { return false }
            s.webhookHolds[id] = (worker, now.addingTimeInterval(lease))
            return true
        }
    }
}

extension MemoryStore {
    public func appendAudit(_ e: AuditEntry) async throws {
        state.withLock { s in
            var entry = e
            entry.id = Int64(s.audit.count + 1)
            s.audit.append(entry)
        }
    }

    public func auditLog(bundleID: String, before: Int64?, limit: Int) async throws -> [AuditEntry] {
        state.withLock { s in Array(s.audit.reversed().filter { $0.bundleID == bundleID && ($0.id ?? 0) < (before ?? Int64.max) }.prefix(max(0, limit))) }
    }
}

extension MemoryStore {
    public func pauseApp(_ p: OperatorPause, event: NewEvent) async throws -> Bool {
        state.withLock { s in
            let was = s.pauses[p.bundleID] != nil
            s.pauses[p.bundleID] = p
            if !was { s.append([event]) }
            return !was
        }
    }

    public func resumeApp(bundleID: String, event: NewEvent) async throws -> OperatorPause? {
        state.withLock { s in
            guard let p = s.pauses.removeValue(forKey: bundleID) else { return nil }
            s.append([event])
            return p
        }
    }

    public func operatorPauses() async throws -> [OperatorPause] { state.withLock { s in s.pauses.values.sorted { $0.bundleID < $1.bundleID } } }
}

extension MemoryStore {
    static func historyKey(_ b: String, _ m: Date, _ k: String) -> String { "\(b)\n\(m.timeIntervalSince1970)\n\(k)" }

    public func addHistory(_ points: [HistoryPoint]) async throws {
        state.withLock { s in for p in points where s.apps[p.bundleID] != nil { s.history[Self.historyKey(p.bundleID, p.minute, p.metric), default: 0] += p.count } }
    }

    public func history(bundleID: String, from: Date, to: Date, bucket: TimeInterval) async throws -> [HistoryPoint] {
        let size = max(60, bucket)
        return state.withLock { s in
            var sums: [String: (Date, String, Int64)] = [:]
            for (key, n) in s.history {
                let parts = key.split(separator: "\n", maxSplits: 2).map(String.init)
                guard parts.count == 3, parts[0] == bundleID, let t = Double(parts[1]), t >= from.timeIntervalSince1970, t < to.timeIntervalSince1970 else { continue }
                let b = (t / size).rounded(.down) * size
                let k = "\(b)\n\(parts[2])"
                sums[k] = (Date(timeIntervalSince1970: b), parts[2], (sums[k]?.2 ?? 0) + n)
            }
            return sums.values.sorted { ($0.0, $0.1) < ($1.0, $1.1) }.map { HistoryPoint(bundleID: bundleID, minute: $0.0, metric: $0.1, count: $0.2) }
        }
    }
}

extension MemoryStore {
    public func highPrioritySends(bundleID: String, since: Date, limit: Int) async throws -> [(activityID: String, count: Int)] {
        state.withLock { s in
            var n: [String: Int] = [:]
            for (id, at) in s.highPriority where at >= since && s.activities[id]?.bundleID == bundleID { n[id, default: 0] += 1 }
            return Array(n.sorted { ($1.value, $0.key) < ($0.value, $1.key) }.prefix(max(0, limit)).map { (activityID: $0.key, count: $0.value) })
        }
    }
}

extension MemoryStore {
    public func findActivities(bundleID: String, keyPrefix: String?, installationID: String?, userID: String?, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        self.state.withLock { s in
            let users = Set(s.installations.values.filter { $0.bundleID == bundleID && userID != nil && $0.userID == userID }.map(\.id))
            return Array(s.activityOrder.reversed().compactMap { s.activities[$0] }.filter { a in
                a.bundleID == bundleID && (state == nil || a.state == state) && (keyPrefix.map { p in a.externalKey?.hasPrefix(p) ?? false } ?? true)
                    && (installationID == nil || a.installationID == installationID) && (userID == nil || a.installationID.map(users.contains) == true)
            }.sorted { ($0.startedAt, $0.id) > ($1.startedAt, $1.id) }.prefix(max(0, limit)))
        }
    }
}
