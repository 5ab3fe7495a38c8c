import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// The world tells each phone's streams of that phone's changes (and of the world's): a push to
/// one phone wakes its app, not every app of every phone.
@Suite("Simulator change feed: per device, and nothing missed")
struct ChangeFeedTests {
    typealias Kit = SimulatedActivityKit<PizzaDeliveryAttributes, PizzaDeliveryAttributes.ContentState>

    @Test("a device's subscriber hears its device's changes and the world's; a world subscriber hears every change")
    func scoped() async throws {
        let feed = ChangeFeed()
        let a = feed.subscribe(device: "a")
        let world = feed.subscribe()
        #expect(feed.subscriberCount == 2)
        feed.notify(device: "a")
        try await nextValue(of: a, "a's change, told to a")
        try await nextValue(of: world, "a's change, told to the world's subscriber")
        feed.notify(device: "b")
        try await nextValue(of: world, "b's change, told to the world's subscriber")
        feed.notify()
        try await nextValue(of: a, "the world's change, told to a")
    }

    @Test("a token that changed by itself while another phone was read still reaches its app's pushTokenUpdates")
    func lazyRotationAnnounced() async throws {
        // The subject is which phone hears of a change: the one rule it needs is a token that
        // changes at a known moment (100 s); the other seeded delays (the token after request, a
        // retired token's grace) would each need their own clock moves, so they are off.
        var c = SimulatorConfiguration.instant
        c.activityTokenRotation = 100...100
        let f = try DeviceFixture(configuration: c)
        let other = f.world.createDevice(name: "other iPhone")
        _ = try Pizza.install(f.world, on: other)
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        let activity = try kit.request(attributes: FidelityTests.attributes, content: FidelityTests.state)
        try await f.world.advanceClock(by: 1)
        // Followed from now: the current token first, and no change told yet.
        let tokens = activity.pushTokenUpdates
        let first = try await nextValue(of: tokens, "the first push token")
        // Time passes without the world's own step (as between the real-time ticker's runs); the
        // rotation is applied by the next read of any device: here, the other phone's.
        f.clock.advance(by: 200)
        _ = try f.world.device(other)
        let second = try await nextValue(of: tokens, "the rotated push token")
        #expect(second != first)
        #expect(try f.activity(activity.id).updateToken == second.map { String(format: "%02x", $0) }.joined())
    }
}
