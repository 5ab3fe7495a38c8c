public import Foundation
import IsleCore

/// The durable queue's procedure, written once: enqueue, promotion of scheduled jobs, claim,
/// completion and an operator's cancel, each a short sequence of set-based reads, decisions by
/// ``LanePlanner`` (over a ``LaneBoard``), ``JobCompletion/writes(currentToken:)``,
/// ``ClaimedJob/firstTimestamp(now:afterActivity:afterChannel:)`` and ``Events/of(_:_:)``, and one
/// batch of writes (``QueueWrites``). Every store runs exactly this inside one of its transactions
/// (``QueueTransaction``); the stores hold SQL and row mapping only. (docs/server.md, "The queue")
public enum QueueProcedure {
    /// How many open jobs of a lane a decision looks at.
    public static let window = 256
    public static let supersededReason = "superseded by newer content before it was sent"

    /// One API request's jobs, the activities they start (push-to-start) and its idempotent answer.
    public struct EnqueueRequest: Sendable {
        public var jobs: [NewPushJob]
        public var activities: [ActivityRecord]
        public var idempotency: IdempotencyRecord?
        public var now: Date
        public init(jobs: [NewPushJob], activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) {
            self.jobs = jobs
            self.activities = activities
            self.idempotency = idempotency
            self.now = now
        }
    }

    // MARK: Enqueue

    /// Queues every request's jobs in order, in one transaction: a due job joins the end of its lane
    /// (its head if the lane is empty; a plain update waiting there that it makes pointless is
    /// superseded now); a job due later waits as `scheduled`. Answers each request's job ids.
    public static func enqueue(_ tx: some QueueTransaction, _ requests: [EnqueueRequest]) async throws -> [[Int64]] {
        // The requests' jobs in order, without copying them (a fan-out may hold a million).
        let count = requests.reduce(0) { $0 + $1.jobs.count }
        try await tx.lockLanes(unique(requests.flatMap { r in r.jobs.lazy.compactMap { lane(of: $0) } }))
        let dueLanes = unique(requests.flatMap { r in r.jobs.lazy.filter { $0.runAt <= r.now }.compactMap { lane(of: $0) } })
        var board = LaneBoard(windows: try await windows(tx, dueLanes, limit: window))
        var rows: [NewJobRow] = []
        rows.reserveCapacity(count)
        for r in requests {
            let now = r.now
            for job in r.jobs {
                let n = rows.count
                let lane = lane(of: job)
                let scheduled = job.runAt > now
                let supersedable = LanePlanner.isSupersedable(kind: job.kind, payload: job.payload)
                let carries = LanePlanner.carriesContent(kind: job.kind, payload: job.payload)
                rows.append(NewJobRow(job: job, lane: lane, state: scheduled ? .scheduled : .queued, isHead: false, supersedable: supersedable, carriesContent: carries,
                                      lastError: nil, createdAt: now))
                if !scheduled { board.join(.added(n), lane: lane, supersedable: supersedable, carriesContent: carries, runAt: job.runAt, now: now) }
            }
        }
        for n in board.headsAdded { rows[n].isHead = true }
        for n in board.supersededAdded {
            rows[n].state = .superseded
            rows[n].isHead = false
            rows[n].lastError = supersededReason
        }
        var before = QueueWrites()
        before.activities = requests.flatMap(\.activities)
        if !before.isEmpty { _ = try await tx.apply(before) }
        let ids = rows.isEmpty ? [] : try await tx.insertJobs(rows)
        var after = QueueWrites()
        after.ended = board.supersededStored.map { .init(id: $0, state: .superseded, reason: supersededReason) }
        after.heads = board.newHeadsStored
        var out: [[Int64]] = []
        var next = 0
        for r in requests {
            let mine = Array(ids[next..<next + r.jobs.count])
            next += r.jobs.count
            if var record = r.idempotency {
                record.body = record.body(withJobs: mine)
                after.idempotency.append(record)
            }
            out.append(mine)
        }
        after.notify = count > 0
        if !after.isEmpty { _ = try await tx.apply(after) }
        return out
    }

    // MARK: Promotion

    /// Scheduled jobs that came due (at most ``LanePlanner/promotionBatch`` per call) take their
    /// places in their lanes, as if enqueued now; a lane another transaction holds waits for the
    /// next call.
    public static func promote(_ tx: some QueueTransaction, now: Date) async throws {
        let due = try await tx.dueScheduled(now: now, limit: LanePlanner.promotionBatch)
        guard !due.isEmpty else { return }
        let held = try await tx.tryLockLanes(unique(due.compactMap(\.lane)))
        let rows = due.filter { $0.lane.map(held.contains) ?? true }
        var board = LaneBoard(windows: try await windows(tx, unique(rows.compactMap(\.lane)), limit: window))
        for (n, r) in rows.enumerated() {
            board.join(.added(n), lane: r.lane, supersedable: r.supersedable, carriesContent: r.carriesContent, runAt: now, now: now)
        }
        var w = QueueWrites()
        w.promoted = rows.enumerated().map { n, r in
            board.supersededAdded.contains(n)
                ? .init(id: r.id, state: .superseded, isHead: false, lastError: supersededReason)
                : .init(id: r.id, state: .queued, isHead: board.headsAdded.contains(n), lastError: nil)
        }
        w.ended = board.supersededStored.map { .init(id: $0, state: .superseded, reason: supersededReason) }
        w.heads = board.newHeadsStored
        _ = try await tx.apply(w)
    }

    // MARK: Claim

    /// In one transaction: scheduled jobs that came due are promoted; then up to `limit` due lane
    /// heads of apps not in `excludingApps` are claimed, oldest first, for `lease` seconds. A head
    /// that is a plain update hands over to the newest content of its lane (the updates between are
    /// superseded). Each job's timestamp (strictly increasing per activity and channel) and apns-id
    /// are fixed at its first claim and kept by its retries. A row that does not decode fails,
    /// saying why, and its lane moves on.
    public static func claim(_ tx: some QueueTransaction, limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        guard limit > 0 else { return [] }
        try await promote(tx, now: now)
        let read = try await tx.dueHeads(now: now, limit: limit, excludingApps: excludingApps)
        guard !read.isEmpty else { return [] }
        // A lane another transaction is changing (an enqueue, a completion) waits for the next claim.
        let held = try await tx.tryLockLanes(unique(read.compactMap(\.lane)))
        let heads = read.filter { $0.lane.map(held.contains) ?? true }
        // The lanes to look into: a bad row's (its next job becomes the head) and a plain update's.
        let looked = heads.filter { h in
            if case .failure = h.job { return true }
            return h.supersedable
        }
        var board = LaneBoard(windows: try await windows(tx, unique(looked.compactMap(\.lane)), limit: window))
        var w = QueueWrites()
        var chosen: [Int64] = []
        var byID: [Int64: StoredJob] = [:]
        for h in heads {
            byID[h.id] = h
            if case .failure(let bad) = h.job {
                w.ended.append(.init(id: h.id, state: .failed, reason: "\(bad)"))
                if let lane = h.lane { board.remove(.stored(h.id), lane: lane) }
                continue
            }
            guard let lane = h.lane, h.supersedable else {
                chosen.append(h.id)
                continue
            }
            if case .stored(let id)? = board.coalesce(lane, now: now) { chosen.append(id) }
        }
        let missing = chosen.filter { byID[$0] == nil }
        if !missing.isEmpty { for j in try await tx.jobs(ids: missing) { byID[j.id] = j } }
        var jobs: [(job: PushJob, stored: StoredJob)] = []
        for id in chosen {
            guard let s = byID[id] else { continue }
            switch s.job {
            case .success(let job): jobs.append((job, s))
            case .failure(let bad):
                w.ended.append(.init(id: id, state: .failed, reason: "\(bad)"))
                if let lane = s.lane { board.remove(.stored(id), lane: lane) }
            }
        }
        w.ended += board.supersededStored.map { .init(id: $0, state: .superseded, reason: supersededReason) }
        w.heads = board.newHeadsStored
        let claimed = try await stamp(tx, jobs, now: now, lease: lease, worker: worker, into: &w)
        if !w.isEmpty { _ = try await tx.apply(w) }
        return claimed
    }

    /// Fixes each job's timestamp and apns-id at its first claim, reads what planning needs
    /// (``ClaimReads``), and adds the claims to `w`.
    static func stamp(_ tx: some QueueTransaction, _ jobs: [(job: PushJob, stored: StoredJob)], now: Date, lease: TimeInterval, worker: String,
                      into w: inout QueueWrites) async throws -> [ClaimedJob] {
        guard !jobs.isEmpty else { return [] }
        var activities = try await tx.activitiesIfAny(unique(jobs.compactMap(\.job.activityID)))
        var channelLast = try await tx.channelTimestampsIfAny(unique(jobs.filter { $0.job.kind == .broadcast && $0.stored.timestamp == nil }.compactMap(\.job.channelID)))
        var claimed: [ClaimedJob] = []
        claimed.reserveCapacity(jobs.count)
        for (job, stored) in jobs {
            var j = job
            var activity = j.activityID.flatMap { activities[$0] }
            var timestamp = stored.timestamp
            if timestamp == nil {
                let channel = j.kind == .broadcast ? j.channelID : nil
                let ts = ClaimedJob.firstTimestamp(now: now, afterActivity: activity?.lastTimestamp, afterChannel: channel.flatMap { channelLast[$0] })
                if let channel {
                    channelLast[channel] = ts
                    w.channelTimestamps[channel] = ts
                }
                if var a = activity {
                    a.lastTimestamp = ts
                    activities[a.id] = a
                    activity = a
                    w.activityTimestamps[a.id] = ts
                }
                timestamp = ts
            }
            let apnsID = stored.apnsID ?? ClaimedJob.newAPNsID(now: now)
            j.markClaimed(by: worker, until: now.addingTimeInterval(lease))
            w.claims.append(.init(id: j.id, timestamp: timestamp ?? 0, apnsID: apnsID))
            claimed.append(ClaimedJob(job: j, timestamp: timestamp ?? 0, apnsID: apnsID, worker: worker, activity: activity))
        }
        w.claimWorker = worker
        w.claimUntil = now.addingTimeInterval(lease)
        // What planning needs besides the activity, read for the whole batch.
        let reads = claimed.map { ClaimReads($0.job, activity: $0.activity, now: now) }
        let installations = try await tx.installationsIfAny(unique(reads.compactMap { $0.installation.map { InstallationKey(bundleID: $0.bundleID, id: $0.id) } }))
        // Both counts in one read: the activity's and its installation's (the planner picks by its scope).
        let sends = try await tx.highPrioritySendsIfAny(unique(reads.flatMap { [$0.highPriorityActivity, $0.highPriorityInstallation].compactMap { $0 } }), since: now.addingTimeInterval(-3600))
        for (n, r) in reads.enumerated() {
            claimed[n].installation = r.installation.flatMap { installations[InstallationKey(bundleID: $0.bundleID, id: $0.id)] }
            claimed[n].highPrioritySends = r.highPriorityActivity.flatMap { sends[$0] } ?? 0
            claimed[n].installationHighPrioritySends = r.highPriorityInstallation.map { sends[$0] ?? 0 }
        }
        return claimed
    }

    // MARK: Completion

    /// Writes each worker's verdict if its claim is still the worker's (same worker, same
    /// attempt), in one transaction; answers, per completion, whether it was. A job done for good
    /// leaves its lane (the next job becomes the head); with it go its delivery record, what the
    /// push changed in its activity (or a broadcast's subscribers) and installation, its
    /// priority-10 send and its events (``Events/of(_:_:)``).
    public static func complete(_ tx: some QueueTransaction, _ cs: [JobCompletion]) async throws -> [Bool] {
        guard !cs.isEmpty else { return [] }
        try await tx.lockLanes(unique(cs.compactMap(\.claim.job.lane)))
        let tokensToRead = cs.compactMap { c -> String? in
            if case .deadToken = c.result { return c.claim.job.activityID }
            return c.dueNowIfTokenArrived ? c.claim.job.activityID : nil
        }
        let current = try await tx.activitiesIfAny(unique(tokensToRead))
        let writes = cs.map { c in c.writes(currentToken: c.claim.job.activityID.flatMap { current[$0]?.updateToken }) }
        var jobWrites = QueueWrites()
        for (c, w) in zip(cs, writes) {
            let claim = QueueWrites.Guard(id: c.claim.job.id, worker: c.claim.worker, attempts: c.claim.job.attempts)
            let answer = w.delivery.flatMap(APNsAnswer.init(delivery:))
            switch w.job {
            case .finish(let state, let reason): jobWrites.finished.append(.init(claim: claim, state: state, reason: reason, answer: answer))
            case .requeue(let at, let reason): jobWrites.requeued.append(.init(claim: claim, at: at, reason: reason, answer: answer))
            }
        }
        let written = try await tx.apply(jobWrites)
        let done = cs.indices.filter { written.contains(cs[$0].claim.job.id) }
        guard !done.isEmpty else { return cs.map { _ in false } }
        var rest = QueueWrites()
        // The next job of each lane a finished job left becomes its head.
        let left = unique(done.filter { if case .finish = writes[$0].job { return true } else { return false } }.compactMap { cs[$0].claim.job.lane })
        let next = try await windows(tx, left, limit: 1)
        rest.heads = left.compactMap { next[$0]?.first }.filter { !$0.isHead }.map(\.id)
        for i in done {
            let job = cs[i].claim.job
            let w = writes[i]
            if let d = w.delivery { rest.deliveries.append(.init(record: d, bundleID: job.bundleID)) }
            if let p = w.activity {
                if let id = job.activityID {
                    rest.activityPatches.append(.init(target: .activity(id), patch: p))
                } else if job.kind == .broadcast, let channel = job.channelID {
                    // A broadcast changes every activity subscribed to its channel.
                    rest.activityPatches.append(.init(target: .channel(channel), patch: p))
                }
            }
            if let at = w.highPriorityAt {
                // Counted for the activity and for its installation (the app on that phone, as the
                // phone counts it); a broadcast for each installation with an activity on its channel.
                if let id = job.activityID {
                    rest.highPrioritySends.append(.init(activityID: id, at: at))
                    if let inst = cs[i].claim.activity?.installationID ?? job.installationID {
                        rest.highPrioritySends.append(.init(activityID: BudgetScope.installationKey(bundleID: job.bundleID, installationID: inst), at: at))
                    }
                } else if job.kind == .broadcast, let channel = job.channelID {
                    rest.highPriorityChannelSends.append(.init(channelID: channel, at: at))
                }
            }
            rest.events += Events.of(cs[i], w)
            if w.wakesNow { rest.notify = true }
        }
        // The installations the batch changes (dead tokens an installation still holds leave it: a
        // new one may have arrived since the push) and whose users its events name, read at once.
        let patches = done.compactMap { writes[$0].installation }
        let named = unique(patches.map { InstallationKey(bundleID: $0.bundleID, id: $0.installationID) } + rest.events.compactMap(\.installationForUser))
        var records = try await tx.installationsIfAny(named)
        for i in rest.events.indices {
            if let key = rest.events[i].installationForUser { rest.events[i].userID = records[key]?.userID }
        }
        if !patches.isEmpty {
            var changed: [InstallationKey] = []
            for p in patches {
                let key = InstallationKey(bundleID: p.bundleID, id: p.installationID)
                guard var record = records[key], p.apply(to: &record) else { continue }
                records[key] = record
                if !changed.contains(key) { changed.append(key) }
            }
            rest.installations = changed.compactMap { records[$0] }
        }
        if !rest.isEmpty { _ = try await tx.apply(rest) }
        return cs.map { written.contains($0.claim.job.id) }
    }

    // MARK: An operator's cancel

    /// An operator cancels a job that is not in flight (scheduled or queued): it becomes `dropped`
    /// with `reason`, and its lane's next job becomes the head. The job as it was; nil when there is
    /// no such job of the app, or it is in flight or finished (nothing changes).
    public static func cancel(_ tx: some QueueTransaction, id: Int64, bundleID: String, reason: String) async throws -> PushJob? {
        func cancellable() async throws -> PushJob? {
            guard let stored = try await tx.jobs(ids: [id]).first, case .success(let job) = stored.job, job.bundleID == bundleID,
                  job.state == .scheduled || job.state == .queued else { return nil }
            return job
        }
        guard let peek = try await cancellable() else { return nil }
        // The lane's lock first, as every change to a lane takes it; then the job as it is now.
        if let lane = peek.lane { try await tx.lockLanes([lane]) }
        guard let job = try await cancellable() else { return nil }
        var w = QueueWrites()
        w.ended = [.init(id: id, state: .dropped, reason: reason)]
        if job.state == .queued, let lane = job.lane {
            var board = LaneBoard(windows: try await windows(tx, [lane], limit: 2))
            board.remove(.stored(id), lane: lane)
            w.heads = board.newHeadsStored
        }
        return try await tx.apply(w).contains(id) ? job : nil
    }

    // MARK: Helpers

    public static func lane(of job: NewPushJob) -> String? {
        LanePlanner.lane(kind: job.kind, activityID: job.activityID, channelID: job.channelID)
    }

    static func windows(_ tx: some QueueTransaction, _ lanes: [String], limit: Int) async throws -> [String: [LaneJob]] {
        lanes.isEmpty ? [:] : try await tx.laneWindows(lanes, limit: limit)
    }

    /// The values once each, in their first order.
    static func unique<T: Hashable>(_ values: [T]) -> [T] {
        var seen = Set<T>()
        return values.filter { seen.insert($0).inserted }
    }
}

extension QueueTransaction {
    // Reads skipped when there is nothing to read: no statement for an empty set.
    func activitiesIfAny(_ ids: [String]) async throws -> [String: ActivityRecord] { ids.isEmpty ? [:] : try await activities(ids: ids) }
    func channelTimestampsIfAny(_ ids: [String]) async throws -> [String: Int64] { ids.isEmpty ? [:] : try await channelTimestamps(ids: ids) }
    func installationsIfAny(_ keys: [InstallationKey]) async throws -> [InstallationKey: InstallationRecord] { keys.isEmpty ? [:] : try await installations(keys) }
    func highPrioritySendsIfAny(_ ids: [String], since: Date) async throws -> [String: Int] { ids.isEmpty ? [:] : try await highPrioritySends(activityIDs: ids, since: since) }
}
