import AsyncHTTPClient
import Foundation
#if canImport(Glibc)
import Glibc
#endif
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
            // As on a phone, the push-to-start token is not in the install's answer: it comes a moment later.
            #expect(app.json["pushToStartTokens"]?["PizzaDeliveryAttributes"] == nil)
            try await eventually("the push-to-start token") {
                try await c.call("GET", "/devices/\(id)").json["apps"]?["com.example.pizza"]?["pushToStartTokens"]?["PizzaDeliveryAttributes"]?.stringValue?.count == 80
            }
            let a = try await c.call("POST", "/devices/\(id)/apps/com.example.pizza/activities",
                                     #"{"attributesType":"PizzaDeliveryAttributes","attributes":\#(Pizza.attributes.jsonString),"contentState":\#(Pizza.state().jsonString),"relevanceScore":50,"waitForPushToken":true}"#)
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

/// The control API answers this machine, not web pages or other hosts (issue: trust and hostile input).
@Suite("Simulator control API: loopback only")
struct ControlAPILoopbackTests {
    @Test("loopback is parsed as an address, not matched as a prefix", arguments: [
        ("127.0.0.1", true), ("127.1.2.3", true), ("localhost", true), ("LOCALHOST", true), ("::1", true), ("[::1]", true),
        ("::ffff:127.0.0.1", true), ("127.evil.example", false), ("127.0.0.1.nip.io", false), ("10.0.0.1", false),
        ("0.0.0.0", false), ("::", false), ("::ffff:10.0.0.1", false), ("", false), ("evil.example", false),
    ])
    func loopbackParsing(_ host: String, _ expected: Bool) {
        #expect(IsleSim.isLoopback(host) == expected, "\(host)")
    }

    /// One HTTP/1.1 request over a raw socket, so the Host and Origin headers are exactly these.
    /// The blocking socket calls run on a thread of their own, never on the cooperative pool the
    /// server's handlers need.
    static func raw(port: Int, _ method: String, _ path: String, headers: [String], body: String = "") async throws -> (status: Int, body: String) {
        let result: Result<(status: Int, body: String), any Error> = await withCheckedContinuation { continuation in
            Thread {
                continuation.resume(returning: Result { try rawBlocking(port: port, method, path, headers: headers, body: body) })
            }.start()
        }
        return try result.get()
    }

    static func rawBlocking(port: Int, _ method: String, _ path: String, headers: [String], body: String) throws -> (status: Int, body: String) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard connected == 0 else { throw DeadlineExceeded(what: "connecting to the control API", after: .zero) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var text = "\(method) \(path) HTTP/1.1\r\n"
        for h in headers { text += h + "\r\n" }
        text += "content-length: \(body.utf8.count)\r\nconnection: close\r\n\r\n" + body
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            response += buffer[0..<n]
        }
        let s = String(decoding: response, as: UTF8.self)
        let status = s.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return (status, s)
    }

    @Test("a Host that is not loopback (DNS rebinding) and an Origin from another site get 403 in the error shape; curl-like and same-origin requests pass")
    func hostAndOrigin() async throws {
        try await Control.with { c, _, _ in
            let port = try #require(URL(string: c.base)?.port)
            let ok = try await Self.raw(port: port, "GET", "/health", headers: ["Host: 127.0.0.1:\(port)"])
            #expect(ok.status == 200)
            let rebound = try await Self.raw(port: port, "POST", "/devices", headers: ["Host: attacker.example:\(port)"], body: #"{"name":"x"}"#)
            #expect(rebound.status == 403 && rebound.body.contains("forbiddenHost"), "\(rebound.body)")
            let prefix = try await Self.raw(port: port, "GET", "/devices", headers: ["Host: 127.attacker.example"])
            #expect(prefix.status == 403)
            let page = try await Self.raw(port: port, "POST", "/devices", headers: ["Host: 127.0.0.1:\(port)", "Origin: https://attacker.example", "Content-Type: text/plain"], body: #"{"name":"x"}"#)
            #expect(page.status == 403 && page.body.contains("forbiddenOrigin"), "\(page.body)")
            let sandboxed = try await Self.raw(port: port, "POST", "/devices", headers: ["Host: 127.0.0.1:\(port)", "Origin: null"], body: #"{"name":"x"}"#)
            #expect(sandboxed.status == 403)
            let sameOrigin = try await Self.raw(port: port, "POST", "/devices", headers: ["Host: 127.0.0.1:\(port)", "Origin: http://127.0.0.1:\(port)"], body: #"{"name":"x"}"#)
            #expect(sameOrigin.status == 201, "\(sameOrigin.body)")
            // Nothing the refused requests asked for happened.
            let devices = try await c.call("GET", "/devices")
            #expect(devices.json.arrayValue?.count == 1)
        }
    }

    @Test("widget timeline URLs must be http(s) on loopback")
    func timelineURLs() async throws {
        try await Control.with { c, _, _ in
            let d = try #require(try await c.call("POST", "/devices", "{}").json["id"]?.stringValue)
            for (url, field) in [("http://attacker.example/t.json", "widgets[0].url"), ("file:///etc/passwd", "widgets[0].url"), ("http://127.evil.example/t", "widgets[0].url")] {
                let r = try await c.call("POST", "/devices/\(d)/apps", #"{"bundleID":"com.example.w","widgets":[{"kind":"k","url":"\#(url)"}]}"#)
                #expect(r.status == 400 && r.json["error"]?["field"]?.stringValue == field, "\(url): \(r.json.jsonString)")
            }
            let local = try await c.call("POST", "/devices/\(d)/apps", #"{"bundleID":"com.example.w","widgets":[{"kind":"k","url":"http://127.0.0.1:9/t.json"}]}"#)
            #expect(local.status == 201)
        }
    }
}
