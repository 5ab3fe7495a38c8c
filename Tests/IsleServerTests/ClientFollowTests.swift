import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// IsleClient's follow (docs/client.md, "Following a topic") on simulated iPhones: one call in the
/// app puts an iOS 18 phone's activity on the topic's channel and an iOS 17 phone's on a token,
/// and the backend's one topic update reaches both.
@Suite("IsleClient: following a topic")
struct ClientFollowTests {
    typealias Kit = ClientTests.Kit

    struct Phone {
        let device: String
        let kit: Kit
        let client: IsleClient
        let runner: Task<Void, Never>
    }

    static func phone(_ f: ServerFixture, os: String) async throws -> Phone {
        let device = try f.sim.world.createDevice(name: "phone-\(os)", osVersion: os, model: "iPhone 15")
        try f.sim.world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema]), on: device)
        let kit = Kit(world: f.sim.world, deviceID: device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(await f.server.port)")!, deviceKey: f.deviceKey, environment: nil)
        c.firstRetry = 0.05
        c.maximumRetry = 0.5
        c.requestTimeout = 5
        // What the simulated phone's system offers (on a phone: the running system's).
        c.capabilities.broadcastChannels = (Int(os.split(separator: ".")[0]) ?? 0) >= 18
        let client = try IsleClient(configuration: c, storage: FileStorage(path: ClientTests.storagePath()))
        return Phone(device: device, kit: kit, client: client, runner: Task { await client.run() })
    }

    /// What the app writes: one call; the closure is its `Activity.request`.
    @MainActor
    static func follow(_ p: Phone, topic: String, channels: Bool) async throws -> Following<SimulatedLiveActivities<ClientTests.PizzaAttributes, ClientTests.PizzaState>.Handle> {
        let kit = p.kit
        return try await p.client.follow(topic: topic, channels: channels) { pushType in
            let h = switch pushType {
            case .channel(let id): try kit.request(attributes: ClientTests.attributes, content: ClientTests.state, pushType: .channel(id))
            case .token: try kit.request(attributes: ClientTests.attributes, content: ClientTests.state, pushType: .token)
            }
            return SimulatedLiveActivities(kit).handle(h)
        }
    }

    @Test("one call on iOS 18 and iOS 17: the channel and a token; one topic update reaches both; a closed topic falls back to a token with the reason")
    func followMixed() async throws {
        try await ServerFixture.with { f in
            #expect(try await f.call("PUT", "/v1/topics/derby", key: f.backendKey, body: ["storagePolicy": 1]).status == 200)
            let new = try await Self.phone(f, os: "18.1")
            let old = try await Self.phone(f, os: "17.4")
            let onChannel = try await Self.follow(new, topic: "derby", channels: true)
            let onToken = try await Self.follow(old, topic: "derby", channels: false)
            guard case .channel(let channel) = onChannel.pushType else { Issue.record("iOS 18 followed by token: \(onChannel.tokenReason ?? "")"); return }
            #expect(onToken.pushType == .token && onToken.tokenReason == nil)
            // Both registered under the topic: the iOS 18 one with the channel, no token.
            for (client, id) in [(new.client, onChannel.activity.id), (old.client, onToken.activity.id)] {
                guard case .registered = await client.registration(of: id) else { Issue.record("not registered"); return }
            }
            let view = try await f.call("GET", "/v1/topics/derby", key: f.backendKey)
            #expect(view.json["channelFollowers"] == 1 && view.json["tokenFollowers"] == 1, "\(view.json.jsonString)")
            let r = try await f.call("POST", "/v1/topics/derby/update", key: f.backendKey, body: ["contentState": Pizza.state("Goal!")])
            #expect(r.json["audience"] == ["broadcasts": 1, "channelFollowers": 1, "tokenFollowers": 1], "\(r.json.jsonString)")
            try await eventually("both phones show the update") {
                let a = try f.sim.world.device(new.device).activities.first { $0.id == onChannel.activity.id }
                let b = try f.sim.world.device(old.device).activities.first { $0.id == onToken.activity.id }
                return a?.contentState["driverName"] == "Goal!" && b?.contentState["driverName"] == "Goal!" && a?.channelID == channel
            }
            // A topic that is not open: the iOS 18 phone follows by token, and says why.
            let closed = try await Self.follow(new, topic: "friendly", channels: true)
            #expect(closed.pushType == .token && closed.tokenReason?.hasPrefix("topicNotOpen") == true, "\(closed.tokenReason ?? "")")
            // A channel the system refuses (deleted at APNs behind the server's back): a token instead.
            #expect(try await f.call("PUT", "/v1/topics/cup", key: f.backendKey).status == 200)
            let cup = await new.client.pushType(forTopic: "cup")
            guard case .channel(let cupChannel) = cup else { Issue.record("\(cup)"); return }
            _ = f.sim.world.deleteChannel(bundleID: Pizza.bundleID, id: cupChannel)
            let refused = try await Self.follow(new, topic: "cup", channels: true)
            #expect(refused.pushType == .token && refused.tokenReason?.contains("did not start the activity on the topic's channel") == true, "\(refused.tokenReason ?? "")")
            // Topics followed for starts, and what the system offers, reach the server with the installation.
            await new.client.followForStarts(topics: ["derby", "cup", "derby"])
            await old.client.followForStarts(topics: ["derby"])
            let store = try SQLiteStore(path: f.databasePath)
            for (client, channels, topics) in [(new.client, true, ["derby", "cup"]), (old.client, false, ["derby"])] {
                let id = await client.installationID
                try await eventually("the installation's topics and capability") {
                    let i = try await store.installation(bundleID: Pizza.bundleID, id: id)
                    return i?.topics == topics && i?.broadcastChannels == channels
                }
            }
            #expect(Set(try await store.installations(bundleID: Pizza.bundleID, topic: "derby").map(\.id)) == Set([await new.client.installationID, await old.client.installationID]))
            for p in [new, old] {
                await p.client.stop()
                p.runner.cancel()
            }
        }
    }
}
