import Foundation
import IsleCore
import IsleDelivery
import IsleHTTPAPI
import IsleStore
import IsleWire

/// An activity the backend's last push may not have reached is sent the backend's latest content,
/// as an update of Isle's own (no alert): a topic's late follower, and an activity whose token
/// changed by itself. Both run after the API answered; a failure is logged, and the backend's next
/// push reaches the activity.
struct LatestContent {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any TopicRepository & DeliveryHistory & JobOperations & JobIntake

    /// The content of the first open topic the activity follows that has one, and when the topic
    /// last pushed.
    func topicContent(of a: ActivityRecord) async throws -> (content: JSONObject, pushedAt: Date?, topic: String)? {
        for name in a.topics {
            guard let topic = try await store.topic(bundleID: a.bundleID, topic: name), topic.endedAt == nil,
                  let content = topic.lastContent?.objectValue else { continue }
            return (content, topic.lastPushAt, name)
        }
        return nil
    }

    /// An activity that starts following an open topic (by token) after the topic's last update —
    /// an app that started it while offline, or just later — gets that update's content, queued
    /// as an update of its own (no alert, Isle's priority): the backend's next update may be an
    /// hour away. Nothing is queued when the content is what the app registered.
    func catchUp(_ a: ActivityRecord) async {
        guard a.updateToken != nil, !a.topics.isEmpty else { return }
        do {
            guard let latest = try await topicContent(of: a), JSONValue.object(latest.content) != a.content else { return }
            try await ActivityPushes(services: services, store: store).resend(latest.content, to: a, priority: nil)
            services.logger.debug("a new follower of a topic catches up with its latest content", metadata: ["activity": "\(a.id)", "topic": "\(latest.topic)"])
        } catch {
            services.logger.warning("could not bring a new follower up to its topic's latest content; the topic's next update reaches it", metadata: ["activity": "\(a.id)", "error": "\(error)"])
        }
    }

    /// The activity's token changed by itself: a push sent to the old one just before — held by
    /// APNs, stored for an offline phone, in flight — may never reach the activity (APNs answered
    /// 200 for it), and a push sent to it after the change failed (410, or refused while the
    /// activity was unreachable). So the backend's latest goes again to the new token, without an
    /// alert: a topic follower's topic's latest content; else the content of the newest push that
    /// failed since the last one went; else the record's (what the last push carried) — at the
    /// priority that push asked for or went with (the budget still decides). A failed end goes as
    /// an end. The phone shows what the backend last sent, whatever became of that push. Nothing is sent when no push went yet, or when one
    /// is still queued for it (it carries newer content to the new token).
    func refresh(_ a: ActivityRecord) async {
        guard a.state == .active, let lastSent = a.lastTimestamp, let recorded = a.content?.objectValue else { return }
        do {
            // A push still queued for it carries newer content to the new token anyway.
            guard try await store.openJobs(bundleID: a.bundleID, activityID: a.id, limit: 1).isEmpty else { return }
            let pushes = ActivityPushes(services: services, store: store)
            // The pushes APNs answered lately, newest last; a failed job accepted after the last
            // one APNs took (job ids grow with acceptance) carries newer content than the record.
            let answered = try await store.deliveries(activityID: a.id, before: nil, limit: 20)
            let lastTaken = answered.last { $0.status == 200 }?.jobID ?? 0
            var content = recorded
            var priority: PriorityNumber? = answered.last?.priority == .high ? .high : nil
            var failedAt: Date?
            if let failed = try await store.failedJobs(activityID: a.id, limit: 1).first, failed.id > lastTaken,
               let p = failed.payload.liveActivity, p.event == .update || p.event == .end {
                priority = DeliveryPlanner.wantsHighPriority(failed) ? .high : nil
                if p.event == .end {
                    try await pushes.resend(p.contentState?.objectValue ?? recorded, to: a, priority: priority, end: true, dismissalDate: p.dismissalDate)
                    services.logger.info("an activity's new token gets the end that failed on its old one", metadata: ["activity": "\(a.id)", "job": "\(failed.id)"])
                    return
                }
                content = p.contentState?.objectValue ?? recorded
                failedAt = failed.createdAt
            }
            // A topic's follower: the topic's updates skipped it while it was unreachable, so the
            // topic's latest content — when pushed after what the activity last took and after the
            // failed push — is the backend's newest for it.
            if let latest = try await topicContent(of: a), let pushedAt = latest.pushedAt,
               pushedAt.timeIntervalSince1970 >= Double(lastSent) || failedAt != nil, failedAt.map({ pushedAt >= $0 }) ?? true {
                content = latest.content
            }
            try await pushes.resend(content, to: a, priority: priority)
            if failedAt != nil || content != recorded {
                services.logger.info("an activity's new token gets content newer than its old token last took", metadata: ["activity": "\(a.id)"])
            }
        } catch {
            services.logger.warning("could not send an activity's latest content to its new token; the backend's next push reaches it", metadata: ["activity": "\(a.id)", "error": "\(error)"])
        }
    }
}
