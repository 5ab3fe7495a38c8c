import Foundation
@testable import IsleServer
import IsleTesting
import Testing

/// Behind a reverse proxy (`--trusted-proxies`; docs/server.md): limits per client address count
/// the real client's, from the proxy's `X-Forwarded-For`; nobody else can choose that address.
@Suite("Behind a reverse proxy", .serialized)
struct ProxyTests {
    @Test("address ranges: IPv4, IPv6, IPv4-mapped, prefixes; bad text refused")
    func ranges() throws {
        let r = try #require(AddressRange("10.0.0.0/8"))
        #expect(r.contains("10.1.2.3") && !r.contains("11.0.0.1") && r.contains("::ffff:10.9.9.9"))
        let one = try #require(AddressRange("127.0.0.1"))
        #expect(one.contains("127.0.0.1") && !one.contains("127.0.0.2"))
        let v6 = try #require(AddressRange("fd00::/8"))
        #expect(v6.contains("fd12:3456::1") && !v6.contains("fe80::1") && !v6.contains("10.0.0.1"))
        #expect(AddressRange("10.0.0.0/33") == nil && AddressRange("proxy.example.com") == nil && AddressRange("") == nil)
    }

    @Test("the client address: the rightmost untrusted X-Forwarded-For entry, only from a trusted proxy")
    func clientAddress() throws {
        let trusted = [AddressRange("127.0.0.1")!, AddressRange("10.0.0.0/8")!]
        func client(_ peer: String, _ xff: [String]) -> String? { ClientAddressMiddleware.clientAddress(peer: peer, forwardedFor: xff, trusted: trusted) }
        #expect(client("127.0.0.1", ["203.0.113.7"]) == "203.0.113.7")
        // The client wrote the left part itself; the proxies appended the right part.
        #expect(client("127.0.0.1", ["6.6.6.6, 203.0.113.7, 10.1.1.1"]) == "203.0.113.7")
        #expect(client("127.0.0.1", ["6.6.6.6", "203.0.113.7"]) == "203.0.113.7")
        #expect(client("127.0.0.1", ["[2001:db8::1]"]) == "2001:db8::1")
        #expect(client("127.0.0.1", ["203.0.113.7:51234"]) == "203.0.113.7")
        #expect(client("127.0.0.1", ["[2001:db8::1]:443"]) == "2001:db8::1")
        #expect(client("127.0.0.1", ["2001:db8::2"]) == "2001:db8::2")
        // Not from a trusted proxy: the header is the client's own claim, ignored.
        #expect(client("198.51.100.9", ["203.0.113.7"]) == "198.51.100.9")
        #expect(client("127.0.0.1", ["not-an-address"]) == "127.0.0.1")
        #expect(client("127.0.0.1", []) == "127.0.0.1")
    }

    @Test("per-address limits count the forwarded client behind a trusted proxy, and the connection's address otherwise")
    func limits() async throws {
        try await ServerFixture.with(server: { c in
            c.deviceAddressLimit = RateLimit(perSecond: 0.001, burst: 2)
            c.trustedProxies = [AddressRange("127.0.0.1")!]
        }) { f in
            func put(_ from: String) async throws -> Int {
                try await f.call("PUT", "/v1/installations/phone-\(UUID().uuidString.prefix(6))", key: f.deviceKey, body: [:], headers: [("X-Forwarded-For", from)]).status
            }
            let answers = [try await put("203.0.113.7"), try await put("203.0.113.7"), try await put("203.0.113.7")]
            #expect(answers == [200, 200, 429])
            // Another client behind the same proxy has its own allowance.
            let other = try await put("198.51.100.9")
            #expect(other == 200)
        }
        try await ServerFixture.with(server: { c in c.deviceAddressLimit = RateLimit(perSecond: 0.001, burst: 2) }) { f in
            // No trusted proxy: the header changes nothing; every request counts against 127.0.0.1.
            for (i, from) in ["203.0.113.7", "198.51.100.9", "192.0.2.1"].enumerated() {
                let status = try await f.call("PUT", "/v1/installations/phone-\(i)", key: f.deviceKey, body: [:], headers: [("X-Forwarded-For", from)]).status
                #expect(status == (i < 2 ? 200 : 429))
            }
        }
    }
}
