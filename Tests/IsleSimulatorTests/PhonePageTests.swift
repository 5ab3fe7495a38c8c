import AsyncHTTPClient
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import NIOCore
import Testing

/// The phone page (docs/server.md, "The console"): served from the binary, escaped, and live over server-sent events.
/// The same page in a real Chromium: scripts/browser-test.sh.
@Suite("Simulator phone page")
struct PhonePageTests {
    static func get(_ url: String) async throws -> (status: Int, type: String?, body: String) {
        let r = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(10))
        let body = try await r.body.collect(upTo: 4 << 20)
        return (Int(r.status.code), r.headers.first(name: "content-type"), String(buffer: body))
    }

    @Test("content state is shown as text: <script> and attribute breakouts are escaped")
    func escaped() async throws {
        try await IsleSim.withRunning(clock: ManualWallClock(Pizza.t0)) { sim in
            let device = sim.world.createDevice(name: "<b>Phone</b>")
            _ = try Pizza.install(sim.world, on: device)
            _ = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes",
                                              attributes: ["numberOfPizzas": 1, "totalAmount": "$1", "orderNumber": #""><img src=x onerror=alert(1)>"#],
                                              contentState: ["driverName": "<script>alert(1)</script>", "deliveryTimer": [788_918_400, 788_919_900]])
            let page = try await Self.get(await sim.controlURL() + "/phone/\(device)")
            #expect(page.status == 200 && page.type?.hasPrefix("text/html") == true)
            #expect(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"))
            #expect(!page.body.contains("<script>alert(1)"))
            #expect(page.body.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;") && !page.body.contains("<img"))
            #expect(page.body.contains("&lt;b&gt;Phone&lt;/b&gt;"))
            // The page's own script is the only one.
            #expect(page.body.components(separatedBy: "<script>").count == 2)
            #expect(try await Self.get(await sim.controlURL() + "/phone/nope").status == 404)
        }
    }

    @Test("templates: the pizza and adventure types have their own; any other type gets its fields")
    func templates() async throws {
        try await IsleSim.withRunning(clock: ManualWallClock(Pizza.t0)) { sim in
            let device = sim.world.createDevice(name: "iPhone")
            let adventure = try ActivitySchema(jsonText: #"{"attributesType":"AdventureAttributes","attributes":{"hero":"string"},"contentState":{"currentHealthLevel":"double","eventDescription":"string"}}"#)
            let score = try ActivitySchema(jsonText: #"{"attributesType":"ScoreAttributes","attributes":{"match":"string"},"contentState":{"home":"int","away":"int"}}"#)
            try sim.world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema, adventure, score]), on: device)
            _ = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "AdventureAttributes", attributes: ["hero": "Power Panda"],
                                              contentState: ["currentHealthLevel": 0.75, "eventDescription": "Found a treasure"])
            // Data, not a promise: a health far out of range draws (as full), it does not trap.
            _ = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "AdventureAttributes", attributes: ["hero": "Overflow"],
                                              contentState: ["currentHealthLevel": .number(JSONNumber(1e300)), "eventDescription": "Too much"])
            _ = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "ScoreAttributes", attributes: ["match": "7"], contentState: ["home": 2, "away": 1])
            let page = try await Self.get(await sim.controlURL() + "/phone/\(device)").body
            #expect(page.contains("Power Panda") && page.contains("<meter") && page.contains("Found a treasure"))
            #expect(page.contains("<dt>home</dt><dd>2</dd>") && page.contains("ScoreAttributes"))
            #expect(page.contains("data-mode=\"minimal\"") && page.contains("Overflow"))
            // An app-side end at a date beyond any time is a 400 naming the field, not a trap.
            let activity = try #require(try sim.world.device(device).activities.first)
            var end = HTTPClientRequest(url: await sim.controlURL() + "/devices/\(device)/activities/\(activity.id)/end")
            end.method = .POST
            end.body = .bytes(ByteBuffer(string: #"{"dismissAt":1e300}"#))
            let answer = try await HTTPClient.shared.execute(end, timeout: .seconds(10))
            #expect(answer.status.code == 400)
            #expect(String(buffer: try await answer.body.collect(upTo: 1 << 16)).contains("dismissAt"))
        }
    }

    @Test("the stream sends the screen now and again after every change")
    func liveStream() async throws {
        try await IsleSim.withRunning(clock: ManualWallClock(Pizza.t0)) { sim in
            let device = sim.world.createDevice(name: "iPhone")
            _ = try Pizza.install(sim.world, on: device)
            let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: await sim.controlURL() + "/phone/\(device)/stream"), timeout: .seconds(30))
            #expect(response.headers.first(name: "content-type") == "text/event-stream")
            let reader = EventReader(response.body)
            func next(until text: String) async throws {
                try await withDeadline(.seconds(10), "an event with \(text)") { try await reader.read(until: text) }
            }
            try await next(until: "No Live Activities")
            #expect(await reader.text.hasPrefix("event: screen\ndata: "))
            let a = try sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                  contentState: Pizza.state("Bill James"))
            try await next(until: "Bill James")
            let token = try await sim.world.waitForPushToken(activityID: a.id, on: device)
            _ = await sim.world.deliver(token: token, pushType: "liveactivity", topic: Pizza.bundleID + ".push-type.liveactivity", priority: 10,
                                        payload: Pizza.update(Pizza.t0, driver: "Anne Johnson"), apnsID: UUID().uuidString.lowercased())
            try await next(until: "Anne Johnson")
        }
    }
}

/// Reads a streamed body until some text has arrived.
actor EventReader {
    var iterator: HTTPClientResponse.Body.AsyncIterator
    var text = ""
    init(_ body: HTTPClientResponse.Body) { iterator = body.makeAsyncIterator() }

    func read(until wanted: String) async throws {
        while !text.contains(wanted) {
            var it = iterator
            guard let chunk = try await it.next(isolation: self) else { throw DeadlineExceeded(what: "more of the stream (it ended)", after: .zero) }
            iterator = it
            text += String(buffer: chunk)
        }
    }
}
