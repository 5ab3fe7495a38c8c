import Foundation
import IsleAPNs
import IsleCore
import IsleSimulator
import IsleTesting
import Logging
import Testing

/// IsleAPNs against the independent simulator: what the client sends is what the fake APNs and
/// the simulated device accept.
@Suite("IsleAPNs client against IsleSimulator")
struct ClientAgainstSimulatorTests {
    struct Rig {
        let sim: IsleSim
        let client: APNsClient
        let clock: ManualWallClock
        let device: String
    }

    static let schema = try! ActivitySchema(jsonText: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":"int","totalAmount":"string","orderNumber":"string"},"contentState":{"driverName":"string","deliveryTimer":"dateRange"}}"#)

    struct PizzaAttributes: Codable { var numberOfPizzas: Int; var totalAmount: String; var orderNumber: String }
    struct PizzaState: Codable { var driverName: String; var deliveryTimer: ClosedRange<Date> }

    static func with(transport: APNsTransportKind = .default, _ body: (Rig) async throws -> Void) async throws {
        let clock = ManualWallClock(Date(timeIntervalSince1970: 1_767_225_600))
        // The client is under test, not how it copes with APNs' leeway (reordering, priority-5 loss,
        // tokens changing by themselves): the simulator's defaults otherwise, priority 5 delayed.
        var configuration = IsleSim.Configuration()
        configuration.device.disableLeeway()
        try await IsleSim.withRunning(configuration: configuration, clock: clock) { sim in
            let key = TestProviderKey()
            try sim.apns.register(RegisteredKey(keyID: key.keyID, teamID: key.teamID, publicKeyPEM: key.publicKeyPEM))
            let device = sim.world.createDevice(name: "iPhone")
            try sim.world.install(.init(bundleID: "com.example.pizza", schemas: [schema]), on: device)
            let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
            let client = try APNsClient(configuration: .init(environment: .custom(url: sim.apnsURL, broadcastURL: sim.broadcastURL, managementURL: sim.managementURL, trustRootsPEM: sim.caCertificatePEM), credentials: credentials, transport: transport), clock: clock, logger: Logger(label: "t"))
            do {
                try await body(Rig(sim: sim, client: client, clock: clock, device: device))
                try await client.shutdown()
            } catch {
                try? await client.shutdown()
                throw error
            }
        }
    }

    @Test("push-to-start, then updates with the token the device hands back, then end")
    func lifecycle() async throws {
        try await Self.with { r in
            // ActivityKit hands the push-to-start token out a moment after install, on pushToStartTokenUpdates.
            let pts = try DeviceToken(hex: try await r.sim.world.waitForPushToStartToken(bundleID: "com.example.pizza", attributesType: "PizzaDeliveryAttributes", on: r.device))
            let t = r.clock.now
            let start = try LiveActivityPayload.start(
                attributes: PizzaAttributes(numberOfPizzas: 3, totalAmount: "$42.00", orderNumber: "12345"),
                contentState: PizzaState(driverName: "Bill James", deliveryTimer: t...t.addingTimeInterval(1500)), timestamp: t,
                alert: LiveActivityAlert(title: "Order 12345", body: "In the oven"), inputPushToken: true, attributesType: "PizzaDeliveryAttributes")
            try await r.client.send(.liveActivity(start, token: pts, bundleID: "com.example.pizza", priority: .high, schema: Self.schema))
            let activity = try #require(try r.sim.world.device(r.device).activities.first)
            #expect(activity.state == .active)
            // The Date range arrives as ActivityKit decodes it.
            #expect(activity.contentState["deliveryTimer"] == [.double(t.timeIntervalSinceReferenceDate), .double(t.timeIntervalSinceReferenceDate + 1500)])
            let token = try DeviceToken(hex: try await r.sim.world.waitForPushToken(activityID: activity.id, on: r.device))
            r.clock.advance(by: 60)
            let update = try LiveActivityPayload.update(contentState: PizzaState(driverName: "Anne Johnson", deliveryTimer: t...t.addingTimeInterval(1500)), timestamp: r.clock.now)
            try await r.client.send(.liveActivity(update, token: token, bundleID: "com.example.pizza"))
            // Priority 5: the device applies it opportunistically (the simulator: within 3 s), not at once.
            #expect(try r.sim.world.screen(deviceID: r.device).lockScreen.first?.contentState["driverName"] != "Anne Johnson")
            r.clock.advance(by: 3)
            #expect(try r.sim.world.screen(deviceID: r.device).lockScreen.first?.contentState["driverName"] == "Anne Johnson")
            r.clock.advance(by: 60)
            let end = try LiveActivityPayload.end(contentState: PizzaState(driverName: "Delivered", deliveryTimer: t...t.addingTimeInterval(1500)), timestamp: r.clock.now, dismissalDate: r.clock.now.addingTimeInterval(1800))
            try await r.client.send(.liveActivity(end, token: token, bundleID: "com.example.pizza"))
            r.clock.advance(by: 3)
            #expect(try r.sim.world.screen(deviceID: r.device).lockScreen.first?.contentState["driverName"] == "Delivered")
            #expect(try r.sim.world.device(r.device).activities.first?.state == .ended)
            r.clock.advance(by: 1800 - 3)
            let dismissedAt = r.clock.now
            // Dismissed: APNs may accept the token a while longer (up to 2 minutes here), then it is
            // dead, and the client says what to do.
            r.clock.advance(by: 121)
            do throws(APNsError) {
                try await r.client.send(.liveActivity(update, token: token, bundleID: "com.example.pizza"))
                Issue.record("sent to a dismissed activity")
            } catch {
                #expect(error.response?.status == 410)
                #expect(error.response?.reason == .unregistered)
                #expect(error.remedy == .dropToken)
                #expect(error.response?.invalidSince == dismissedAt)
            }
        }
    }

    @Test("channels and broadcast through the client")
    func broadcast() async throws {
        try await Self.with { r in
            let channel = try await r.client.createChannel(bundleID: "com.example.pizza", storagePolicy: .noMessageStored)
            #expect(try await r.client.listChannels(bundleID: "com.example.pizza") == [channel.id])
            #expect(try await r.client.readChannel(bundleID: "com.example.pizza", channelID: channel.id).storagePolicy == .noMessageStored)
            _ = try r.sim.world.requestActivity(bundleID: "com.example.pizza", on: r.device, attributesType: "PizzaDeliveryAttributes",
                                                attributes: ["numberOfPizzas": 1, "totalAmount": "$1", "orderNumber": "1"],
                                                contentState: ["driverName": "A", "deliveryTimer": [1, 2]], pushType: .channel(channel.id))
            let payload = LiveActivityPayload(event: .update, timestamp: r.clock.now, contentState: ["driverName": "Everyone", "deliveryTimer": [1, 2]])
            let response = try await r.client.broadcast(BroadcastPush(bundleID: "com.example.pizza", channelID: channel.id, payload: payload, priority: .high, storagePolicy: .noMessageStored))
            #expect(response.apnsUniqueID != nil)
            #expect(try r.sim.world.device(r.device).activities.first?.contentState["driverName"] == "Everyone")
            try await r.client.deleteChannel(bundleID: "com.example.pizza", channelID: channel.id)
            #expect(try await r.client.listChannels(bundleID: "com.example.pizza").isEmpty)
        }
    }

    @Test("a connection never sees its provider token change within 20 minutes (a connection opened late in a token's hour), on either transport",
          arguments: APNsTransportKind.allCases)
    func providerTokenPerConnection(_ transport: APNsTransportKind) async throws {
        try await Self.with(transport: transport) { r in
            _ = try r.sim.world.requestActivity(bundleID: "com.example.pizza", on: r.device, attributesType: "PizzaDeliveryAttributes",
                                                attributes: ["numberOfPizzas": 1, "totalAmount": "$1", "orderNumber": "1"],
                                                contentState: ["driverName": "A", "deliveryTimer": [1, 2]], pushType: .token)
            let activity = try #require(try r.sim.world.device(r.device).activities.first)
            let token = try DeviceToken(hex: try await r.sim.world.waitForPushToken(activityID: activity.id, on: r.device))
            var n = 0
            func update() async throws {
                n += 1
                let payload = LiveActivityPayload(event: .update, timestamp: r.clock.now, contentState: ["driverName": .string("driver \(n)"), "deliveryTimer": [1, 2]])
                try await r.client.send(.liveActivity(payload, token: token, bundleID: "com.example.pizza", priority: .low))
            }
            // The token is minted at the first push (device host); the broadcast host's connection
            // opens 39 minutes later with it; at 53 minutes the token is 53 minutes old and replaced.
            try await update()
            r.clock.advance(by: 39 * 60)
            let channel = try await r.client.createChannel(bundleID: "com.example.pizza", storagePolicy: .noMessageStored)
            func broadcast() async throws {
                n += 1
                let payload = LiveActivityPayload(event: .update, timestamp: r.clock.now, contentState: ["driverName": .string("everyone \(n)"), "deliveryTimer": [1, 2]])
                try await r.client.broadcast(BroadcastPush(bundleID: "com.example.pizza", channelID: channel.id, payload: payload, priority: .low, storagePolicy: .noMessageStored))
            }
            try await broadcast()
            r.clock.advance(by: 14 * 60)
            try await broadcast()
            try await update()
            _ = try await r.client.readChannel(bundleID: "com.example.pizza", channelID: channel.id)
            // Then three hours of pushes at random moments on all three hosts (seeded): APNs never
            // refuses a token change.
            var random = SeededRandom(seed: 50)
            while r.clock.now.timeIntervalSince(Date(timeIntervalSince1970: 1_767_225_600)) < 4 * 3600 {
                r.clock.advance(by: Double.random(in: 30...600, using: &random))
                switch Int.random(in: 0..<3, using: &random) {
                case 0: try await update()
                case 1: try await broadcast()
                default: _ = try await r.client.listChannels(bundleID: "com.example.pizza")
                }
            }
            let refused = r.sim.apns.requestLog.filter { $0.status == 429 || $0.status == 403 }.map { "\($0.path) \($0.status) \($0.reason ?? "")" }
            #expect(refused.isEmpty)
        }
    }

    @Test("widgets push reloads the timeline")
    func widgets() async throws {
        try await Self.with { r in
            let d = r.sim.world.createDevice(name: "second")
            let t = r.clock.now
            let timeline = WidgetTimeline(entries: [.init(date: t, content: ["pizza": "Margherita"]), .init(date: t.addingTimeInterval(600), content: ["pizza": "Diavola"])], policy: .never)
            _ = try r.sim.world.install(.init(bundleID: "com.example.pizza", widgets: [.init(kind: "favorite", source: .fixed(timeline))]), on: d)
            // WidgetKit hands the widget push token out a moment after install.
            let token = try await r.sim.world.waitForWidgetPushToken(bundleID: "com.example.pizza", on: d)
            try await r.client.send(.widgetsReload(token: try DeviceToken(hex: token), bundleID: "com.example.pizza"))
            #expect(try r.sim.world.screen(deviceID: d).widgets.first?.entry?.content == ["pizza": "Margherita"])
            r.clock.advance(by: 600)
            #expect(try r.sim.world.screen(deviceID: d).widgets.first?.entry?.content == ["pizza": "Diavola"])
        }
    }
}
