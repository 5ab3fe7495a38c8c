import Foundation
import IsleAPNs
import IsleCore
import IsleDelivery
import IsleHTTPAPI
import IsleStore
import Logging
import ServiceLifecycle
import Synchronization

/// Topics as audiences (docs/server.md, "Topics as audiences"): a topic's broadcast channel per
/// APNs environment, made at APNs when the first follower asks for it, within the app's channel
/// limit; closed when the topic ended and its end went out, when it was forgotten, or when it
/// has been idle for the topic's time with no live follower. A `Service`: it looks for channels
/// to close at every sweep interval, on the server's clock.
final class TopicAudiences: Service {
    typealias Store = TopicRepository & ChannelRepository & AppLookup
    let store: any Store
    let clients: APNsClients
    let apps: AppCache
    let configuration: ServerConfiguration
    let clock: any WallClock
    let logger: Logger
    /// Until when the sweep runs every second: a topic just ended, and its channels close once
    /// its end went out (seconds, not a whole sweep interval, later).
    let endingUntil = Mutex<ContinuousClock.Instant?>(nil)
    /// Sweeps finished (``IsleServerApp``'s count, for tests).
    let sweeps = Atomic<Int>(0)

    init(store: any Store, clients: APNsClients, apps: AppCache, configuration: ServerConfiguration, clock: any WallClock, logger: Logger) {
        self.store = store
        self.clients = clients
        self.apps = apps
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
    }

    /// A follower is live while its activity takes pushes and is younger than the system's 8 hours.
    static let followerLifetime = DeliveryPlanner.activityLifetime

    /// The topic's channel in `environment`, made at APNs now if it has none. At the channel limit
    /// the idlest topic channel with no live follower is closed first; with none, 409 `channelLimit`.
    func channel(app: AppRecord, topic: TopicRecord, environment: PushEnvironment) async throws -> TopicChannel {
        if let standing = try await store.topicChannels(bundleID: app.bundleID, topic: topic.topic).first(where: { $0.environment == environment }) { return standing }
        try await makeRoom(app: app, environment: environment)
        let client = try clients.client(for: app, environment: environment)
        let created: BroadcastChannel
        do {
            created = try await client.createChannel(bundleID: app.bundleID, storagePolicy: MessageStoragePolicy(rawValue: topic.storagePolicy) ?? .noMessageStored)
        } catch let e where e.response?.reason == .cannotCreateChannelConfig {
            throw Self.limitReached(app, environment, "APNs answered CannotCreateChannelConfig: the app has 10,000 channels in \(environment.rawValue), some not made by this server")
        } catch {
            throw APIError(.badGateway, "apnsRejected", "APNs did not create the topic's channel: \(error.message)\(ChannelController.managementHint(clients.target(environment), error))")
        }
        let now = clock.now
        let link = TopicChannel(channelID: created.id, bundleID: app.bundleID, topic: topic.topic, environment: environment, createdAt: now, lastUsedAt: now)
        let standing = try await store.addTopicChannel(link, channel: ChannelRecord(id: created.id, bundleID: app.bundleID, storagePolicy: topic.storagePolicy, createdAt: now,
                                                                                    environment: environment))
        if standing.channelID != created.id {
            // Another request (or instance) made the topic's channel first: this one goes.
            try? await client.deleteChannel(bundleID: app.bundleID, channelID: created.id)
        } else {
            logger.info("made a topic's broadcast channel", metadata: ["app": "\(app.bundleID)", "topic": "\(topic.topic)", "environment": "\(environment.rawValue)",
                                                                       "channel": "\(created.id)"])
        }
        return standing
    }

    /// Under the channel limit, or made so by closing the idlest topic channel nobody follows.
    func makeRoom(app: AppRecord, environment: PushEnvironment) async throws {
        let limit = configuration.channelLimit
        for _ in 0..<3 {
            let count = try await store.channelCount(bundleID: app.bundleID, environment: environment, defaultEnvironment: clients.defaultEnvironment)
            guard count >= limit else { return }
            guard let idlest = try await store.idlestTopicChannel(bundleID: app.bundleID, environment: environment, now: clock.now, lifetime: Self.followerLifetime) else {
                throw Self.limitReached(app, environment, "every one of its \(count) channels is the app's own or has live followers")
            }
            try await close(idlest, why: "making room under the channel limit (\(limit))")
        }
        throw Self.limitReached(app, environment, "channels are being made faster than idle ones can be closed")
    }

    static func limitReached(_ app: AppRecord, _ environment: PushEnvironment, _ why: String) -> APIError {
        APIError(.conflict, "channelLimit", "\(app.bundleID) is at its channel limit in \(environment.rawValue): \(why); follow by token instead (IsleClient does), or delete channels no longer used")
    }

    /// Deletes the channel at APNs (one already gone there is fine) and forgets it.
    func close(_ c: TopicChannel, why: String) async throws {
        if let app = try await apps.app(c.bundleID, store: store) {
            do {
                try await clients.client(for: app, environment: c.environment).deleteChannel(bundleID: app.bundleID, channelID: c.channelID)
            } catch let e as APNsError where e.response?.reason == .channelNotRegistered {
                // Gone at APNs already.
            }
        }
        try await store.removeTopicChannel(channelID: c.channelID)
        logger.info("closed a topic's broadcast channel", metadata: ["app": "\(c.bundleID)", "topic": "\(c.topic)", "environment": "\(c.environment.rawValue)",
                                                                     "channel": "\(c.channelID)", "why": "\(why)"])
    }

    /// Closes what is due: ended or forgotten topics' channels with nothing left to send, idle ones.
    func sweep() async {
        do {
            let due = try await store.closableTopicChannels(now: clock.now, lifetime: Self.followerLifetime, limit: 100)
            for c in due {
                do {
                    try await close(c, why: "its topic ended or was idle")
                } catch {
                    logger.warning("could not close a topic's channel; the next sweep tries again", metadata: ["channel": "\(c.channelID)", "error": "\(error)"])
                }
            }
        } catch {
            logger.log(level: .forStoreFailure(.error, error), "looking for topic channels to close failed; the next sweep tries again", metadata: ["error": "\(error)"])
        }
    }

    /// A topic ended: its channels are looked at every second for the next minute.
    func topicEnded() {
        endingUntil.withLock { $0 = ContinuousClock.now + .seconds(60) }
    }

    func run() async throws {
        await cancelWhenGracefulShutdown {
            // Looks every second whether a sweep is due: at each sweep interval, and every second
            // for a minute after a topic ended (no database read in between).
            var last = ContinuousClock.now
            while !Task.isCancelled {
                try? await Task.sleep(for: min(.seconds(1), self.configuration.sweepInterval))
                if Task.isCancelled { break }
                let now = ContinuousClock.now
                let ending = self.endingUntil.withLock { $0.map { $0 > now } ?? false }
                guard ending || now - last >= self.configuration.sweepInterval else { continue }
                last = now
                await self.sweep()
                self.sweeps.add(1, ordering: .relaxed)
            }
        }
    }
}
