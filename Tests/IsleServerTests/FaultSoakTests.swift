import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// The randomized fault soak: the real server (SQLite file, HTTP API, delivery engine) against the
/// simulator (HTTP/2 + TLS, simulated iPhone), many activities, and a seeded random mix of updates,
/// alerts, bare ends, 503s, 429s, latency, GOAWAY, token rotations while pushes are in flight,
/// dismissals and a hard restart of the server — then every invariant of docs/server.md
/// ("Delivery semantics") is checked. `ISLE_SOAK_SEED` and `ISLE_SOAK_SECONDS` replay or lengthen a
/// run (`scripts/soak.sh`); in `swift test` it is bounded to a fixed seed and ~15 s.
@Suite("Randomized fault soak", .serialized)
struct FaultSoakTests {
    @Test("seeded soak: every invariant holds under faults while work is queued and in flight")
    func soak() async throws {
        let env = ProcessInfo.processInfo.environment
        let seed = env["ISLE_SOAK_SEED"].flatMap(UInt64.init) ?? 20_261_123
        let seconds = env["ISLE_SOAK_SECONDS"].flatMap(Double.init) ?? 10
        let activities = env["ISLE_SOAK_ACTIVITIES"].flatMap(Int.init) ?? 16
        print("fault soak: seed \(seed), \(seconds) s of operations, \(activities) activities (replay: ISLE_SOAK_SEED=\(seed) scripts/soak.sh)")
        try await FaultSoak(seed: seed, duration: .seconds(seconds), activityCount: activities).run()
    }
}

struct FaultSoak {
    let seed: UInt64
    let duration: Duration
    let activityCount: Int

    /// What the backend and the app did, as the test saw the server accept it.
    struct Model {
        var isleID: String
        var deviceID: String
        /// Alerts accepted (job ids) while nothing the device did had ended the activity.
        var alertJobs: [Int64] = []
        var accepted = 0
        /// The person dismissed it, or the backend ended it (an end was accepted).
        var dismissed = false
        var endAccepted = false
    }

    func run() async throws {
        try await ServerFixture.with(configure: { sim in
            sim.device.maximumActivitiesPerApp = 200
            sim.device.maximumActivitiesPerDevice = 200
            sim.device.hourlyBudget = 1_000_000
        }, server: { [seed] c in
            c.randomSeed = seed
            // Every activity of the soak (and their replacements) lives on the fixture's one phone:
            // the per-installation quota (docs/security.md, 20 by default) is not what it tests.
            c.quotas.liveActivitiesPerInstallation = 100_000
            c.retryBase = 0.5
            c.retryMaximumDelay = 8
            c.sweepInterval = .milliseconds(100)
            c.concurrency = 16
        }) { f in
            var random = SeededRandom(seed: seed)
            var models: [Model] = []
            for i in 0..<activityCount {
                let (a, id) = try await f.appStartsActivity(key: "soak-\(i)")
                models.append(Model(isleID: id, deviceID: a.id))
            }
            let started = ContinuousClock.now
            var step = 0
            var restarted = false
            var counts: [String: Int] = [:]
            // Indices of activities that are still live on both sides; one that ends or is
            // dismissed is replaced by a new one, so the run keeps `activityCount` in play.
            var live = Array(models.indices)
            func replace(_ i: Int) async throws {
                live.removeAll { $0 == i }
                guard models.count < 180 else { return }
                let (a, id) = try await f.appStartsActivity(key: "soak-\(models.count)")
                models.append(Model(isleID: id, deviceID: a.id))
                live.append(models.count - 1)
            }
            while ContinuousClock.now - started < duration, step < 20_000, !live.isEmpty {
                step += 1
                let i = live[Int.random(in: 0..<live.count, using: &random)]
                let roll = Int.random(in: 0..<100, using: &random)
                var op = ""
                switch roll {
                case 0..<40:
                    op = "update"
                    let r = try await f.call("POST", "/v1/activities/\(models[i].isleID)/update", key: f.backendKey, body: ["contentState": Pizza.state("s\(step)")])
                    if r.status == 202 { models[i].accepted += 1 }
                case 40..<60:
                    op = "alert"
                    let r = try await f.call("POST", "/v1/activities/\(models[i].isleID)/update", key: f.backendKey, body: [
                        "contentState": Pizza.state("a\(step)"), "alert": ["title": "Update", "body": .string("alert \(step)")],
                    ])
                    if r.status == 202, let job = r.json["jobs"]?.arrayValue?.first?.numberValue?.int64Value {
                        models[i].accepted += 1
                        models[i].alertJobs.append(job)
                    }
                case 60..<68:
                    op = "503"
                    f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: Int.random(in: 1...3, using: &random)))
                case 68..<72:
                    op = "429"
                    f.sim.apns.addFailure(FailureRule(status: 429, reason: "TooManyRequests", remaining: Int.random(in: 1...2, using: &random)))
                case 72..<79:
                    op = "latency"
                    f.sim.apns.addFailure(FailureRule(status: nil, remaining: Int.random(in: 1...5, using: &random), latencyMilliseconds: Int.random(in: 20...120, using: &random)))
                case 79..<82:
                    op = "goaway"
                    f.sim.apns.addFailure(FailureRule(status: nil, remaining: 1, goAway: true))
                case 82..<90:
                    // The device rotates the token (the old one answers 410 from now on), often
                    // while a push to it is in flight; the app reports it a moment later.
                    op = "rotate"
                    guard try f.deviceActivity(models[i].deviceID)?.state.isOngoing == true, !models[i].endAccepted else { break }
                    let token = try f.sim.world.rotateUpdateToken(activityID: models[i].deviceID, on: f.device)
                    _ = try await f.call("PUT", "/v1/activities/\(models[i].isleID)/token", key: f.deviceKey, body: ["token": .string(token)], headers: f.secretHeader())
                case 90..<92:
                    op = "dismiss"
                    guard !models[i].dismissed, try f.deviceActivity(models[i].deviceID)?.state.isVisible == true else { break }
                    try f.sim.world.userDismiss(activityID: models[i].deviceID, on: f.device)
                    models[i].dismissed = true
                    _ = try await f.call("POST", "/v1/activities/\(models[i].isleID)/dismissed", key: f.deviceKey, headers: f.secretHeader())
                    try await replace(i)
                case 92..<94:
                    op = "end"
                    let r = try await f.call("POST", "/v1/activities/\(models[i].isleID)/end", key: f.backendKey, body: [:])
                    if r.status == 202 { models[i].endAccepted = true }
                    try await replace(i)
                default:
                    op = "tick"
                    f.clock.advance(by: Double(Int.random(in: 1...3, using: &random)))
                }
                counts[op, default: 0] += 1
                if !restarted, ContinuousClock.now - started > duration / 2 {
                    // A hard stop mid-burst: sends in flight are cut, nothing is drained.
                    restarted = true
                    counts["restart", default: 0] += 1
                    await f.kill()
                    try await f.start()
                }
            }
            let accepted = models.map(\.accepted).reduce(0, +)
            print("fault soak: \(step) operations, \(accepted) updates accepted over \(models.count) activities: \(counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")

            // Faults stop; time moves on until the queue is empty.
            f.sim.apns.clearFailures()
            let store = try SQLiteStore(path: f.databasePath)
            do {
                try await eventually(within: .seconds(90), "the queue drained") {
                    let c = try await store.jobCounts()
                    if (c[.queued] ?? 0) + (c[.claimed] ?? 0) + (c[.scheduled] ?? 0) == 0 { return true }
                    f.clock.advance(by: 2)
                    return false
                }
            } catch {
                Issue.record("the queue did not drain: \(try await store.jobCounts())")
            }
            try await check(f, store: store, models: models)
        }
    }

    func check(_ f: ServerFixture, store: SQLiteStore, models: [Model]) async throws {
        let device = try f.sim.world.device(f.device)
        let counts = try await store.jobCounts()
        // Nothing accepted is lost: every job finished, none failed.
        #expect(counts[.failed] == nil, "failed jobs: \(counts)")
        // The phone never dropped a push as older.
        let older = device.events.filter { $0.outcome?.code == .olderTimestamp }
        #expect(older.isEmpty, "dropped as older: \(older.map(\.message))")
        let applied = Set(device.events.filter { $0.outcome?.code == .applied || $0.outcome?.code == .ended }.compactMap(\.apnsID))
        for m in models {
            let view = try await f.call("GET", "/v1/activities/\(m.isleID)", key: f.backendKey).json
            let shown = try #require(device.activities.first { $0.id == m.deviceID })
            // The server's record equals the phone's: state, and content while the phone shows it
            // (a dismissed activity shows nothing; a push can land between the dismissal and its
            // report, which only the phone sees).
            #expect(shown.state == .dismissed || view["contentState"] == shown.contentState, "activity \(m.isleID): server \(view["contentState"]?.jsonString ?? "-") phone \(shown.contentState.jsonString)")
            let expectedState: String = switch shown.state {
            case .dismissed: m.dismissed ? "dismissed" : "ended"
            case .ended: "ended"
            case .active, .stale, .pending: "active"
            }
            #expect(view["state"]?.stringValue == expectedState, "activity \(m.isleID): server \(view["state"]?.stringValue ?? "-") phone \(shown.state)")
            // Every alert accepted for an activity the person never dismissed and the backend
            // never ended reached the phone and was applied there.
            guard !m.dismissed, !m.endAccepted else { continue }
            let deliveries = view["deliveries"]?.arrayValue ?? []
            for job in m.alertJobs {
                let sent = deliveries.first { $0["jobID"]?.numberValue?.int64Value == job && $0["status"] == 200 }
                let apnsID = sent?["apnsID"]?.stringValue
                #expect(apnsID.map(applied.contains) == true, "alert job \(job) of \(m.isleID) not shown")
            }
        }
    }
}
