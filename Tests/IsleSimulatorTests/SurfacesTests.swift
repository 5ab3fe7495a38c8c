import AsyncHTTPClient
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// The surfaces Apple added: iPad, the Watch's Smart Stack, CarPlay and the Mac's menu bar, transient
/// activities, a push token per control.
@Suite("Simulator: iPad, Watch, CarPlay, Mac, transient activities, controls")
struct SurfacesTests {
    static func world(_ os: String, model: String = "iPhone 16 Pro", families: [String] = [], controls: [String] = []) throws -> (SimulatorWorld, ManualWallClock, String) {
        let clock = ManualWallClock(Pizza.t0)
        let world = SimulatorWorld(configuration: .instant, clock: clock)
        let device = try world.createDevice(name: "d", osVersion: os, model: model)
        var install = SimulatorWorld.AppInstall(bundleID: Pizza.bundleID, schemas: [Pizza.schema], controls: controls)
        install.supplementalActivityFamilies = families
        try world.install(install, on: device)
        return (world, clock, device)
    }

    static func push(_ world: SimulatorWorld, _ token: String, _ payload: JSONValue, type: String = "liveactivity", priority: Int = 10) async -> DeliveryResult {
        await world.deliver(token: token, pushType: type, topic: Pizza.bundleID + ".push-type.\(type)", priority: priority, payload: payload, apnsID: UUID().uuidString.lowercased())
    }

    @Test("an iPad shows Live Activities on its Lock Screen only (no Dynamic Island: an alert is a banner), from iPadOS 17")
    func iPad() async throws {
        let (world, clock, device) = try Self.world("17.0", model: "iPad Pro (M4)")
        let a = try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        let token = try await world.waitForPushToken(activityID: a.id, on: device)
        _ = await Self.push(world, token, Pizza.update(clock.now, extra: ["alert": ["title": "Soon", "body": "Five minutes"]]))
        let screen = try world.screen(deviceID: device)
        #expect(screen.family == "iPad" && screen.lockScreen.count == 1 && screen.dynamicIsland == .none && screen.banner?.alert.title == "Soon")
        #expect(throws: SimulatorError.self) { try world.createDevice(name: "x", osVersion: "18.0", model: "iPad Air", hasDynamicIsland: true) }
        let (old, _, oldDevice) = try Self.world("16.4", model: "iPad (10th generation)")
        #expect(throws: SimulatorError.self) {
            try old.requestActivity(bundleID: Pizza.bundleID, on: oldDevice, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        }
        #expect(throws: SimulatorError.self) { try world.setSurroundings(deviceID: device, pairedWatch: true) }
    }

    @Test("the Watch's Smart Stack, CarPlay and the Mac's menu bar show the activity in their layouts, and a push reaches them all")
    func presentations() async throws {
        let (world, clock, device) = try Self.world("26.0", families: ["small"])
        try world.setSurroundings(deviceID: device, pairedWatch: true, carPlay: true, pairedMac: true)
        let a = try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        let token = try await world.waitForPushToken(activityID: a.id, on: device)
        var screen = try world.screen(deviceID: device)
        #expect(screen.presentations.map(\.surface) == [.watchSmartStack, .carPlay, .macMenuBar])
        #expect(screen.presentations.map(\.layout) == ["small", "small", "compact"])
        _ = await Self.push(world, token, Pizza.update(clock.now, driver: "Everywhere", extra: ["alert": ["title": "Nearly there", "body": "2 min"]]))
        screen = try world.screen(deviceID: device)
        #expect(screen.presentations.allSatisfy { $0.contentState["driverName"] == "Everywhere" })
        #expect(screen.presentations.first { $0.surface == .watchSmartStack }?.alert?.title == "Nearly there")
        #expect(screen.presentations.first { $0.surface == .macMenuBar }?.layout == "expanded")
        // CarPlay drives off: gone from there. An iOS 18 iPhone: the Watch only (CarPlay and the Mac need 26).
        try world.setSurroundings(deviceID: device, carPlay: false)
        #expect(!(try world.screen(deviceID: device).presentations.contains { $0.surface == .carPlay }))
        let (w18, _, d18) = try Self.world("18.2")
        try w18.setSurroundings(deviceID: d18, pairedWatch: true, carPlay: true, pairedMac: true)
        _ = try w18.requestActivity(bundleID: Pizza.bundleID, on: d18, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        #expect(try w18.screen(deviceID: d18).presentations.map(\.surface) == [.watchSmartStack])
        #expect(try w18.screen(deviceID: d18).presentations.first?.layout == "compact", "no .small family: the compact presentation")
    }

    @Test("the phone page draws the Watch, CarPlay and Mac presentations and an iPad's wider screen")
    func phonePage() async throws {
        try await IsleSim.withRunning(configuration: { var c = IsleSim.Configuration(); c.device = .instant; return c }(), clock: ManualWallClock(Pizza.t0)) { sim in
            let device = try sim.world.createDevice(name: "p", osVersion: "26.0", model: "iPhone 17 Pro")
            _ = try Pizza.install(sim.world, on: device)
            try sim.world.setSurroundings(deviceID: device, pairedWatch: true, carPlay: true, pairedMac: true)
            _ = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            defer { Task { try? await client.shutdown() } }
            let page = try await client.execute(HTTPClientRequest(url: await sim.controlURL() + "/phone/\(device)"), timeout: .seconds(10))
            let html = String(buffer: try await page.body.collect(upTo: 1 << 20))
            for surface in ["watchSmartStack", "carPlay", "macMenuBar"] { #expect(html.contains("data-surface=\"\(surface)\"")) }
            let ipad = try sim.world.createDevice(name: "i", osVersion: "18.0", model: "iPad Pro (M4)")
            let ipadPage = try await client.execute(HTTPClientRequest(url: await sim.controlURL() + "/phone/\(ipad)"), timeout: .seconds(10))
            #expect(String(buffer: try await ipadPage.body.collect(upTo: 1 << 20)).contains("data-family=\"iPad\""))
        }
    }

    @Test("a transient activity (iOS 18) shows only in the expanded Dynamic Island and ends when the person leaves the app or locks the phone")
    func transient() async throws {
        let (world, _, device) = try Self.world("18.0")
        let a = try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(),
                                          pushType: .none, style: .transient)
        var screen = try world.screen(deviceID: device)
        #expect(screen.lockScreen.isEmpty && screen.dynamicIsland == .expanded && screen.islandActivities == [a.id])
        try world.updateSettings(bundleID: Pizza.bundleID, on: device, foreground: false)
        #expect(try world.device(device).activities.first { $0.id == a.id }?.state == .dismissed)
        try world.updateSettings(bundleID: Pizza.bundleID, on: device, foreground: true)
        let b = try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(),
                                          pushType: .none, style: .transient)
        try world.setSurroundings(deviceID: device, locked: true)
        #expect(try world.device(device).activities.first { $0.id == b.id }?.state == .dismissed)
        screen = try world.screen(deviceID: device)
        #expect(screen.dynamicIsland == .none)
        // Before iOS 18, without a Dynamic Island, or with a push token: refused (the last two Isle's assumption).
        let (w17, _, d17) = try Self.world("17.4")
        #expect(throws: SimulatorError.self) { try w17.requestActivity(bundleID: Pizza.bundleID, on: d17, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(), pushType: .none, style: .transient) }
        let (se, _, dse) = try Self.world("18.0", model: "iPhone SE (3rd generation)")
        #expect(throws: SimulatorError.self) { try se.requestActivity(bundleID: Pizza.bundleID, on: dse, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(), pushType: .none, style: .transient) }
        #expect(throws: SimulatorError.self) { try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(), style: .transient) }
    }

    @Test("each control has its own push token; a controls push reloads that control alone; removing a control retires its token (410)")
    func controlTokens() async throws {
        let (world, clock, device) = try Self.world("18.0", controls: ["garage", "lights"])
        try await world.advanceClock(by: 0)
        _ = clock
        var app = try world.app(Pizza.bundleID, on: device)
        let tokens = app.controlPushTokens
        #expect(tokens.count == 2 && Set(tokens.values).count == 2)
        let r = await Self.push(world, tokens["garage"]!, ["aps": ["content-changed": true]], type: "controls")
        #expect(r.status == 200 && r.outcome?.code == .controlsReloaded)
        app = try world.app(Pizza.bundleID, on: device)
        #expect(app.controlReloadsByKind == ["garage": 1])
        try world.setControls(bundleID: Pizza.bundleID, on: device, kinds: ["lights", "heating"])
        app = try world.app(Pizza.bundleID, on: device)
        #expect(app.controlPushTokens["lights"] == tokens["lights"] && app.controlPushTokens["heating"] != nil && app.controlPushTokens["garage"] == nil)
        #expect(await Self.push(world, tokens["garage"]!, ["aps": ["content-changed": true]], type: "controls").status == 410)
    }
}
