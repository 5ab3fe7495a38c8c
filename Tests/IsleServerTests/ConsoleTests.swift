import AsyncHTTPClient
import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import NIOCore
import Testing

/// The operator console (issue 13): an admin key signs in, backend and device keys are refused,
/// pages escape what they print, an update composed there is validated before it is queued.
/// The same pages in a real Chromium: scripts/browser-test.sh.
@Suite("Isle server console")
struct ConsoleTests {
    struct Page {
        var status: Int
        var cookie: String?
        var location: String?
        var text: String
    }

    /// A browser-like client that shows redirects instead of following them.
    static let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(redirectConfiguration: .disallow))

    static func send(_ f: ServerFixture, _ method: String, _ path: String, form: [String: String]? = nil, cookie: String? = nil, bearer: String? = nil) async throws -> Page {
        var r = HTTPClientRequest(url: "http://127.0.0.1:\(await f.server.port)\(path)")
        r.method = .init(rawValue: method)
        if let cookie { r.headers.add(name: "cookie", value: cookie) }
        if let bearer { r.headers.add(name: "authorization", value: "Bearer \(bearer)") }
        if let form {
            r.headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
            let allowed = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-._~"))
            r.body = .bytes(ByteBuffer(string: form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&")))
        }
        let response = try await client.execute(r, timeout: .seconds(20))
        let body = try await response.body.collect(upTo: 4 << 20)
        let cookie = response.headers.first(name: "set-cookie").map { String($0.split(separator: ";")[0]) }
        return Page(status: Int(response.status.code), cookie: cookie, location: response.headers.first(name: "location"), text: String(buffer: body))
    }

    static func signIn(_ f: ServerFixture) async throws -> String {
        let admin = try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
        let r = try await send(f, "POST", "/console/login", form: ["key": admin])
        #expect(r.status == 303 && r.location == "/console")
        return try #require(r.cookie)
    }

    @Test("never open: the login page without a session; backend and device keys are refused, in the form and as a bearer; an admin key signs in")
    func refusesOtherKeys() async throws {
        try await ServerFixture.with { f in
            let anonymous = try await Self.send(f, "GET", "/console")
            #expect(anonymous.status == 200 && anonymous.text.contains("Admin key") && !anonymous.text.contains(Pizza.bundleID))
            #expect(try await Self.send(f, "GET", "/console/stats").status == 401)
            for key in [f.backendKey, f.deviceKey] {
                let r = try await Self.send(f, "POST", "/console/login", form: ["key": key])
                #expect(r.status == 403 && r.cookie == nil && r.text.contains("admin key only"))
                #expect(try await Self.send(f, "GET", "/console/stats", bearer: key).status == 403)
            }
            #expect(try await Self.send(f, "POST", "/console/login", form: ["key": "isle_admin_nope"]).status == 403)
            let cookie = try await Self.signIn(f)
            let home = try await Self.send(f, "GET", "/console", cookie: cookie)
            #expect(home.status == 200 && home.text.contains(Pizza.bundleID) && home.text.contains("In flight"))
            let stats = try await Self.send(f, "GET", "/console/stats", cookie: cookie)
            #expect(stats.status == 200 && stats.text.contains("\"queued\""))
            // An admin key is for the console only.
            let admin = try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
            #expect(try await f.call("GET", "/v1/activities/by-key/x", key: admin).status == 403)
            // A form from another site is refused.
            var r = HTTPClientRequest(url: "http://127.0.0.1:\(await f.server.port)/console/logout")
            r.method = .POST
            r.headers.add(name: "origin", value: "http://evil.example")
            r.headers.add(name: "cookie", value: cookie)
            #expect(try await f.http.execute(r, timeout: .seconds(10)).status.code == 403)
        }
    }

    @Test("find an activity by key, see its deliveries with status 200; a composed update is validated before it is queued")
    func timelineAndCompose() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-<b>1</b>")
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Anne Johnson")]).status == 202)
            try await f.waitForDevice("Anne") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Anne Johnson" }
            try await eventually("the delivery recorded") {
                try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.first?["status"] == 200
            }
            let cookie = try await Self.signIn(f)
            let found = try await Self.send(f, "GET", "/console/activities?key=order-%3Cb%3E1%3C%2Fb%3E", cookie: cookie)
            #expect(found.status == 200 && found.text.contains("/console/activities/\(id)") && found.text.contains("order-&lt;b&gt;1&lt;/b&gt;") && !found.text.contains("<b>1</b>"))
            // Without a key or topic: the newest, filtered by state.
            let active = try await Self.send(f, "GET", "/console/activities?state=active", cookie: cookie)
            #expect(active.status == 200 && active.text.contains("/console/activities/\(id)"))
            #expect(!(try await Self.send(f, "GET", "/console/activities?state=ended", cookie: cookie)).text.contains("/console/activities/\(id)"))
            #expect(try await Self.send(f, "GET", "/console/activities?state=bogus", cookie: cookie).status == 400)
            let page = try await Self.send(f, "GET", "/console/activities/\(id)", cookie: cookie)
            #expect(page.text.contains("<td class=\"status\">200</td>"))
            // Invalid: the validator's error, nothing queued.
            let before = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count
            let bad = try await Self.send(f, "POST", "/console/activities/\(id)/compose", form: ["event": "update", "body": #"{"contentState":{"driverName":5}}"#], cookie: cookie)
            #expect(bad.status == 422 && bad.text.contains("contentState.driverName") && bad.text.contains("class=\"error\""), "\(bad.text.prefix(2000))")
            // Valid: queued, and it reaches the phone.
            let good = try await Self.send(f, "POST", "/console/activities/\(id)/compose",
                                           form: ["event": "update", "body": #"{"contentState":{"driverName":"From the console","deliveryTimer":[788918400,788919900]}}"#], cookie: cookie)
            #expect(good.status == 200 && good.text.contains("Queued as job"))
            try await f.waitForDevice("the console's update") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "From the console" }
            try await eventually("both deliveries recorded") {
                try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count == (before ?? 0) + 1
            }
        }
    }
}
