import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery

/// Activities: the app registers them and reports tokens, dismissals and ends (device key); the
/// backend updates and ends them — by id, by its own key, or every activity following a topic —
/// and reads them with their delivery history (backend key).
struct ActivityController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any ActivityRepository & InstallationRepository & ChannelRepository & TopicRepository & RenewalRepository & DeliveryHistory & JobIntake & JobOperations

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        // Device
        v1.post("activities", use: register)
        v1.put("activities/:activity/token", use: rotateToken)
        v1.post("activities/:activity/:report", use: report)
        // Backend: binds a device-registered activity to the backend's key.
        v1.put("activities/:activity/key", use: bindKey)
        // Backend
        for event in ActivityPush.Event.allCases {
            v1.post("activities/:activity/\(event.rawValue)") { request, context in
                let caller = try context.caller(.backend)
                let id = try context.parameters.decoded("activity")
                return try await enqueue(request, context, caller, event: event) { try await [services.ownActivityForPush(caller, id)] }
            }
            v1.post("activities/by-key/:key/\(event.rawValue)") { request, context in
                let caller = try context.caller(.backend)
                let key = try context.parameters.decoded("key")
                // Every live activity with the key: one per device after a push-to-start to a user.
                return try await enqueue(request, context, caller, event: event) {
                    let live = try await store.liveActivities(bundleID: caller.bundleID, externalKey: key)
                    if !live.isEmpty { return live }
                    guard let a = try await store.activity(bundleID: caller.bundleID, externalKey: key) else { throw APIError.notFound("activity with key \(key)") }
                    return [a]
                }
            }
            v1.post("topics/:topic/\(event.rawValue)") { request, context in
                let caller = try context.caller(.backend)
                let topic = try context.parameters.decoded("topic")
                return try await enqueueTopic(request, context, caller, topic: topic, event: event)
            }
        }
        v1.put("activities/:activity/renewal") { request, context in
            let caller = try context.caller(.backend)
            return try await renew(request, context, try await services.ownActivity(caller, try Limits.pathID(try context.parameters.decoded("activity"), "activity")))
        }
        v1.put("activities/by-key/:key/renewal") { request, context in
            let caller = try context.caller(.backend)
            let key = try context.parameters.decoded("key")
            // The newest live activity with the key (a renewal's successor, once it is live).
            var newest = try await store.liveActivities(bundleID: caller.bundleID, externalKey: key).max(by: { $0.startedAt < $1.startedAt })
            if newest == nil { newest = try await store.activity(bundleID: caller.bundleID, externalKey: key) }
            guard let a = newest else { throw APIError.notFound("activity with key \(key)") }
            return try await renew(request, context, a)
        }
        v1.delete("activities/:activity/renewal") { request, context in
            let caller = try context.caller(.backend)
            let a = try await services.ownActivity(caller, try Limits.pathID(try context.parameters.decoded("activity"), "activity"))
            _ = try await Body.object(request)
            guard try await store.renewal(activityID: a.id) != nil else { throw APIError(.notFound, "notFound", "activity \(a.id) is not being renewed") }
            var record = context.idempotency
            record?.status = 204
            try await store.deleteRenewal(activityID: a.id, idempotency: record)
            return Response(status: .noContent)
        }
        v1.get("activities", use: list)
        v1.get("activities/:activity") { request, context in
            let caller = try context.caller(.backend)
            return try await view(try await services.ownActivity(caller, try context.parameters.decoded("activity")), request: request)
        }
        v1.get("activities/by-key/:key") { request, context in
            let caller = try context.caller(.backend)
            let key = try context.parameters.decoded("key")
            guard let a = try await store.activity(bundleID: caller.bundleID, externalKey: key) else { throw APIError.notFound("activity with key \(key)") }
            return try await view(a, request: request)
        }
    }

    /// `PUT /v1/activities/{id}/renewal` (or by key): renew the live activity past its 8 hours.
    func renew(_ request: Request, _ context: IsleRequestContext, _ a: ActivityRecord) async throws -> Response {
        let settings = try await Body.read(API.RenewalSettings.self, request)
        _ = try ActivityPush.typed(settings.alert)
        let now = services.clock.now
        guard a.state.acceptsPushes else { throw APIError(.conflict, "activityNotLive", "the activity is \(a.state.rawValue); only a live activity is renewed") }
        guard settings.renewUntil > now else { throw APIError(.unprocessableContent, "renewUntilPast", "renewUntil must be in the future", field: "renewUntil") }
        guard settings.renewUntil <= now.addingTimeInterval(30 * 86_400) else {
            throw APIError(.unprocessableContent, "renewUntilTooLate", "renewUntil is at most 30 days ahead; renew again later", field: "renewUntil")
        }
        guard let installationID = a.installationID, let installation = try await store.installation(bundleID: a.bundleID, id: installationID),
              installation.pushToStartTokens[a.attributesType] != nil else {
            throw APIError(.conflict, "cannotRenew", "a successor is started by push-to-start on the activity's installation, which has no push-to-start token for \(a.attributesType) (iOS 17.2 and later; IsleClient reports it)")
        }
        // The successor is started with the activity's attributes and content: the backend's when
        // the server has none (an app registered it by token alone).
        guard let full = try await store.activity(id: a.id) else { throw APIError.notFound("activity \(a.id)") }
        let schema = try await services.app(a.bundleID).schema(a.attributesType)
        let attributes = try ActivityRegistration.checkedObject(settings.attributes.map { .object($0) }, "attributes", schema: schema?.attributes)
        let content = try ActivityRegistration.checkedObject(settings.contentState.map { .object($0) }, "contentState", schema: schema?.contentState)
        guard full.attributes != nil || attributes != nil else {
            throw APIError(.unprocessableContent, "attributesRequired", "the server has no attributes of this activity (the app registered it by its token; IsleClient never sends them): give them in attributes, for its successor", field: "attributes")
        }
        let existing = try await store.renewal(activityID: a.id)
        let record = RenewalRecord(activityID: a.id, bundleID: a.bundleID, renewUntil: settings.renewUntil, alert: settings.alert.json, createdAt: existing?.createdAt ?? now,
                                   successorID: existing?.successorID, predecessorID: existing?.predecessorID, attributes: attributes, contentState: content)
        let value = API.Renewal(activityID: a.id, renewUntil: settings.renewUntil, successorID: record.successorID, predecessorID: record.predecessorID)
        try await store.putRenewal(record, idempotency: context.idempotencyRecord(.ok, value))
        return JSONResponse.make(value)
    }

    // MARK: Device

    /// `POST /v1/activities`: an activity the app started, or the update token of one started by
    /// push. Always on a registered installation, with its secret (the device key is public); an
    /// `externalKey` only with the backend's registration ticket for it, or to link the activity
    /// the backend started on this installation by push (docs/security.md).
    @Sendable func register(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let body = try await Body.object(request)
        let r: ActivityRegistration
        do { r = try ActivityRegistration(try Body.decode(API.ActivityRegistration.self, body)) } catch let e as APIError where e.field == "installationID" && body["installationID"]?.isNull != false {
            throw APIError.invalid("installationID", "an activity is registered on an installation: register it first with PUT /v1/installations/{id} (the answer holds its secret) and send installationID here with the Isle-Installation-Secret header. IsleClient does this for you")
        }
        let installationID = r.installationID!
        guard let inst = try await store.installation(bundleID: caller.bundleID, id: installationID) else {
            throw APIError(.notFound, "notFound", "no installation \(installationID): register it first with PUT /v1/installations/{id}", field: "installationID")
        }
        try InstallationSecret.check(request.headers[InstallationSecret.header], of: inst)
        if let channelID = r.channelID, try await store.channel(id: channelID)?.bundleID != caller.bundleID {
            throw APIError(.notFound, "notFound", "\(channelID) is not a channel of \(caller.bundleID)", field: "channelID")
        }
        let app = try await services.app(caller.bundleID)
        guard app.schema(r.attributesType) != nil || app.schemas.isEmpty else {
            throw APIError(.notFound, "unknownAttributesType", "\(caller.bundleID) has no attributes type \(r.attributesType); registered: \(app.schemas.map(\.attributesType).joined(separator: ", "))", field: "attributesType")
        }
        if let token = r.token, let existing = try await store.activity(bundleID: caller.bundleID, updateToken: token), existing.state.acceptsPushes,
           existing.installationID == installationID, r.externalKey == nil || r.externalKey == existing.externalKey, existing.attributesType == r.attributesType {
            // The same installation registering its own live activity again (IsleClient does after
            // it found the server had lost its installation, and every day): the activity it has,
            // never a second row. The caller proved the installation's secret, which owns the token.
            return JSONResponse.make(Views.activity(existing))
        }
        if let token = r.token, let existing = try await store.activity(bundleID: caller.bundleID, updateToken: token), existing.state.acceptsPushes,
           existing.installationID != installationID || existing.externalKey != r.externalKey || r.externalKey == nil {
            throw APIError(.conflict, "tokenInUse", "this token is already registered to another activity", field: "token")
        }
        let (attributes, contentState) = try r.checked(app.schema(r.attributesType))
        // A push-started activity reports its update token: link it to the activity the backend
        // started on this installation with this key.
        if let key = r.externalKey, let token = r.token,
           let started = try await store.linkStartedActivity(bundleID: caller.bundleID, externalKey: key, attributesType: r.attributesType, installationID: installationID,
                                                              token: token, topics: r.topics, idempotency: context.idempotentAnswer(.ok, Views.activity)) {
            try await services.wakeLane(started.id)
            // A renewal's successor is live: its predecessor ends now.
            do { try await services.renewals.successorLinked(started) } catch {
                services.logger.warning("could not end a renewed activity's predecessor; it ends at its 8 hours", metadata: ["activity": "\(started.id)", "error": "\(error)"])
            }
            return JSONResponse.make(Views.activity(started))
        }
        // Any other key comes from the backend: its ticket names the key (and maybe the installation).
        if let key = r.externalKey {
            guard let ticketText = r.ticket else {
                // Well-formed but not authorized for that key: a 403, as for a ticket that does not name it.
                throw APIError(.forbidden, "ticketRequired", "externalKey needs a registration ticket from your backend naming it (the device key is public, so Isle never takes an order key on the device's word); or register without externalKey and let the backend bind it with PUT /v1/activities/{id}/key", field: "ticket")
            }
            let ticket: RegistrationTicket
            do { ticket = try RegistrationTicket.verify(ticketText, app: app, now: services.clock.now) } catch { throw error.apiError() }
            guard ticket.externalKey == key else { throw APIError(.forbidden, "invalidTicket", "the ticket does not name externalKey \(key)", field: "ticket") }
            if let bound = ticket.installationID, bound != installationID { throw APIError(.forbidden, "invalidTicket", "the ticket is for another installation", field: "ticket") }
        } else if r.ticket != nil {
            throw APIError(.forbidden, "invalidTicket", "a ticket binds the externalKey it names, and this registration names none: send externalKey with it", field: "ticket")
        }
        let live = try await store.liveActivityCount(bundleID: caller.bundleID, installationID: installationID)
        guard live < services.configuration.quotas.liveActivitiesPerInstallation else {
            throw APIError(.conflict, "tooManyActivities", "installation \(installationID) has \(live) live activities, the most Isle keeps per installation; end one first (POST /v1/activities/{id}/ended)")
        }
        // A backend key names one activity (or one per device, after a push-to-start to a user):
        // another installation cannot take it over.
        if let key = r.externalKey,
           try await store.liveActivities(bundleID: caller.bundleID, externalKey: key).contains(where: { $0.installationID != installationID }) {
            throw APIError(.conflict, "externalKeyInUse", "\(key) is the key of a live activity on another installation; the backend ends it first or uses another key", field: "externalKey")
        }
        // A new row counts against its address's hourly allowance.
        try services.newActivities.take(context.remoteAddress ?? "unknown")
        let a = ActivityRecord(id: "act_" + UUID().uuidString.lowercased(), bundleID: caller.bundleID, externalKey: r.externalKey, installationID: installationID,
                               attributesType: r.attributesType, attributes: attributes, content: contentState, state: .active, updateToken: r.token, channelID: r.channelID,
                               relevanceScore: r.relevanceScore, startedAt: services.clock.now, topics: r.topics,
                               environment: r.environment ?? inst.environment)
        let value = Views.activity(a)
        do {
            try await store.insertActivity(a, idempotency: context.idempotencyRecord(.created, value))
        } catch let error as StoreError where error.code == .conflict {
            // Another registration took the key between the check above and this insert.
            throw APIError(.conflict, "externalKeyInUse", "\(r.externalKey ?? "the key") is the key of a live activity on another installation; the backend ends it first or uses another key", field: "externalKey")
        }
        await LatestContent(services: services, store: store).catchUp(a)
        return JSONResponse.make(value, status: .created)
    }

    /// `PUT /v1/activities/{id}/key` (backend key): the backend binds an activity the app registered
    /// (and handed it the id of) to its own key, or unbinds it with null.
    @Sendable func bindKey(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let id = try Limits.pathID(try context.parameters.decoded("activity"), "activity")
        let key = try await Body.read(API.KeyBinding.self, request).externalKey.value?.text
        let a = try await services.ownActivity(caller, id)
        guard a.state.acceptsPushes else { throw APIError(.conflict, "activityNotLive", "the activity is \(a.state.rawValue); only a live activity gets a key") }
        if let key, try await store.liveActivities(bundleID: caller.bundleID, externalKey: key).contains(where: { $0.id != id && $0.installationID != a.installationID }) {
            throw APIError(.conflict, "externalKeyInUse", "\(key) is the key of a live activity on another installation; end it first or use another key", field: "externalKey")
        }
        let bundleID = caller.bundleID
        guard let bound = try await store.modifyActivity(id: id, { a in
            guard a.bundleID == bundleID else { throw APIError.notFound("activity \(id)") }
            a.externalKey = key
        }, idempotency: context.idempotentAnswer(.ok, Views.activity)) else { throw APIError.notFound("activity \(id)") }
        return JSONResponse.make(Views.activity(bound))
    }

    /// `PUT /v1/activities/{id}/token`: the device rotated the activity's update token.
    @Sendable func rotateToken(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let id = try context.parameters.decoded("activity")
        let token = try await Body.read(API.TokenReport.self, request).token.text
        try await checkSecret(request, activityID: id, bundleID: caller.bundleID)
        if let holder = try await store.activity(bundleID: caller.bundleID, updateToken: token), holder.id != id, holder.state.acceptsPushes {
            throw APIError(.conflict, "tokenInUse", "this token is already registered to another activity", field: "token")
        }
        let before = try await store.activityForPush(id: id)
        let bundleID = caller.bundleID
        guard let a = try await store.modifyActivity(id: id, { a in
            guard a.bundleID == bundleID else { throw APIError.notFound("activity \(id)") }
            try Self.lifecycle(.tokenRotated(token), &a)
        }, idempotency: context.idempotentAnswer(.ok, Views.activity), reportedBy: Events.Source("device", at: services.clock.now)) else { throw APIError.notFound("activity \(id)") }
        services.events.ring()
        // A job waiting for this token goes now.
        try await services.wakeLane(id)
        if let old = before?.updateToken, old != token, before?.bundleID == bundleID { await LatestContent(services: services, store: store).refresh(a) }
        return JSONResponse.make(Views.activity(a))
    }

    /// `POST /v1/activities/{id}/dismissed|ended`: what the person (or the app) did on the device.
    @Sendable func report(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let report = try context.parameters.decoded("report")
        guard report == "dismissed" || report == "ended" else { throw APIError.notFound("/v1/activities/…/\(report)") }
        let id = try context.parameters.decoded("activity")
        _ = try await Body.object(request)
        try await checkSecret(request, activityID: id, bundleID: caller.bundleID)
        let now = services.clock.now
        let bundleID = caller.bundleID
        guard let a = try await store.modifyActivity(id: id, { a in
            guard a.bundleID == bundleID else { throw APIError.notFound("activity \(id)") }
            try Self.lifecycle(report == "dismissed" ? .dismissed(at: now) : .endedByApp(at: now), &a)
        }, idempotency: context.idempotentAnswer(.ok, Views.activity), reportedBy: Events.Source("device", at: now)) else { throw APIError.notFound("activity \(id)") }
        services.events.ring()
        return JSONResponse.make(Views.activity(a))
    }

    /// Applies a device's event through ``ActivityLifecycle``; a refusal is a 409 with its code.
    static func lifecycle(_ event: ActivityLifecycle.Event, _ a: inout ActivityRecord) throws {
        do { try ActivityLifecycle.apply(event, to: &a) } catch { throw APIError(.conflict, error.code, error.message) }
    }

    /// Device calls on an activity act through its installation and that installation's secret;
    /// an activity registered without one (before trust model v2) takes no device call.
    func checkSecret(_ request: Request, activityID: String, bundleID: String) async throws {
        guard let a = try await store.activity(id: activityID), a.bundleID == bundleID else { throw APIError.notFound("activity \(activityID)") }
        guard let installationID = a.installationID, let inst = try await store.installation(bundleID: bundleID, id: installationID) else {
            throw APIError(.forbidden, "installationRequired", "activity \(activityID) was registered without an installation, so no device call can prove it owns it; the app registers it again on its installation (POST /v1/activities with installationID)")
        }
        try InstallationSecret.check(request.headers[InstallationSecret.header], of: inst)
    }

    // MARK: Backend

    /// Builds, validates and enqueues one update or end for each target activity, in one transaction.
    func enqueue(_ request: Request, _ context: IsleRequestContext, _ caller: Caller, event: ActivityPush.Event, fanOut: Bool = false,
                 _ targets: () async throws -> [ActivityRecord]) async throws -> Response {
        let strict = try Strictness.requested(request)
        let push = try ActivityPush(try await Body.object(request), event: event).toDeviceTokens()
        let now = services.clock.now
        try Scheduling.check(push.sendAt, now: now, deadline: services.configuration.jobDeadline)
        let pushes = ActivityPushes(services: services, store: store)
        let prepared = try await pushes.prepare(bundleID: caller.bundleID, push: push, to: try await targets(), single: !fanOut, now: now)
        try Strictness.enforce(prepared.warnings, strict: strict)
        let live = prepared.live
        var value = API.Accepted(accepted: Int64(prepared.jobs.count), warnings: Views.findings(prepared.warnings))
        if !fanOut, live.count == 1 { value.activityID = live[0] }
        if !fanOut, live.count > 1 { value.activityIDs = live }
        let ids = try await pushes.commit(prepared, idempotency: context.idempotencyRecord(.accepted, value, jobs: !fanOut), now: now)
        if !fanOut { value.jobs = ids }
        return JSONResponse.make(value, status: .accepted)
    }

    /// `POST /v1/topics/{topic}/update|end`: one broadcast per channel of the topic (its followers
    /// on iOS 18 and later) and a push per token to the rest, validated once and queued in one
    /// transaction (docs/server.md, "Topics as audiences"). An end also ends the topic: its
    /// channels close once the end went out.
    func enqueueTopic(_ request: Request, _ context: IsleRequestContext, _ caller: Caller, topic name: String, event: ActivityPush.Event) async throws -> Response {
        guard !name.isEmpty, name.unicodeScalars.count <= Limits.topic else { throw APIError.invalid("topic", "a topic is 1 to \(Limits.topic) characters") }
        let strict = try Strictness.requested(request)
        let push = try ActivityPush(try await Body.object(request), event: event).toDeviceTokens()
        let now = services.clock.now
        try Scheduling.check(push.sendAt, now: now, deadline: services.configuration.jobDeadline)
        let topic = try await store.topic(bundleID: caller.bundleID, topic: name)
        // The topic's latest content, written before its followers are read: a follower that
        // registers after that read finds it and catches up (``LatestContent/catchUp(_:)``).
        if let topic, topic.endedAt == nil, event == .update, push.sendAt.map({ $0 <= now }) ?? true, let content = push.contentState {
            try await store.topicPushed(bundleID: caller.bundleID, topic: topic.topic, at: now, content: content)
        }
        // An ended topic's channels are closing: nothing more goes to them.
        let channels = topic?.endedAt == nil ? try await store.topicChannels(bundleID: caller.bundleID, topic: name) : []
        let onChannels = Set(channels.map(\.channelID))
        let followers = try await store.pushTargets(bundleID: caller.bundleID, topic: name)
        let pushes = ActivityPushes(services: services, store: store)
        var prepared = try await pushes.prepare(bundleID: caller.bundleID, push: push, to: followers, single: false, now: now)
        var channelFollowers = 0
        if !onChannels.isEmpty {
            let before = prepared.jobs.count
            let broadcastFollowers = Set(followers.lazy.filter { $0.channelID.map(onChannels.contains) == true }.map(\.id))
            prepared.jobs.removeAll { $0.activityID.map(broadcastFollowers.contains) == true }
            channelFollowers = before - prepared.jobs.count
            // The broadcasts first: queued (and so claimed) before the token pushes, each reaches
            // most of the audience at once.
            var broadcasts: [NewPushJob] = []
            for c in channels {
                let job = NewPushJob(bundleID: caller.bundleID, kind: .broadcast, channelID: c.channelID, payload: push.payload(acceptedAt: now),
                                     requestedPriority: push.priority, runAt: prepared.runAt)
                for w in try PayloadCheck(now: now).validate(job, broadcast: true) where !prepared.warnings.contains(w) { prepared.warnings.append(w) }
                broadcasts.append(job)
            }
            prepared.jobs.insert(contentsOf: broadcasts, at: 0)
        }
        try Strictness.enforce(prepared.warnings, strict: strict)
        let audience = API.Audience(broadcasts: Int64(channels.count), channelFollowers: Int64(channelFollowers), tokenFollowers: Int64(prepared.jobs.count - channels.count))
        let value = API.Accepted(accepted: Int64(prepared.jobs.count), warnings: Views.findings(prepared.warnings), audience: audience)
        _ = try await pushes.commit(prepared, idempotency: context.idempotencyRecord(.accepted, value), now: now)
        if let topic {
            if event == .end {
                try await store.endTopic(bundleID: caller.bundleID, topic: topic.topic, at: now)
                services.topics.topicEnded()
            } else { try await store.topicPushed(bundleID: caller.bundleID, topic: topic.topic, at: now, content: nil) }
        }
        return JSONResponse.make(value, status: .accepted)
    }

    /// `GET /v1/activities`: the app's activities, newest first, filtered and paged by cursor
    /// (docs/server.md, "Listing activities"). An unknown parameter is a 400, so a misspelt filter
    /// never silently lists everything.
    @Sendable func list(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let query = request.uri.queryParameters
        let known = ["state", "topic", "installationID", "userID", "keyPrefix", "limit", "after"]
        for (name, _) in query where !known.contains(String(name)) {
            throw APIError.invalid(String(name), "GET /v1/activities takes \(known.joined(separator: ", ")); \(name) is not one of them")
        }
        func text(_ name: String, max: Int) throws -> String? {
            guard let value = query[Substring(name)].map(String.init) else { return nil }
            guard !value.isEmpty, value.unicodeScalars.count <= max, !value.unicodeScalars.contains("\0") else {
                throw APIError.invalid(name, "\(name) must be 1 to \(max) characters, without NUL")
            }
            return value
        }
        var states: [ActivityRecordState] = []
        if let list = query["state"] {
            for name in list.split(separator: ",", omittingEmptySubsequences: false) {
                guard let state = ActivityRecordState(rawValue: String(name)) else {
                    throw APIError.invalid("state", "state is one or more of \(ActivityRecordState.allCases.map(\.rawValue).joined(separator: ", ")), separated by commas; \(name.isEmpty ? "an empty name" : String(name)) is not one")
                }
                if !states.contains(state) { states.append(state) }
            }
        }
        let limit = try Limits.pageSize(request, "limit")
        let after = try query["after"].map { try ActivityPage.cursor(String($0)) }
        let found = try await store.findActivities(ActivityQuery(bundleID: caller.bundleID, keyPrefix: try text("keyPrefix", max: Limits.externalKey),
                                                                 installationID: try text("installationID", max: Limits.id), userID: try text("userID", max: Limits.id),
                                                                 states: states, topic: try text("topic", max: Limits.topic), after: after, limit: limit + 1))
        let page = Array(found.prefix(limit))
        let next = found.count > limit ? page.last.map(ActivityPage.cursor) : nil
        let now = services.clock.now
        return JSONResponse.make(API.ActivityPage(activities: page.map { Views.activity(ActivityLifecycle.asOf($0, now: now)) }, next: next))
    }

    /// The activity with a page of its delivery history: the newest `deliveries` (default 100, at
    /// most 1,000) before `before` (a delivery id), oldest first; `moreDeliveries.before` pages on.
    func view(_ a: ActivityRecord, request: Request) async throws -> Response {
        let query = request.uri.queryParameters
        let limit = try Limits.pageSize(request, "deliveries")
        var before: Int64?
        if let text = query["before"] {
            guard let n = Int64(String(text)), n > 0 else { throw APIError.invalid("before", "before must be a delivery id (a positive whole number)") }
            before = n
        }
        let page = try await store.deliveries(activityID: a.id, before: before, limit: limit + 1)
        let shown = page.count > limit ? Array(page.dropFirst()) : page
        let more = page.count > limit ? shown.first?.id.map(API.DeliveryCursor.init) : nil
        let budget = try await services.budget(of: a, history: store)
        return JSONResponse.make(API.ActivityDetail(activity: Views.activity(ActivityLifecycle.asOf(a, now: services.clock.now)), budget: budget, deliveries: shown.map(Views.delivery), moreDeliveries: more))
    }
}

/// `GET /v1/activities`' cursor: where a page ended (its last activity's start and id), opaque to
/// the caller (base64url), exact to the store's precision.
enum ActivityPage {
    static func cursor(_ a: ActivityRecord) -> String { Base64URL.encode(Array("\(a.startedAt.timeIntervalSince1970)|\(a.id)".utf8)) }

    static func cursor(_ text: String) throws -> ActivityQuery.Cursor {
        guard (1...512).contains(text.count), text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else {
            throw APIError.invalid("after", "after must be the next of a previous GET /v1/activities answer (letters, digits, - and _)")
        }
        // Well formed, but not a cursor Isle made.
        let bad = APIError(.unprocessableContent, "invalidCursor", "after must be the next of a previous GET /v1/activities answer; \(text) is not one", field: "after")
        guard let data = Base64URL.decode(Substring(text)), let plain = String(validating: data, as: UTF8.self) else { throw bad }
        let parts = plain.split(separator: "|", maxSplits: 1).map(String.init)
        guard parts.count == 2, let seconds = Double(parts[0]), seconds.isFinite, !parts[1].isEmpty, parts[1].unicodeScalars.count <= Limits.id,
              !parts[1].unicodeScalars.contains("\0") else { throw bad }
        return ActivityQuery.Cursor(startedAt: Date(timeIntervalSince1970: seconds), id: parts[1])
    }
}
