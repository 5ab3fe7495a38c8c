import Foundation
import IsleCore
import IsleDelivery
import IsleHTTPAPI
import IsleStore
import Logging
import ServiceLifecycle
import Synchronization

/// Activities that outlive 8 hours (docs/server.md, "Activities that outlive 8 hours"): the system
/// ends a Live Activity 8 hours after it started, so before that (`renewalLead`) an activity the
/// backend asked to renew gets a successor, started by push-to-start on its installation with its
/// attributes and current content, under its key and topics, with the renewal's alert. When the
/// app hands back the successor's token (IsleClient does), the activity is ended with immediate
/// dismissal; the backend's by-key pushes reach whichever is live. A successor on a broadcast
/// channel never hands back a token: the activity is then ended a minute after the start. A
/// `Service`: it looks for renewals due at every sweep interval, on the server's clock.
final class Renewals: Service {
    typealias Store = RenewalRepository & ActivityRepository & InstallationRepository & JobIntake & JobOperations
    let store: any Store
    let engine: DeliveryEngine
    let configuration: ServerConfiguration
    let clock: any WallClock
    let logger: Logger
    /// Sweeps finished (``IsleServerApp``'s count, for tests).
    let sweeps = Atomic<Int>(0)

    init(store: any Store, engine: DeliveryEngine, configuration: ServerConfiguration, clock: any WallClock, logger: Logger) {
        self.store = store
        self.engine = engine
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
    }

    /// Starts the successors of the renewals due now.
    func sweep() async {
        do {
            let due = try await store.dueRenewals(now: clock.now, lifetime: DeliveryPlanner.activityLifetime, lead: configuration.renewalLead, limit: 200)
            for r in due {
                do { try await renew(r) } catch {
                    logger.warning("could not start an activity's successor; the next sweep tries again", metadata: ["activity": "\(r.activityID)", "error": "\(error)"])
                }
            }
        } catch {
            logger.log(level: .forStoreFailure(.error, error), "looking for renewals due failed; the next sweep tries again", metadata: ["error": "\(error)"])
        }
    }

    func renew(_ r: RenewalRecord) async throws {
        guard let old = try await store.activity(id: r.activityID), old.state.acceptsPushes, let installationID = old.installationID,
              let installation = try await store.installation(bundleID: old.bundleID, id: installationID) else { return }
        guard installation.pushToStartTokens[old.attributesType] != nil, installation.liveActivitiesEnabled else {
            logger.notice("an activity cannot be renewed: its installation has no push-to-start token for its type (or Live Activities are off); it ends at 8 hours",
                          metadata: ["activity": "\(old.id)"])
            return
        }
        let now = clock.now
        // The successor's id is named first: a sweep on another instance (or after a crash) starts
        // the same one, whose second insert is refused, never a second successor.
        let successorID = try await store.setSuccessor(activityID: old.id, successorID: "act_" + UUID().uuidString.lowercased())
        let alert = try LiveActivityAlert(json: r.alert)
        // The newest content the backend asked for: an update queued for the activity now (waiting
        // for its token, say; not one scheduled for later) is newer than what it last took; else the
        // activity's last content (what the phone shows), else the renewal's. Its attributes, else
        // the renewal's.
        let queued = try await store.openJobs(bundleID: old.bundleID, activityID: old.id, limit: 100)
            .filter { $0.kind == .update && $0.state != .scheduled }.max { $0.id < $1.id }?.payload.liveActivity?.contentState
        guard let attributes = old.attributes ?? r.attributes, let content = queued ?? old.content ?? r.contentState else {
            logger.notice("an activity cannot be renewed: the server has no attributes or content for its successor", metadata: ["activity": "\(old.id)"])
            return
        }
        var payload = LiveActivityPayload(event: .start, timestamp: now, contentState: content, alert: alert, attributesType: old.attributesType,
                                          attributes: attributes, inputPushToken: old.channelID == nil, inputPushChannel: old.channelID)
        payload.relevanceScore = old.relevanceScore
        let successor = ActivityRecord(id: successorID, bundleID: old.bundleID, externalKey: old.externalKey, installationID: installationID, attributesType: old.attributesType,
                                       attributes: attributes, content: content, state: .starting, channelID: old.channelID, relevanceScore: old.relevanceScore,
                                       startedAt: now, topics: old.topics, environment: old.environment)
        var start = NewPushJob(bundleID: old.bundleID, kind: .start, activityID: successorID, payload: .liveActivity(payload), requestedPriority: .high, runAt: now)
        start.installationID = installationID
        var jobs = [start]
        if old.channelID != nil {
            // No token comes back from a start on a channel: the old one ends a minute after.
            jobs.append(NewPushJob(bundleID: old.bundleID, kind: .end, activityID: old.id, payload: .end(old.content, dismissalDate: now.addingTimeInterval(60), at: now),
                                   runAt: now.addingTimeInterval(60)))
        }
        do {
            _ = try await store.enqueue(TraceParent.stamped(jobs), creating: [successor], idempotency: nil, now: now)
        } catch let e as StoreError where e.code == .conflict {
            return  // started already
        }
        try await store.putRenewal(RenewalRecord(activityID: successorID, bundleID: old.bundleID, renewUntil: r.renewUntil, alert: r.alert, createdAt: now, predecessorID: old.id),
                                   idempotency: nil)
        engine.wake()
        logger.info("started an activity's successor before its 8-hour end", metadata: ["activity": "\(old.id)", "successor": "\(successorID)"])
    }

    /// The successor's token is back (it is live): its predecessor ends now, dismissed at once.
    func successorLinked(_ successor: ActivityRecord) async throws {
        guard let r = try await store.renewal(activityID: successor.id), let previous = r.predecessorID,
              let old = try await store.activityForPush(id: previous), old.state.acceptsPushes else { return }
        let now = clock.now
        let end = NewPushJob(bundleID: old.bundleID, kind: .end, activityID: old.id, payload: .end(nil, dismissalDate: now, at: now), runAt: now)
        _ = try await store.enqueue(TraceParent.stamped([end]), idempotency: nil, now: now)
        engine.wake()
    }

    func run() async throws {
        await cancelWhenGracefulShutdown {
            // Every second (the renewals table is small): a successor is started within a second of
            // its time, on the server's clock.
            while !Task.isCancelled {
                try? await Task.sleep(for: min(.seconds(1), self.configuration.sweepInterval))
                if Task.isCancelled { break }
                await self.sweep()
                self.sweeps.add(1, ordering: .relaxed)
            }
        }
    }
}
