import AsyncHTTPClient
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import NIOCore
import Testing

/// The control API over real HTTP, including every error path's shape.
struct Control {
    let base: String
    let client: HTTPClient

    func call(_ method: String, _ path: String, _ body: String? = nil) async throws -> (status: Int, json: JSONValue) {
        var r = HTTPClientRequest(url: base + path)
        r.method = .init(rawValue: method)
        if let body { r.body = .bytes(ByteBuffer(string: body)) }
        let response = try await client.execute(r, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 4 << 20)
        let json = bytes.readableBytes == 0 ? JSONValue.null : try JSONParser.parse(Array(buffer: bytes))
        return (Int(response.status.code), json)
    }

    static func with(_ body: (Control, IsleSim, ManualWallClock) async throws -> Void) async throws {
        let clock = ManualWallClock(Pizza.t0)
        try await IsleSim.withRunning(clock: clock) { sim in
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                try await body(Control(base: await sim.controlURL(), client: client), sim, clock)
                try await client.shutdown()
            } catch {
                try? await client.shutdown()
                throw error
            }
        }
    }
}

@Suite("Simulator control API")
struct ControlAPITests {
    static let schemaJSON = Pizza.schema.jsonValue.jsonString

    @Test("devices, apps, activities, settings, clock, screen and events")
    func flow() async throws {
        try await Control.with { c, _, _ in
            let d = try await c.call("POST", "/devices", #"{"name":"iPhone 17"}"#)
            #expect(d.status == 201)
            let id = try #require(d.json["id"]?.stringValue)
            let app = try await c.call("POST", "/devices/\(id)/apps", #"{"bundleID":"com.example.pizza","schemas":[\#(Self.schemaJSON)],"frequentUpdates":true,"localization":{"K":"Order %@"}}"#)
            #expect(app.status == 201)
            #expect(app.json["pushToStartTokens"]?["PizzaDeliveryAttributes"]?.stringValue?.count == 80)
            let a = try await c.call("POST", "/devices/\(id)/apps/com.example.pizza/activities",
                                     #"{"attributesType":"PizzaDeliveryAttributes","attributes":\#(Pizza.attributes.jsonString),"contentState":\#(Pizza.state().jsonString),"relevanceScore":50}"#)
            #expect(a.status == 201)
            let activity = try #require(a.json["id"]?.stringValue)
            #expect(a.json["updateToken"]?.stringValue?.count == 160)
            let r1 = try await c.call("GET", "/devices/\(id)/screen")

            #expect(r1.json["dynamicIsland"] == "compact")
            let adv = try await c.call("POST", "/clock/advance", #"{"seconds":28800}"#)
            #expect(adv.status == 200 && adv.json["unix"] == .double(Pizza.t0.timeIntervalSince1970 + 28800))
            let r2 = try await c.call("GET", "/devices/\(id)")

            #expect(r2.json["activities"]?.arrayValue?.first?["state"] == "ended")
            let events = try await c.call("GET", "/devices/\(id)/events")
            #expect(events.json.arrayValue?.contains { $0["message"]?.stringValue?.contains("8 hours") == true } == true)
            let settings = try await c.call("PATCH", "/devices/\(id)/apps/com.example.pizza/settings", #"{"liveActivitiesEnabled":false}"#)
            #expect(settings.status == 200 && settings.json["liveActivitiesEnabled"] == false)
            let refused = try await c.call("POST", "/devices/\(id)/apps/com.example.pizza/activities",
                                           #"{"attributesType":"PizzaDeliveryAttributes","attributes":\#(Pizza.attributes.jsonString),"contentState":\#(Pizza.state().jsonString)}"#)
            #expect(refused.status == 422 && refused.json["error"]?["code"] == "denied")
            let r3 = try await c.call("POST", "/devices/\(id)/activities/\(activity)/dismiss")

            #expect(r3.status == 200)
            let rotated = try await c.call("POST", "/devices/\(id)/apps/com.example.pizza/push-to-start-tokens/PizzaDeliveryAttributes/rotate")
            #expect(rotated.status == 200 && rotated.json["token"]?.stringValue?.count == 80)
        }
    }

    @Test("keys, failures and the request log")
    func failuresAndLog() async throws {
        try await Control.with { c, sim, _ in
            let key = TestProviderKey()
            let pem = key.publicKeyPEM.replacingOccurrences(of: "\n", with: "\\n")
            let r4 = try await c.call("POST", "/keys", #"{"keyID":"\#(key.keyID)","teamID":"\#(key.teamID)","publicKeyPEM":"\#(pem)"}"#)

            #expect(r4.status == 201)
            let f1 = try await c.call("POST", "/failures", #"{"status":503,"reason":"ServiceUnavailable","times":2}"#)
            #expect(f1.status == 201)
            let r5 = try await c.call("POST", "/failures", #"{"latencyMilliseconds":100,"permanent":true}"#)

            #expect(r5.status == 201)
            let f2 = try await c.call("DELETE", "/failures")
            #expect(f2.status == 204)
            let r6 = try await c.call("GET", "/requests")

            #expect(r6.json == [])
            _ = sim
        }
    }

    struct BadRequest: Sendable, CustomTestStringConvertible {
        let method: String
        let path: String
        let body: String?
        let status: Int
        let field: String?
        var testDescription: String { "\(method) \(path) \(body ?? "") → \(status)" }
    }

    static let badRequestCases: [BadRequest] = [
        BadRequest(method: "POST", path: "/devices", body: "{oops", status: 400, field: nil),
        BadRequest(method: "POST", path: "/devices", body: "[1]", status: 400, field: nil),
        BadRequest(method: "GET", path: "/devices/nope", body: nil, status: 404, field: nil),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps", body: #"{"bundleID":""}"#, status: 400, field: "bundleID"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps", body: #"{"bundleID":"a.b","environment":"staging"}"#, status: 400, field: "environment"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps", body: #"{"bundleID":"a.b","schemas":[{"contentState":{}}]}"#, status: 400, field: "schemas[0]"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps", body: #"{"bundleID":"a.b","widgets":[{"family":"x"}]}"#, status: 400, field: "widgets[0].kind"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps", body: #"{"bundleID":"com.example.pizza"}"#, status: 409, field: "bundleID"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps/com.example.pizza/activities", body: #"{"attributesType":"PizzaDeliveryAttributes"}"#, status: 400, field: "attributes"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps/com.example.pizza/activities", body: #"{"attributesType":"Nope","attributes":{},"contentState":{}}"#, status: 422, field: "attributes-type"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps/com.example.pizza/activities", body: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":"3","totalAmount":"x","orderNumber":"1"},"contentState":{}}"#, status: 400, field: "attributes.numberOfPizzas"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps/com.example.pizza/activities", body: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{},"contentState":{},"pushType":"nope"}"#, status: 400, field: "pushType"),
        BadRequest(method: "POST", path: "/devices/DEVICE/apps/com.other/activities", body: #"{"attributesType":"A","attributes":{},"contentState":{}}"#, status: 404, field: nil),
        BadRequest(method: "PATCH", path: "/devices/DEVICE/apps/com.example.pizza/settings", body: #"{"frequentUpdatesEnabled":"yes"}"#, status: 400, field: "frequentUpdatesEnabled"),
        BadRequest(method: "POST", path: "/devices/DEVICE/activities/none/dismiss", body: nil, status: 404, field: nil),
        BadRequest(method: "POST", path: "/devices/DEVICE/activities/none/explode", body: nil, status: 404, field: nil),
        BadRequest(method: "POST", path: "/clock/advance", body: #"{}"#, status: 400, field: "seconds"),
        BadRequest(method: "POST", path: "/clock/advance", body: #"{"seconds":-5}"#, status: 400, field: "seconds"),
        BadRequest(method: "POST", path: "/keys", body: #"{"keyID":"ABC","teamID":"DEF123GHIJ","publicKeyPEM":"x"}"#, status: 400, field: "publicKeyPEM"),
        BadRequest(method: "POST", path: "/failures", body: #"{"times":0,"status":500}"#, status: 400, field: "times"),
        BadRequest(method: "POST", path: "/failures", body: #"{"status":42}"#, status: 400, field: "status"),
        BadRequest(method: "POST", path: "/failures", body: #"{}"#, status: 400, field: "status"),
    ]

    @Test("bad requests: a 4xx with {error: {code, message, field}}, never a 500", arguments: badRequestCases)
    func badRequests(_ b: BadRequest) async throws {
        try await Control.with { c, sim, _ in
            let device = sim.world.createDevice(name: "d")
            _ = try Pizza.install(sim.world, on: device)
            let r = try await c.call(b.method, b.path.replacingOccurrences(of: "DEVICE", with: device), b.body)
            #expect(r.status == b.status, "\(r.json.jsonString)")
            #expect(r.json["error"]?["message"]?.stringValue?.isEmpty == false, "\(r.json.jsonString)")
            if let field = b.field { #expect(r.json["error"]?["field"]?.stringValue == field, "\(r.json.jsonString)") }
        }
    }
}
