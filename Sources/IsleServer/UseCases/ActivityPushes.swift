import Foundation
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery
import IsleWire

/// Queueing an update or end for activities: the one path the API (`POST /v1/activities/…/update`,
/// by key, by topic) and the console's compose form share, so their rules cannot drift apart.
struct ActivityPushes {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any JobIntake

    struct Prepared {
        var jobs: [NewPushJob]
        /// The ids of the targets that still take pushes (a fan-out's jobs name them already: empty).
        var live: [String]
        /// The validator's warnings, as the API reports them.
        var warnings: [JSONValue]
        var runAt: Date
    }

    /// Validates `push` once per attributes type against the app's schema, refuses a single
    /// target that no longer takes pushes (409 `activityNotLive`), and builds one job per live
    /// target. Nothing is written.
    func prepare(bundleID: String, push: ActivityPush, to activities: [ActivityRecord], single: Bool, now: Date) async throws -> Prepared {
        let app = try await services.app(bundleID)
        let runAt = max(push.sendAt ?? now, now)
        // One payload, typed, ordered and encoded once, for every target.
        let template = NewPushJob(bundleID: bundleID, kind: push.event == .end ? .end : .update, payload: push.payload(acceptedAt: now),
                                  requestedPriority: push.priority, runAt: runAt)
        var warnings: [JSONValue] = []
        var checked: Set<String> = []
        for a in activities where !checked.contains(a.attributesType) {
            checked.insert(a.attributesType)
            warnings += try PayloadCheck(now: now).validate(template, schema: app.schema(a.attributesType))
        }
        if single, let a = activities.first, !a.state.acceptsPushes {
            throw APIError(.conflict, "activityNotLive", "the activity is \(a.state.rawValue)\(a.stateReason.map { ": \($0)" } ?? ""); Isle sends nothing more to it")
        }
        // An activity started with pushType .channel has no token of its own: its channel (or
        // its topic) reaches it, a push by id or key cannot.
        let onChannel = { (a: ActivityRecord) in a.updateToken == nil && a.channelID != nil && a.state.acceptsPushes }
        if single, let a = activities.first(where: onChannel), activities.filter(\.state.acceptsPushes).allSatisfy(onChannel) {
            throw APIError(.conflict, "activityOnChannel", "the activity gets its updates from broadcast channel \(a.channelID!)\(a.topics.first.map { " (topic \($0))" } ?? ""): update the topic (POST /v1/topics/{topic}/update) or the channel (POST /v1/channels/{channel}/update)")
        }
        let jobs = activities.lazy.filter { $0.state.acceptsPushes && !(single && onChannel($0)) }.map { template.forActivity($0.id) }
        return Prepared(jobs: Array(jobs), live: single ? jobs.compactMap(\.activityID) : [], warnings: warnings, runAt: runAt)
    }

    /// Queues `content` again for one activity, as an update of Isle's own (no alert; `priority`
    /// asked, else Isle's) — or as an end, with its dismissal date: a late topic follower's
    /// catch-up, a rotated token's refresh.
    func resend(_ content: JSONObject, to a: ActivityRecord, priority: PriorityNumber?, end: Bool = false, dismissalDate: Date? = nil) async throws {
        let push = try ActivityPush(event: end ? .end : .update, contentState: content, alert: nil, staleDate: nil, relevanceScore: nil, dismissalDate: end ? dismissalDate : nil,
                                    priority: priority, sendAt: nil)
        let now = services.clock.now
        _ = try await commit(try await prepare(bundleID: a.bundleID, push: push, to: [a], single: true, now: now), idempotency: nil, now: now)
    }

    /// Commits the jobs (with the idempotent answer, in one transaction) and wakes the engine when
    /// they come due.
    func commit(_ prepared: Prepared, idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        let ids = try await store.enqueue(TraceParent.stamped(prepared.jobs), idempotency: idempotency, now: now)
        services.engine.wake(at: prepared.runAt)
        return ids
    }
}
