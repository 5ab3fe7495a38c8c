import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery

/// Installations: the device registers itself (tokens, enablement), the backend binds its user,
/// starts activities by push (one installation or all of a user's) and reloads widgets.
struct InstallationController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any InstallationRepository & ActivityRepository & TopicRepository & JobIntake

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.put("installations/:installation", use: register)
        v1.delete("installations/:installation", use: delete)
        v1.put("installations/:installation/user", use: bindUser)
        v1.post("installations/:installation/start") { request, context in
            let caller = try context.caller(.backend)
            let id = try context.parameters.decoded("installation")
            return try await start(request, context, caller) { [try await services.ownInstallation(caller, id)] }
        }
        v1.post("users/:user/start") { request, context in
            let caller = try context.caller(.backend)
            let user = try context.parameters.decoded("user")
            return try await start(request, context, caller) {
                let all = try await store.installations(bundleID: caller.bundleID, userID: user)
                guard !all.isEmpty else { throw APIError.notFound("installations of user \(user)") }
                return all
            }
        }
        // An audience: every installation following the topic (its reported topics).
        v1.post("topics/:topic/start") { request, context in
            let caller = try context.caller(.backend)
            let topic = try TopicController.name(context)
            return try await start(request, context, caller, topic: topic) {
                let all = try await store.installations(bundleID: caller.bundleID, topic: topic)
                guard !all.isEmpty else { throw APIError(.notFound, "notFound", "no installation follows the topic \(topic) (the app reports the topics it follows in PUT /v1/installations/{id}, topics)", field: "topic") }
                return all
            }
        }
        v1.post("installations/:installation/widgets/reload", use: reloadWidgets)
        v1.post("installations/:installation/controls/reload", use: reloadControls)
    }

    /// `PUT /v1/installations/{id}` (device key). The first registration answers the installation's
    /// secret, once; every later one must present it.
    @Sendable func register(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let id = try Limits.pathID(try context.parameters.decoded("installation"), "installation")
        let report = try InstallationReport(try await Body.object(request))
        // A ticket from the backend may name the installation's user (the device's word alone never does).
        var ticketUser: String?
        if let text = report.ticket {
            let app = try await services.app(caller.bundleID)
            let ticket: RegistrationTicket
            do { ticket = try RegistrationTicket.verify(text, app: app, now: services.clock.now) } catch { throw error.apiError() }
            guard let user = ticket.userID else { throw APIError(.forbidden, "invalidTicket", "the ticket names no user", field: "ticket") }
            if let bound = ticket.installationID, bound != id { throw APIError(.forbidden, "invalidTicket", "the ticket is for another installation", field: "ticket") }
            let others = try await store.installations(bundleID: caller.bundleID, userID: user).filter { $0.id != id }
            guard others.count < services.configuration.quotas.installationsPerUser else {
                throw APIError(.conflict, "tooManyInstallations", "user \(user) has \(others.count) installations, the most Isle keeps per user", field: "ticket")
            }
            ticketUser = user
        }
        let userFromTicket = ticketUser
        let presented = request.headers[InstallationSecret.header]
        // A new installation counts against its address's hourly allowance (registering is free to
        // anyone holding the app); a known one's reports do not.
        if try await store.installation(bundleID: caller.bundleID, id: id) == nil { try services.newInstallations.take(context.remoteAddress ?? "unknown") }
        let newSecret = InstallationSecret.make()
        let newHash = InstallationSecret.hash(newSecret)
        let now = services.clock.now
        let bundleID = caller.bundleID
        // Read, change and write in one transaction (with the idempotent answer): two reports
        // never undo each other. The stored answer never holds the secret (a replay is answered to
        // anyone who repeats the request): an app that loses this answer registers anew under a
        // new installation id.
        let inst = try await store.modifyInstallation(bundleID: bundleID, id: id, create: { InstallationRecord(id: id, bundleID: bundleID, updatedAt: now) }, { inst in
            guard inst.bundleID == bundleID else { throw APIError.notFound("installation \(id)") }
            // The first registration sets the secret: the one the app chose and presents (then a
            // lost answer loses nothing), or else one made here and answered once. (An
            // installation from before secrets existed gets one at its next registration.)
            if inst.secretHash == nil {
                if let presented, !presented.isEmpty {
                    guard InstallationSecret.acceptable(presented) else {
                        throw APIError(.badRequest, "invalidInstallationSecret", "a new installation's Isle-Installation-Secret must be 32 to 200 printable ASCII characters (or leave it out and keep the secret the answer holds)", field: "Isle-Installation-Secret")
                    }
                    inst.secretHash = InstallationSecret.hash(presented)
                } else {
                    inst.secretHash = newHash
                }
            } else {
                try InstallationSecret.check(presented, of: inst)
            }
            report.apply(to: &inst, now: now)
            if let userFromTicket { inst.userID = userFromTicket }
        }, idempotency: context.idempotentAnswer(.ok, Views.installation))
        // The secret is shown once: the app keeps it (the Keychain) and sends it with every later call.
        return JSONResponse.make(API.InstallationRegistration(installation: Views.installation(inst), installationSecret: inst.secretHash == newHash ? newSecret : nil))
    }

    /// `DELETE /v1/installations/{id}` (device key and the installation's secret): the person signed
    /// out or asked to be forgotten. Its live activities are ended (nothing more is pushed to
    /// them), its push-to-start and widget tokens and its user are dropped, and its secret is
    /// retired: no call can act for it again (the app registers a new installation). Answers how
    /// many activities were ended; a second DELETE is a 403 (the secret no longer matches).
    @Sendable func delete(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let id = try Limits.pathID(try context.parameters.decoded("installation"), "installation")
        _ = try await Body.object(request)
        let bundleID = caller.bundleID
        guard let existing = try await store.installation(bundleID: bundleID, id: id) else { throw APIError.notFound("installation \(id)") }
        guard existing.secretHash != nil else {
            throw APIError(.forbidden, "installationSecretRequired", "installation \(id) was registered before installation secrets: register it again (PUT /v1/installations/{id}) to get one, then delete it with that secret", field: "Isle-Installation-Secret")
        }
        let presented = request.headers[InstallationSecret.header]
        try InstallationSecret.check(presented, of: existing)
        let now = services.clock.now
        // A hash of a secret nobody holds: every later device call for this id is refused.
        let retired = InstallationSecret.hash(InstallationSecret.make())
        _ = try await store.modifyInstallation(bundleID: bundleID, id: id, create: { InstallationRecord(id: id, bundleID: bundleID, updatedAt: now) }, { inst in
            try InstallationSecret.check(presented, of: inst)
            inst.userID = nil
            inst.pushToStartTokens = [:]
            inst.widgetToken = nil
            inst.liveActivitiesEnabled = false
            inst.frequentPushesEnabled = false
            inst.secretHash = retired
            inst.updatedAt = now
        }, idempotency: nil)
        var ended = 0
        for a in try await store.liveActivities(bundleID: bundleID, installationID: id) {
            // One that ended meanwhile (a push, the device) is left as it is.
            if (try? await store.modifyActivity(id: a.id, { r in try ActivityLifecycle.apply(.endedByApp(at: now), to: &r) }, idempotency: nil,
                                                reportedBy: Events.Source("installationDeleted", at: now, userID: existing.userID))) != nil { ended += 1 }
        }
        if ended > 0 { services.events.ring() }
        return JSONResponse.make(API.InstallationDeletion(id: id, activitiesEnded: Int64(ended)))
    }

    /// `PUT /v1/installations/{id}/user` (backend key): the person, for push-to-start to a user's devices.
    @Sendable func bindUser(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let id = try context.parameters.decoded("installation")
        let userID = try await Body.read(API.UserBinding.self, request).userID.value?.text
        let bundleID = caller.bundleID
        let now = services.clock.now
        if let user = userID {
            let others = try await store.installations(bundleID: bundleID, userID: user).filter { $0.id != id }
            guard others.count < services.configuration.quotas.installationsPerUser else {
                throw APIError(.conflict, "tooManyInstallations", "user \(user) has \(others.count) installations, the most Isle keeps per user (isle serve --max-installations-per-user)", field: "userID")
            }
        }
        // An unknown id is created with no app, which the change refuses: nothing is written.
        let inst = try await store.modifyInstallation(bundleID: bundleID, id: id, create: { InstallationRecord(id: id, bundleID: "", updatedAt: now) }, { inst in
            // Unknown, or another app's: nothing is written.
            guard inst.bundleID == bundleID else { throw APIError.notFound("installation \(id)") }
            inst.userID = userID
        }, idempotency: context.idempotentAnswer(.ok, Views.installation))
        return JSONResponse.make(Views.installation(inst))
    }

    /// Push-to-start: records a `starting` activity for each installation that can start one and
    /// queues its start, in one transaction. With a topic (the first of `topics` that is open as an
    /// audience, or the audience's own), an installation on iOS 18 and later starts its activity on
    /// the topic's channel (`input-push-channel`); the others with `input-push-token`
    /// (docs/server.md, "Starting an audience").
    func start(_ request: Request, _ context: IsleRequestContext, _ caller: Caller, topic audience: String? = nil,
               _ targets: () async throws -> [InstallationRecord]) async throws -> Response {
        let strict = try Strictness.requested(request)
        var start = try StartRequest(try await Body.read(API.Start.self, request))
        if let audience, !start.topics.contains(audience) { start.topics.insert(audience, at: 0) }
        let app = try await services.app(caller.bundleID)
        guard let schema = app.schema(start.attributesType) else {
            throw APIError(.notFound, "unknownAttributesType", "\(caller.bundleID) has no attributes type \(start.attributesType) (names are case-sensitive); registered: \(app.schemas.map(\.attributesType).joined(separator: ", "))", field: "attributesType")
        }
        let now = services.clock.now
        try Scheduling.check(start.sendAt, now: now, deadline: services.configuration.jobDeadline)
        // A scheduled start (a match's kick-off) waits until then; the activity's life counts from it.
        let runAt = max(start.sendAt ?? now, now)
        // One payload, typed and encoded once, for every installation.
        let template = NewPushJob(bundleID: caller.bundleID, kind: .start, payload: start.payload(acceptedAt: now), requestedPriority: .high, runAt: runAt)
        let warnings = try PayloadCheck(now: now).validate(template, schema: schema)
        try Strictness.enforce(warnings, strict: strict)
        let installations = try await targets()
        // The topic whose channel a start on iOS 18 joins: the audience's, else the first open one.
        var channelTopic: TopicRecord?
        for name in audience.map({ [$0] }) ?? start.topics {
            if let t = try await store.topic(bundleID: caller.bundleID, topic: name), t.endedAt == nil {
                channelTopic = t
                break
            }
        }
        var channels: [PushEnvironment: String] = [:]
        var jobs: [NewPushJob] = []
        var activities: [ActivityRecord] = []
        var started: [API.StartedActivity] = []
        for i in installations {
            guard i.pushToStartTokens[start.attributesType] != nil else {
                if installations.count == 1 { throw APIError(.conflict, "noPushToStartToken", "installation \(i.id) has no push-to-start token for \(start.attributesType)") }
                continue
            }
            guard i.liveActivitiesEnabled else {
                if installations.count == 1 { throw APIError(.conflict, "liveActivitiesDisabled", "the person turned Live Activities off on installation \(i.id)") }
                continue
            }
            var channel: String?
            if let channelTopic, i.broadcastChannels == true {
                let environment = i.environment ?? services.engine.clients.defaultEnvironment
                if channels[environment] == nil {
                    channels[environment] = try await services.topics.channel(app: app, topic: channelTopic, environment: environment).channelID
                }
                channel = channels[environment]
            }
            let a = ActivityRecord(id: "act_" + UUID().uuidString.lowercased(), bundleID: caller.bundleID, externalKey: start.externalKey, installationID: i.id,
                                   attributesType: start.attributesType, attributes: start.attributes, content: start.contentState, state: .starting,
                                   channelID: channel, relevanceScore: start.relevanceScore, startedAt: runAt, topics: start.topics, environment: i.environment)
            activities.append(a)
            var job = channel.map { NewPushJob(bundleID: caller.bundleID, kind: .start, activityID: a.id, payload: start.payload(acceptedAt: now, channel: $0),
                                               requestedPriority: .high, runAt: runAt) } ?? template.forActivity(a.id)
            job.installationID = i.id
            jobs.append(job)
            started.append(API.StartedActivity(activityID: a.id, installationID: i.id, channelID: channel))
        }
        guard !jobs.isEmpty else { throw APIError(.conflict, "noPushToStartToken", "none of the user's installations can start a \(start.attributesType) activity") }
        let value = API.StartAccepted(accepted: Int64(jobs.count), activities: started, warnings: Views.findings(warnings))
        // The activities, their start jobs and the idempotent answer: one transaction.
        try await store.enqueue(TraceParent.stamped(jobs), creating: activities, idempotency: context.idempotencyRecord(.accepted, value), now: now)
        services.engine.wake(at: runAt)
        return JSONResponse.make(value, status: .accepted)
    }

    /// `POST /v1/installations/{id}/widgets/reload` (backend key): a `widgets` push to the
    /// installation's widget push token.
    @Sendable func reloadWidgets(_ request: Request, context: IsleRequestContext) async throws -> Response {
        try await reload(request, context, kind: .widgets) { i in
            guard i.widgetToken != nil else { throw APIError(.conflict, "noWidgetToken", "the installation has not registered a widget push token") }
        }
    }

    /// `POST /v1/installations/{id}/controls/reload` (backend key): a `controls` push to the
    /// installation's control push token (iOS 18): its Control Center controls reload.
    @Sendable func reloadControls(_ request: Request, context: IsleRequestContext) async throws -> Response {
        try await reload(request, context, kind: .controls) { i in
            guard i.controlsToken != nil else {
                throw APIError(.conflict, "noControlsToken", "the installation has not registered a control push token (the app reports it from its ControlPushHandler, iOS 18)")
            }
        }
    }

    /// Queues a widgets or controls reload for the caller's installation, once `check` holds.
    func reload(_ request: Request, _ context: IsleRequestContext, kind: PushJobKind, check: (InstallationRecord) throws -> Void) async throws -> Response {
        let caller = try context.caller(.backend)
        let id = try context.parameters.decoded("installation")
        _ = try await Body.object(request)
        try check(try await services.ownInstallation(caller, id))
        let now = services.clock.now
        let job = NewPushJob(bundleID: caller.bundleID, kind: kind, installationID: id, payload: .widgets(WidgetPayload()), requestedPriority: .high, runAt: now)
        let ids = try await store.enqueue(TraceParent.stamped([job]), idempotency: context.idempotencyRecord(.accepted, API.Accepted(accepted: 1), jobs: true), now: now)
        services.engine.wake()
        return JSONResponse.make(API.Accepted(accepted: 1, jobs: ids), status: .accepted)
    }
}
