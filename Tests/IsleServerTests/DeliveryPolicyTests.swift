import Foundation
import IsleCore
import IsleServer
import IsleStore
import IsleDelivery
import Testing

/// The delivery policy as pure values: no sockets, no database, a fixed clock and a seeded random
/// source. (docs/server.md, "Delivery semantics")
@Suite("Delivery policy: planner, resolver, app circuit")
struct DeliveryPolicyTests {
    static let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    static let app = AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", frequentUpdatesDeclared: true, createdAt: t0)

    /// A claimed job of `aps` (read as a stored job's is, ``JobPayload/init(kind:aps:acceptedAt:)``),
    /// with an alert when `alert`.
    static func claimed(_ kind: PushJobKind = .update, aps: JSONObject = ["event": "update", "content-state": ["x": 1]], alert: Bool = false, priority: PushPriority? = nil,
                        activity: ActivityRecord? = activity(), created: Date = t0) -> ClaimedJob {
        var aps = aps
        if alert { aps["alert"] = ["title": "Ping", "body": "An alert"] }
        let job = PushJob(id: 1, bundleID: app.bundleID, kind: kind, activityID: activity?.id, installationID: "i1", channelID: nil, payload: try! JobPayload(kind: kind, aps: aps, acceptedAt: created),
                          requestedPriority: priority, runAt: created, state: .claimed, attempts: 1, claimedBy: "w", claimedUntil: nil, lastError: nil, createdAt: created,
                          lane: activity.map { "a:" + $0.id }, seq: 1)
        return ClaimedJob(job: job, timestamp: 1_767_225_601, apnsID: APNsID("0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")!, worker: "w", activity: activity)
    }

    static func activity(state: ActivityRecordState = .active, token: String? = "aabb", started: Date = t0) -> ActivityRecord {
        ActivityRecord(id: "a1", bundleID: app.bundleID, installationID: "i1", attributesType: "T", state: state, updateToken: token, startedAt: started)
    }

    let planner = DeliveryPlanner()

    @Test("an update is sent with its timestamp, keys in wire order, and the patch it makes")
    func sendsUpdate() throws {
        let c = Self.claimed(aps: ["content-state": ["x": 1], "event": "update", "stale-date": 1_767_229_200])
        guard case .send(let push, let deadline) = planner.plan(.init(job: c, app: Self.app, activity: c.activity, now: Self.t0)) else { Issue.record("not sent"); return }
        #expect(String(decoding: push.payload, as: UTF8.self) == #"{"aps":{"timestamp":1767225601,"event":"update","content-state":{"x":1},"stale-date":1767229200}}"#)
        #expect(push.priority == .low && !push.downgraded)
        #expect(push.patch?.content == ["x": 1] && push.patch?.setsStaleDate == true && push.patch?.staleDate == Date(timeIntervalSince1970: 1_767_229_200))
        // A plain update stops mattering at its stale date.
        #expect(deadline.at == Date(timeIntervalSince1970: 1_767_229_200) && deadline.why.contains("stale"))
    }

    @Test("apns-expiration by one rule: APNs stores each push as long as Isle would retry it; a No-Message-Stored broadcast stores nothing, a Most-Recent-Message one at most 8 h")
    func expiration() throws {
        let now = Self.t0.addingTimeInterval(600)
        func storeUntil(_ c: ClaimedJob, channel: ChannelRecord? = nil, installation: InstallationRecord? = nil) -> Date?? {
            guard case .send(let p, let d) = planner.plan(.init(job: c, app: Self.app, activity: c.activity, installation: installation, channel: channel, now: now)) else { return .none }
            // Never beyond the moment the server itself gives up.
            if let s = p.storeUntil { #expect(s <= d.at) }
            return .some(p.storeUntil)
        }
        // An update to a token: its stale date (it stops mattering then), else the activity's 8-hour life.
        let stale = Self.claimed(aps: ["event": "update", "content-state": ["x": 1], "stale-date": 1_767_229_200])
        #expect(storeUntil(stale) == .some(Date(timeIntervalSince1970: 1_767_229_200)))
        #expect(storeUntil(Self.claimed()) == .some(Self.t0.addingTimeInterval(8 * 3600)))
        // An end: the activity's life (the activity started an hour before the job).
        let end = Self.claimed(.end, aps: ["event": "end", "content-state": ["x": 2]], activity: Self.activity(started: Self.t0.addingTimeInterval(-3600)))
        #expect(storeUntil(end) == .some(Self.t0.addingTimeInterval(7 * 3600)))
        // Widgets and controls: the job's deadline (8 h after it was accepted).
        let inst = InstallationRecord(id: "i1", bundleID: Self.app.bundleID, widgetToken: "ccdd", updatedAt: Self.t0, controlsToken: "eeff")
        #expect(storeUntil(Self.claimed(.widgets, aps: ["content-changed": true], activity: nil), installation: inst) == .some(Self.t0.addingTimeInterval(8 * 3600)))
        #expect(storeUntil(Self.claimed(.controls, aps: ["content-changed": true], activity: nil), installation: inst) == .some(Self.t0.addingTimeInterval(8 * 3600)))
        // Broadcasts: by the channel's storage policy.
        func broadcast(_ aps: JSONObject, policy: Int) -> Date?? {
            var c = Self.claimed(.broadcast, aps: aps, activity: nil)
            c.job.channelID = "ch"
            return storeUntil(c, channel: ChannelRecord(id: "ch", bundleID: Self.app.bundleID, storagePolicy: policy, createdAt: Self.t0))
        }
        #expect(broadcast(["event": "update", "content-state": ["x": 1]], policy: 0) == .some(nil))
        #expect(broadcast(["event": "update", "content-state": ["x": 1]], policy: 1) == .some(Self.t0.addingTimeInterval(8 * 3600)))
        #expect(broadcast(["event": "update", "content-state": ["x": 1], "stale-date": 1_767_229_200], policy: 1) == .some(Date(timeIntervalSince1970: 1_767_229_200)))
        #expect(broadcast(["event": "end", "content-state": ["x": 1]], policy: 1) == .some(Self.t0.addingTimeInterval(8 * 3600)))
    }

    @Test("priority: 10 for an alert or when asked; over the hourly budget it is downgraded; frequent updates raise the budget")
    func priority() {
        let c = Self.claimed(alert: true)
        func plan(used: Int, frequent: Bool) -> (Int, Bool)? {
            let inst = InstallationRecord(id: "i1", bundleID: Self.app.bundleID, frequentPushesEnabled: frequent, updatedAt: Self.t0)
            guard case .send(let p, _) = planner.plan(.init(job: c, app: Self.app, activity: c.activity, installation: inst, highPriorityUsed: used, now: Self.t0)) else { return nil }
            return (p.priority.rawValue, p.downgraded)
        }
        #expect(plan(used: 0, frequent: false)! == (10, false))
        #expect(plan(used: 15, frequent: false)! == (5, true))
        #expect(plan(used: 15, frequent: true)! == (10, false))
        #expect(plan(used: 120, frequent: true)! == (5, true))
    }

    @Test("drop, fail, wait: ended, past 8 hours, deadline passed, no token yet")
    func notSent() {
        let ended = Self.activity(state: .dismissed)
        #expect(planner.plan(.init(job: Self.claimed(activity: ended), app: Self.app, activity: ended, now: Self.t0)) == .drop("the activity is dismissed", nil))
        let old = Self.activity(started: Self.t0.addingTimeInterval(-8 * 3600))
        guard case .drop(let why, let patch) = planner.plan(.init(job: Self.claimed(activity: old), app: Self.app, activity: old, now: Self.t0)) else { Issue.record("not dropped"); return }
        #expect(why.contains("8-hour") && patch?.end?.at == Self.t0)
        // Accepted 9 hours ago with a fresh activity: the job's own deadline (8 h) passed.
        let late = Self.claimed(alert: true, created: Self.t0.addingTimeInterval(-9 * 3600))
        guard case .fail(let reason) = planner.plan(.init(job: late, app: Self.app, activity: late.activity, now: Self.t0)) else { Issue.record("not failed"); return }
        #expect(reason.contains("deadline"))
        let starting = Self.activity(state: .starting, token: nil)
        #expect(planner.plan(.init(job: Self.claimed(activity: starting), app: Self.app, activity: starting, now: Self.t0))
            == .wait(until: Self.t0.addingTimeInterval(30), "waiting for the device to hand over the activity's update token"))
    }

    @Test("outcomes: sent, retried with backoff until the deadline, dead token, paused app, suspect token, failed")
    func resolver() {
        let r = OutcomeResolver(retryBase: 1, retryMaximumDelay: 900)
        let d = DeliveryPlanner.Deadline(at: Self.t0.addingTimeInterval(3600), why: "the activity's 8-hour life")
        var random = SeededRandom(seed: 42)
        func resolve(_ o: OutcomeResolver.Outcome, attempt: Int = 1, confirmed: Bool = true) -> OutcomeResolver.Resolution {
            r.resolve(o, attempt: attempt, deadline: d, now: Self.t0, environmentConfirmed: confirmed, random: &random)
        }
        #expect(resolve(.accepted) == .sent)
        guard case .retry(let at, _) = resolve(.rejected(status: 503, reason: .serviceUnavailable, retryAfter: nil)) else { Issue.record("no retry"); return }
        #expect(at > Self.t0 && at <= Self.t0.addingTimeInterval(1))
        // The cap: never more than 15 minutes between tries, however many there were.
        guard case .retry(let capped, _) = resolve(.unreachable("timedOut", configuration: false), attempt: 30) else { Issue.record("no retry"); return }
        #expect(capped <= Self.t0.addingTimeInterval(900) && capped >= Self.t0.addingTimeInterval(450))
        // Retry-After is honoured.
        guard case .retry(let after, _) = resolve(.rejected(status: 429, reason: .tooManyRequests, retryAfter: 120)) else { Issue.record("no retry"); return }
        #expect(after >= Self.t0.addingTimeInterval(120))
        // Past the deadline, the next try cannot matter: failed with the reason.
        let tight = DeliveryPlanner.Deadline(at: Self.t0.addingTimeInterval(0.1), why: "the update's stale date")
        guard case .fail(let why) = r.resolve(.rejected(status: 500, reason: .internalServerError, retryAfter: nil), attempt: 3, deadline: tight, now: Self.t0,
                                               environmentConfirmed: true, random: &random) else { Issue.record("not failed"); return }
        #expect(why.contains("stale date") && why.contains("InternalServerError"))
        #expect(resolve(.rejected(status: 410, reason: .unregistered, retryAfter: nil)) == .deadToken(why: "410 Unregistered"))
        // A pause says what is wrong and what to do.
        guard case .pauseApp(let invalid) = resolve(.rejected(status: 403, reason: .invalidProviderToken, retryAfter: nil)) else { Issue.record("InvalidProviderToken does not pause"); return }
        #expect(invalid.contains("403 InvalidProviderToken") && invalid.contains("isle app add") && invalid.contains("--key-id"), "\(invalid)")
        guard case .pauseApp(let topic) = resolve(.rejected(status: 400, reason: .topicDisallowed, retryAfter: nil)) else { Issue.record("TopicDisallowed does not pause"); return }
        #expect(topic.contains("400 TopicDisallowed") && topic.contains("bundle id"), "\(topic)")
        // An ExpiredProviderToken that reaches the decision was refused after a fresh token: a clock behind.
        guard case .pauseApp(let expired) = resolve(.rejected(status: 403, reason: .expiredProviderToken, retryAfter: nil)) else { Issue.record("ExpiredProviderToken does not pause"); return }
        #expect(expired.contains("403 ExpiredProviderToken") && expired.contains("clock"), "\(expired)")
        #expect(resolve(.rejected(status: 400, reason: .badDeviceToken, retryAfter: nil)) == .deadToken(why: "400 BadDeviceToken"))
        guard case .suspectToken = resolve(.rejected(status: 400, reason: .badDeviceToken, retryAfter: nil), confirmed: false) else { Issue.record("not suspect"); return }
        #expect(resolve(.rejected(status: 413, reason: .payloadTooLarge, retryAfter: nil)) == .fail(why: "413 PayloadTooLarge"))
        #expect(resolve(.unreachable("tlsFailed: unknown CA", configuration: true)) == .pauseApp(why: "tlsFailed: unknown CA"))
        // One vocabulary: every reason takes its fate from IsleCore's table, unknown ones by status.
        for reason in APNsReason.allKnown {
            let status = reason.info!.status
            let fate = resolve(.rejected(status: status, reason: reason, retryAfter: nil))
            switch fate {
            case .pauseApp: #expect(reason.concernsEveryPush, "\(reason)")
            case .deadToken: #expect(reason.remedy(status: status) == .dropToken, "\(reason)")
            case .retry: #expect([.retryLater, .newProviderToken, .openNewConnection].contains(reason.remedy(status: status)), "\(reason)")
            case .fail: #expect([.fixRequest].contains(reason.remedy(status: status)) && !reason.concernsEveryPush, "\(reason)")
            case .sent, .suspectToken: Issue.record("\(reason): \(fate)")
            }
        }
        #expect(APNsReason.allKnown.filter { $0.info!.remedy == .fixConfiguration }.allSatisfy { $0.concernsEveryPush })
        #expect(resolve(.rejected(status: 410, reason: APNsReason("SomethingNew"), retryAfter: nil)) == .deadToken(why: "410 SomethingNew"))
        #expect(resolve(.rejected(status: 400, reason: APNsReason("SomethingNew"), retryAfter: nil)) == .fail(why: "400 SomethingNew"))
        guard case .retry = resolve(.rejected(status: 502, reason: nil, retryAfter: nil)) else { Issue.record("a 502 without a reason is not retried"); return }
    }

    @Test("the jitter is reproducible from the seed and stays in [½, 1) of the step")
    func jitter() {
        let r = OutcomeResolver(retryBase: 2, retryMaximumDelay: 900)
        var a = SeededRandom(seed: 7), b = SeededRandom(seed: 7)
        let xs = (1...12).map { r.backoff(attempt: $0, random: &a) }
        #expect(xs == (1...12).map { r.backoff(attempt: $0, random: &b) })
        for (i, x) in xs.enumerated() {
            let step = min(900, 2 * pow(2, Double(i)))
            #expect(x >= step / 2 && x < step)
        }
    }

    @Test("circuit: a configuration error pauses the app; probes double; an accepted push resumes it")
    func pause() {
        var c = AppCircuit()
        #expect(c.admits(Self.t0))
        #expect(c.record(.configuration("403 InvalidProviderToken"), now: Self.t0) == .paused(until: Self.t0.addingTimeInterval(30), reason: "403 InvalidProviderToken"))
        #expect(!c.admits(Self.t0.addingTimeInterval(29)) && c.admits(Self.t0.addingTimeInterval(30)))
        // The probe fails again: twice as long.
        guard case .paused(let until, _) = c.record(.configuration("403 InvalidProviderToken"), now: Self.t0.addingTimeInterval(30)) else { Issue.record("not paused"); return }
        #expect(until == Self.t0.addingTimeInterval(90))
        #expect(c.record(.accepted(.sandbox), now: Self.t0.addingTimeInterval(91)) == .resumed)
        #expect(c.mode == .running)
    }

    @Test("circuit: APNs failing again and again backs off; BadDeviceToken for many tokens before any success pauses")
    func backoffAndEnvironment() {
        var c = AppCircuit()
        for _ in 0..<4 { #expect(c.record(.unavailable("503"), now: Self.t0) == .none) }
        guard case .backingOff(let until, _) = c.record(.unavailable("503"), now: Self.t0) else { Issue.record("no backoff"); return }
        #expect(until == Self.t0.addingTimeInterval(1))
        guard case .backingOff(let again, _) = c.record(.unavailable("503"), now: Self.t0.addingTimeInterval(1)) else { Issue.record("no backoff"); return }
        #expect(again == Self.t0.addingTimeInterval(3))
        // A 410 (or any answer below 500 that is not about the app's set-up) shows APNs is
        // reachable: the back-off ends, and the next 503s start counting from zero.
        #expect(c.record(.reachable, now: Self.t0.addingTimeInterval(2)) == .resumed && c.mode == .running)
        #expect(c.record(.reachable, now: Self.t0.addingTimeInterval(2)) == .none)
        for _ in 0..<4 { #expect(c.record(.unavailable("503"), now: Self.t0.addingTimeInterval(2)) == .none) }
        guard case .backingOff(let fresh, _) = c.record(.unavailable("503"), now: Self.t0.addingTimeInterval(2)) else { Issue.record("no backoff"); return }
        #expect(fresh == Self.t0.addingTimeInterval(3), "the first back-off again, not a doubled one")
        // A configuration pause is not ended by a reachable APNs.
        var paused = AppCircuit()
        _ = paused.record(.configuration("403 InvalidProviderToken"), now: Self.t0)
        #expect(paused.record(.reachable, now: Self.t0) == .none)
        guard case .paused = paused.mode else { Issue.record("the pause ended"); return }

        var env = AppCircuit()
        for i in 0..<4 { #expect(env.record(.badDeviceToken(token: "t\(i)", environment: .production, installation: "i\(i)"), now: Self.t0) == .none) }
        #expect(env.record(.badDeviceToken(token: "t0", environment: .production, installation: "i0"), now: Self.t0) == .none)  // the same token again is not more evidence
        // One installation's many tokens are one piece of evidence (the device key is public: one
        // copy of the app must not pause the app), and a token with no installation is none.
        for i in 10..<20 { #expect(env.record(.badDeviceToken(token: "t\(i)", environment: .production, installation: "i0"), now: Self.t0) == .none) }
        for i in 20..<30 { #expect(env.record(.badDeviceToken(token: "t\(i)", environment: .production, installation: nil), now: Self.t0) == .none) }
        // Evidence is counted per environment: a sandbox token adds nothing to production's.
        #expect(env.record(.badDeviceToken(token: "s0", environment: .sandbox, installation: "i9"), now: Self.t0) == .none)
        guard case .paused(_, let why) = env.record(.badDeviceToken(token: "t4", environment: .production, installation: "i4"), now: Self.t0) else { Issue.record("not paused"); return }
        #expect(why.contains("environment") && why.contains("production"))
        // Once a push was accepted, BadDeviceToken is about the token, not the app.
        var ok = AppCircuit()
        _ = ok.record(.accepted(.sandbox), now: Self.t0)
        for i in 0..<10 { #expect(ok.record(.badDeviceToken(token: "t\(i)", environment: .sandbox, installation: "i\(i)"), now: Self.t0) == .none) }
        #expect(ok.environmentConfirmed(.sandbox))
        // Sandbox works, production's tokens fail: the app's credentials are right, so production's
        // failures never pause the app (sandbox keeps sending); production stays unconfirmed, so
        // its BadDeviceTokens are kept and retried rather than taken as dead tokens.
        for i in 0..<10 { #expect(ok.record(.badDeviceToken(token: "p\(i)", environment: .production, installation: "i\(i)"), now: Self.t0) == .none) }
        #expect(!ok.environmentConfirmed(.production) && ok.mode == .running)
    }
}
