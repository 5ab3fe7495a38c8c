import Foundation
import Hummingbird
import IsleCore
import IsleDelivery
import IsleHTTPAPI
import IsleStore
import IsleWire

/// Topics as audiences (docs/server.md, "Topics as audiences"): the backend opens, reads and
/// closes a topic; the app asks for the topic's channel for its installation's environment and
/// starts (or subscribes) its activity with it on iOS 18 and later. Updates and ends by topic are
/// the activity controller's (`POST /v1/topics/{topic}/update|end`).
struct TopicController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any TopicRepository & ActivityRepository & InstallationRepository

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.put("topics/:topic", use: open)
        v1.get("topics/:topic") { _, context in
            let caller = try context.caller(.backend)
            let name = try Self.name(context)
            guard let topic = try await store.topic(bundleID: caller.bundleID, topic: name) else { throw Self.notOpen(name) }
            return JSONResponse.make(try await view(topic))
        }
        v1.delete("topics/:topic", use: close)
        v1.post("topics/:topic/channel", use: channel)
    }

    /// The topic of the path: 1 to 128 characters.
    static func name(_ context: IsleRequestContext) throws -> String {
        let name = try context.parameters.decoded("topic")
        guard !name.isEmpty, name.unicodeScalars.count <= Limits.topic else { throw APIError.invalid("topic", "a topic is 1 to \(Limits.topic) characters") }
        return name
    }

    static func notOpen(_ name: String) -> APIError {
        APIError(.notFound, "topicNotOpen", "the topic \(name) is not open as an audience: the backend opens it with PUT /v1/topics/{topic}; until then its followers are reached by token", field: "topic")
    }

    /// `PUT /v1/topics/{topic}`: opens the topic (or changes its settings, or opens an ended one again).
    @Sendable func open(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let name = try Self.name(context)
        let settings = try await Body.read(API.TopicSettings.self, request)
        let existing = try await store.topic(bundleID: caller.bundleID, topic: name)
        let record = TopicRecord(bundleID: caller.bundleID, topic: name,
                                 storagePolicy: settings.storagePolicy?.rawValue ?? existing?.storagePolicy ?? 0,
                                 closeAfterIdle: settings.closeAfterIdle.map { TimeInterval($0.seconds) } ?? existing?.closeAfterIdle ?? services.configuration.topicIdle,
                                 createdAt: existing?.createdAt ?? services.clock.now, lastPushAt: existing?.lastPushAt)
        if let existing, existing.storagePolicy != record.storagePolicy, !(try await store.topicChannels(bundleID: caller.bundleID, topic: name)).isEmpty {
            throw APIError(.conflict, "topicHasChannels", "the topic's channels were made with storage policy \(existing.storagePolicy), and a channel keeps its policy: close the topic first (DELETE /v1/topics/{topic}) to change it", field: "storagePolicy")
        }
        var answer = try await view(record)
        answer.endedAt = nil
        try await store.putTopic(record, idempotency: context.idempotencyRecord(.ok, answer))
        return JSONResponse.make(answer)
    }

    /// `DELETE /v1/topics/{topic}`: its channels are closed at APNs now, and the topic forgotten.
    @Sendable func close(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.backend)
        let name = try Self.name(context)
        guard try await store.topic(bundleID: caller.bundleID, topic: name) != nil else { throw Self.notOpen(name) }
        var record = context.idempotency
        record?.status = 204
        try await store.deleteTopic(bundleID: caller.bundleID, topic: name, idempotency: record)
        for c in try await store.topicChannels(bundleID: caller.bundleID, topic: name) {
            do {
                try await services.topics.close(c, why: "the backend closed its topic")
            } catch {
                // The sweep closes it (a forgotten topic's channels are due at once).
                services.logger.warning("could not close a topic's channel now; the sweep tries again", metadata: ["channel": "\(c.channelID)", "error": "\(error)"])
            }
        }
        return Response(status: .noContent)
    }

    /// `POST /v1/topics/{topic}/channel` (device key, installation secret): the topic's channel in
    /// the installation's APNs environment, made now if it has none.
    @Sendable func channel(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let caller = try context.caller(.device)
        let name = try Self.name(context)
        let asked = try await Body.read(API.TopicChannelRequest.self, request)
        guard let installation = try await store.installation(bundleID: caller.bundleID, id: asked.installationID.text) else {
            throw APIError(.notFound, "notFound", "no installation \(asked.installationID.text): register it first with PUT /v1/installations/{id}", field: "installationID")
        }
        try InstallationSecret.check(request.headers[InstallationSecret.header], of: installation)
        guard let topic = try await store.topic(bundleID: caller.bundleID, topic: name) else { throw Self.notOpen(name) }
        guard topic.endedAt == nil else {
            throw APIError(.conflict, "topicEnded", "the topic \(name) has ended: nothing more is sent to it until the backend opens it again", field: "topic")
        }
        let app = try await services.app(caller.bundleID)
        let environment = installation.environment ?? services.engine.clients.defaultEnvironment
        let c = try await services.topics.channel(app: app, topic: topic, environment: environment)
        return JSONResponse.make(API.FollowChannel(topic: name, channelID: c.channelID, environment: c.environment))
    }

    func view(_ topic: TopicRecord) async throws -> API.TopicView {
        let channels = try await store.topicChannels(bundleID: topic.bundleID, topic: topic.topic)
        let onChannels = Set(channels.map(\.channelID))
        let followers = try await store.pushTargets(bundleID: topic.bundleID, topic: topic.topic)
        let channelFollowers = followers.count { $0.channelID.map(onChannels.contains) == true }
        return API.TopicView(topic: topic.topic, storagePolicy: Int64(topic.storagePolicy), closeAfterIdle: Int64(topic.closeAfterIdle), createdAt: topic.createdAt,
                             endedAt: topic.endedAt, lastPushAt: topic.lastPushAt,
                             channels: channels.map { API.TopicChannelView(channelID: $0.channelID, environment: $0.environment, createdAt: $0.createdAt, lastUsedAt: $0.lastUsedAt) },
                             channelFollowers: Int64(channelFollowers), tokenFollowers: Int64(followers.count - channelFollowers))
    }
}
