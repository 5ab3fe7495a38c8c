import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

struct PizzaDeliveryAttributes: Codable, Sendable {
    struct ContentState: Codable, Sendable, Equatable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
    }
    var numberOfPizzas: Int
    var totalAmount: String
    var orderNumber: String
}

@Suite("An ActivityKit-shaped API for app code under test")
struct SimulatedActivityKitTests {
    typealias Kit = SimulatedActivityKit<PizzaDeliveryAttributes, PizzaDeliveryAttributes.ContentState>
    static let t = Pizza.t0
    static let state = PizzaDeliveryAttributes.ContentState(driverName: "Bill James", deliveryTimer: t...t.addingTimeInterval(1500))
    static let attributes = PizzaDeliveryAttributes(numberOfPizzas: 3, totalAmount: "$42.00", orderNumber: "12345")

    @Test("request, push token, content updates from pushes, state updates from the clock")
    func lifecycle() async throws {
        let f = try DeviceFixture(frequent: true)
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        #expect(kit.areActivitiesEnabled && kit.frequentPushesEnabled)
        let activity = try kit.request(attributes: Self.attributes, content: Self.state)
        #expect(activity.attributes?.orderNumber == "12345")
        #expect(activity.content == Self.state)
        let token = try await nextValue(of: activity.pushTokenUpdates, "the push token")
        #expect(token.count == 80)
        let first = try await nextValue(of: activity.contentUpdates, "the current content")
        #expect(first == Self.state)
        // A push from "the server" shows up as a content update decoded by JSONDecoder.
        let hex = token.map { String(format: "%02x", $0) }.joined()
        var newState = Self.state
        newState.driverName = "Anne Johnson"
        let payload = try LiveActivityPayload.update(contentState: newState, timestamp: f.now)
        await f.push(hex, payload.jsonValue)
        let updated = try await nextValue(of: activity.contentUpdates, "the pushed content")
        #expect(updated == newState)
        // The state stream follows the virtual clock: 8 hours → ended.
        try await f.world.advanceClock(by: 8 * 3600)
        let states = activity.activityStateUpdates
        #expect(try await nextValue(of: states, "the ended state") == .ended)
    }

    @Test("update and end from the app; end with immediate dismissal")
    func appSide() async throws {
        let f = try DeviceFixture()
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        let activity = try kit.request(attributes: Self.attributes, content: Self.state, pushType: nil)
        #expect(activity.pushToken == nil)
        var s = Self.state
        s.driverName = "App"
        try activity.update(s)
        #expect(activity.content?.driverName == "App")
        try activity.end(nil, dismissImmediately: true)
        #expect(activity.activityState == .dismissed)
    }

    @Test("push-to-start: the token stream, activityUpdates yielding the new activity, enablement updates")
    func pushToStart() async throws {
        let f = try DeviceFixture()
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        let startToken = try await nextValue(of: kit.pushToStartTokenUpdates, "the push-to-start token")
        #expect(startToken == kit.pushToStartToken)
        let hex = startToken.map { String(format: "%02x", $0) }.joined()
        let start = try LiveActivityPayload.start(attributes: Self.attributes, contentState: Self.state, timestamp: f.now,
                                                  alert: LiveActivityAlert(title: "Order", body: "Started"), inputPushToken: true)
        await f.push(hex, start.jsonValue)
        let started = try await nextValue(of: kit.activityUpdates, "the push-started activity")
        #expect(started.content == Self.state)
        // Its update token comes after the start, on pushTokenUpdates (iOS 18+: asked for with input-push-token).
        #expect(try await nextValue(of: started.pushTokenUpdates, "the push-started activity's token").count == 80)
        // Rotation reaches pushToStartTokenUpdates.
        let updates = kit.pushToStartTokenUpdates
        let rotated = try f.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: f.device)
        let latest = try await withDeadline {
            for await t in updates where t.map({ String(format: "%02x", $0) }).joined() == rotated { return t }
            throw DeadlineExceeded(what: "rotation", after: .zero)
        }
        #expect(latest.count == 40)
        // Enablement.
        let enablement = kit.activityEnablementUpdates
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, liveActivitiesEnabled: false)
        let off = try await withDeadline {
            for await e in enablement where e == false { return e }
            return true
        }
        #expect(off == false)
    }
}
