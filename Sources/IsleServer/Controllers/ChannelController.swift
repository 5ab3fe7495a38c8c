import Hummingbird
import IsleAPNs
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery

/// Broadcast channels (iOS 18): created and deleted at APNs, updated and ended through the queue
/// (one at a time per channel, in order).
struct ChannelController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any ChannelRepository & JobIntake

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.post("channels", use: create)
        v1.get("channels") { _, context in
            let caller = try context.caller(.backend)
            return JSONResponse.make(try await store.channels(bundleID: caller.bundleID).map(Views.channel))
        }
        v1.delete("channels/:channel", use: delete)
        for event in ActivityPush.Event.allCases {
            v1.post("channels/:channel/\(event.rawValue)") { request, context in
                try await push(request, context, event: event)
            }
        }
    }

    /// A custom APNs without a channel-management host sends channel management to its device
    /// host, which answers 404: say which setting is missing.
    static func managementHint(_ target: APNsEnvironment, _ e: APNsError) -> String {
        guard case .custom(let url, _, nil, _) = target, e.response?.status == 404 || e.response?.reason == .badPath else { return "" }
        return ". Channel management went to \(url), the device host, because isle serve has no --apns-management-url: give it (isle sim prints its channels host)"
    }

    @Sendable func create(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let creation = try await Body.read(API.ChannelCreation.self, request)
        let storagePolicy = creation.storagePolicy?.rawValue ?? 0
        let app = try await services.app(caller.bundleID)
        let channel: BroadcastChannel
        // A channel lives in one environment: the one asked for, else the server's default now.
        let environment = creation.environment?.environment ?? services.engine.clients.defaultEnvironment
        // Within the channel limit: an idle topic channel nobody follows makes room, else 409.
        try await services.topics.makeRoom(app: app, environment: environment)
        do {
            channel = try await services.engine.clients.client(for: app, environment: environment).createChannel(bundleID: app.bundleID, storagePolicy: MessageStoragePolicy(rawValue: storagePolicy)!)
        } catch let e as APNsError where e.response?.reason == .cannotCreateChannelConfig {
            throw TopicAudiences.limitReached(app, environment, "APNs answered CannotCreateChannelConfig: the app has 10,000 channels in \(environment.rawValue), some not made by this server")
        } catch let e as APNsError {
            throw APIError(.badGateway, "apnsRejected", "APNs did not create the channel: \(e.message)\(Self.managementHint(services.engine.clients.target(environment), e))")
        }
        let record = ChannelRecord(id: channel.id, bundleID: app.bundleID, storagePolicy: storagePolicy, createdAt: services.clock.now, environment: environment)
        let value = Views.channel(record)
        do {
            try await store.insertChannel(record, idempotency: context.idempotencyRecord(.created, value))
        } catch let error as StoreError where error.code == .idempotencyKeyTaken {
            // A concurrent request with the same key made its own channel first: this one's goes.
            try? await services.engine.clients.client(for: app, environment: environment).deleteChannel(bundleID: app.bundleID, channelID: channel.id)
            throw error
        }
        return JSONResponse.make(value, status: .created)
    }

    @Sendable func delete(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let id = try context.parameters.decoded("channel")
        guard let c = try await store.channel(id: id), c.bundleID == caller.bundleID else { throw APIError.notFound("channel \(id)") }
        let app = try await services.app(caller.bundleID)
        do { try await services.engine.clients.client(for: app, environment: c.environment).deleteChannel(bundleID: app.bundleID, channelID: id) } catch let e as APNsError where e.response?.reason != .channelNotRegistered {
            throw APIError(.badGateway, "apnsRejected", "APNs did not delete the channel: \(e.message)\(Self.managementHint(services.engine.clients.target(c.environment ?? services.engine.clients.defaultEnvironment), e))")
        }
        var record = context.idempotency
        record?.status = 204
        try await store.deleteChannel(id: id, idempotency: record)
        return Response(status: .noContent)
    }

    func push(_ request: Request, _ context: IsleRequestContext, event: ActivityPush.Event) async throws -> Response {
        let caller = try context.caller(.backend)
        let id = try context.parameters.decoded("channel")
        let strict = try Strictness.requested(request)
        let push = try ActivityPush(try await Body.object(request), event: event)
        guard let channel = try await store.channel(id: id), channel.bundleID == caller.bundleID else { throw APIError.notFound("channel \(id)") }
        let now = services.clock.now
        try Scheduling.check(push.sendAt, now: now, deadline: services.configuration.jobDeadline)
        let job = NewPushJob(bundleID: caller.bundleID, kind: .broadcast, channelID: id, payload: push.payload(acceptedAt: now), requestedPriority: push.priority,
                             runAt: max(push.sendAt ?? now, now))
        let warnings = try PayloadCheck(now: now).validate(job, broadcast: true)
        try Strictness.enforce(warnings, strict: strict)
        var value = API.Accepted(accepted: 1, warnings: Views.findings(warnings))
        let ids = try await store.enqueue(TraceParent.stamped([job]), idempotency: context.idempotencyRecord(.accepted, value, jobs: true), now: now)
        services.engine.wake(at: job.runAt)
        value.jobs = ids
        return JSONResponse.make(value, status: .accepted)
    }
}
