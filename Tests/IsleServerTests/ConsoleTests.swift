import AsyncHTTPClient
import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import NIOCore
import Testing

/// The operator console (docs/server.md, "The console"): an admin key signs in, backend and device keys are refused,
/// pages escape what they print, an update composed there is validated before it is queued.
/// The same pages in a real Chromium: scripts/browser-test.sh.
@Suite("Isle server console")
struct ConsoleTests {
    struct Page {
        var status: Int
        var cookie: String?
        /// The whole Set-Cookie header, attributes included.
        var setCookie: String? = nil
        var csp: String? = nil
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
        return Page(status: Int(response.status.code), cookie: cookie, setCookie: response.headers.first(name: "set-cookie"), csp: response.headers.first(name: "content-security-policy"),
                    location: response.headers.first(name: "location"), text: String(buffer: body))
    }

    static func signIn(_ f: ServerFixture) async throws -> String {
        try await signInWithKey(f).cookie
    }

    static func signInWithKey(_ f: ServerFixture) async throws -> (cookie: String, keyID: String, page: Page) {
        let admin = try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin)
        let r = try await send(f, "POST", "/console/login", form: ["key": admin.secret])
        #expect(r.status == 303 && r.location == "/console")
        return (try #require(r.cookie), admin.id, r)
    }

    @Test("never open: the login page without a session; backend and device keys are refused, in the form and as a bearer; an admin key signs in")
    func refusesOtherKeys() async throws {
        try await ServerFixture.with { f in
            let anonymous = try await Self.send(f, "GET", "/console")
            #expect(anonymous.status == 200 && anonymous.text.contains("Admin key") && !anonymous.text.contains(Pizza.bundleID))
            #expect(try await Self.send(f, "GET", "/console/stats").status == 401)
            // Unknown and other-scope keys get the same answer: the page never says what a key is.
            let unknown = try await Self.send(f, "POST", "/console/login", form: ["key": "isle_admin_nope"])
            #expect(unknown.status == 403 && unknown.cookie == nil && unknown.text.contains("takes an admin key"))
            for key in [f.backendKey, f.deviceKey] {
                let r = try await Self.send(f, "POST", "/console/login", form: ["key": key])
                #expect(r.status == 403 && r.cookie == nil && r.text == unknown.text, "the answer to a \(key.prefix(10))… key names nothing of it")
                #expect(!r.text.contains("backend key") && !r.text.contains("device key") && !r.text.contains("That is a"))
                let bearer = try await Self.send(f, "GET", "/console/stats", bearer: key)
                let nope = try await Self.send(f, "GET", "/console/stats", bearer: "isle_backend_nope")
                #expect(bearer.status == 401 && bearer.text == nope.text)
            }
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

    @Test("sessions and secrets: revoking the key ends its sessions within a second; sign-in failures throttled per address; no inline script; Secure when asked; 413 and 400 for what a form or search cannot be")
    func sessionsAndSecrets() async throws {
        try await ServerFixture.with(server: { c in c.authFailureLimit = RateLimit(perSecond: 0.01, burst: 3) }) { f in
            let (cookie, keyID, login) = try await Self.signInWithKey(f)
            #expect(login.setCookie?.contains("HttpOnly") == true && login.setCookie?.contains("Secure") == false, "plain HTTP by default: \(login.setCookie ?? "")")
            let home = try await Self.send(f, "GET", "/console", cookie: cookie)
            // The CSP allows no inline script, and the page has none: its script is a file.
            let csp = try #require(home.csp)
            #expect(csp.contains("script-src 'self'") && !csp.contains("'unsafe-inline' 'self'") && !(csp.split(separator: ";").first { $0.contains("script-src") }?.contains("unsafe-inline") ?? true))
            #expect(home.text.contains("<script src=\"/console/console.js\"></script>") && !home.text.contains("<script>"))
            let script = try await Self.send(f, "GET", "/console/console.js")
            #expect(script.status == 200 && script.text.contains("/console/stats"))
            // A search holding U+0000 is a 400 naming the field, not a 500.
            let nul = try await Self.send(f, "GET", "/console/activities?key=a%00b", cookie: cookie)
            #expect(nul.status == 400 && nul.text.contains("\"key\""), "\(nul.status) \(nul.text.prefix(300))")
            // Revoking the admin key ends the session within a second (the key is re-read at most once a second).
            #expect(try await Self.send(f, "GET", "/console/stats", cookie: cookie).status == 200)
            #expect(try await SQLiteStore(path: f.databasePath).revokeAPIKey(id: keyID, at: Date()))
            // The key is re-read at most a second after it was last read (a 1-second cache), so the
            // session ends within a second of the revocation plus a request's time; on a loaded
            // machine that request time is what varies, so the wait has a generous deadline.
            try await eventually(within: .seconds(10), "the revoked key's session to end") {
                try await Self.send(f, "GET", "/console/stats", cookie: cookie).status == 401
            }
            #expect(try await Self.send(f, "GET", "/console", cookie: cookie).text.contains("Admin key"))
            // A form over 1 MiB is a 413 before any sign-in, not a 500.
            let big = try await Self.send(f, "POST", "/console/login", form: ["key": String(repeating: "k", count: (1 << 20) + 10)])
            #expect(big.status == 413, "\(big.status)")
            // Wrong keys: 3 refused, then this address is held back (429), even with a right key.
            for _ in 0..<3 { #expect(try await Self.send(f, "POST", "/console/login", form: ["key": "isle_admin_guess"]).status == 403) }
            let held = try await Self.send(f, "POST", "/console/login", form: ["key": "isle_admin_guess"])
            #expect(held.status == 429 && held.text.contains("Too many failed sign-ins"))
            let right = try await ServerSetup.createKey(store: try SQLiteStore(path: f.databasePath), bundleID: Pizza.bundleID, scope: .admin).secret
            #expect(try await Self.send(f, "POST", "/console/login", form: ["key": right]).status == 429)
            #expect(try await Self.send(f, "GET", "/console/stats", bearer: "isle_admin_guess").status == 429)
        }
        // Behind HTTPS: the cookie is Secure.
        try await ServerFixture.with(server: { c in c.secureCookies = true }) { f in
            let (cookie, _, login) = try await Self.signInWithKey(f)
            #expect(login.setCookie?.contains("; Secure") == true, "\(login.setCookie ?? "")")
            let out = try await Self.send(f, "POST", "/console/logout", cookie: cookie)
            #expect(out.setCookie?.contains("; Secure") == true && out.setCookie?.contains("Max-Age=0") == true)
        }
    }
}
