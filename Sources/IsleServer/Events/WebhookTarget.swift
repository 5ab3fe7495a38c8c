import Foundation
import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Where a webhook may connect (docs/security.md, "Webhooks"). A backend key — or whoever stole
/// one — chooses a webhook's URL, and the server then POSTs there from inside its network; so by
/// default a webhook reaches only public unicast addresses. The host is resolved here, every
/// address it resolves to is checked, and the connection goes to the checked address (the name is
/// kept for TLS): a name that resolves to loopback, or that changes its answer between the check
/// and the connection (DNS rebinding), cannot lead inside. Redirects are never followed.
struct WebhookTarget: Sendable, Hashable {
    /// The URL's host, as written (without brackets).
    var host: String
    /// The checked address to connect to.
    var address: String
    /// Whether ``host`` is an address itself (nothing to resolve, no name for TLS).
    var hostIsAddress: Bool

    /// Why a URL may not be reached; its text is what the backend sees (no errno, no internals).
    struct Refusal: Error, Sendable, Hashable, CustomStringConvertible {
        var code: String
        var message: String
        var description: String { message }
    }

    /// What kind of address an IP address is.
    enum Kind: String, Sendable {
        case global = "public"
        case loopback, privateNetwork = "private", linkLocal = "link-local", sharedNAT = "carrier-grade NAT"
        case multicast, unspecified, reserved = "reserved"

        /// Addresses that are never a webhook's, whatever the operator allows (no unicast host is there).
        var neverAllowed: Bool { self == .multicast || self == .unspecified || self == .reserved }
    }

    /// Checks `url`'s host under `settings`, resolving it with `resolve` (getaddrinfo by default).
    static func check(url: String, settings: WebhookSettings,
                      resolve: @Sendable (String) async throws -> [[UInt8]] = WebhookTarget.resolve) async -> Result<WebhookTarget, Refusal> {
        guard let components = URLComponents(string: url), var host = components.host, !host.isEmpty else {
            return .failure(Refusal(code: "webhookURLInvalid", message: "refused: the URL has no host"))
        }
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        // The operator's list names the only hosts a webhook may use; a host on it may be private
        // (the operator's own backend inside its network).
        let named = settings.allowedHosts != nil
        if named, !settings.allows(host: host) {
            return .failure(Refusal(code: "webhookHostNotAllowed", message: "refused: this server sends webhooks only to \((settings.allowedHosts ?? []).joined(separator: ", ")) (isle serve --webhook-hosts)"))
        }
        let literal = Self.parse(host)
        let addresses: [[UInt8]]
        if let literal {
            addresses = [literal]
        } else {
            do { addresses = try await resolve(host) } catch {
                return .failure(Refusal(code: "webhookHostUnresolvable", message: "refused: \(host) does not resolve to an address"))
            }
            guard !addresses.isEmpty else { return .failure(Refusal(code: "webhookHostUnresolvable", message: "refused: \(host) does not resolve to an address")) }
        }
        // Every address the name has must pass: the connection may not pick the one checked.
        for a in addresses {
            let kind = Self.kind(a)
            if kind.neverAllowed {
                return .failure(Refusal(code: "webhookAddressNotAllowed", message: "refused: \(host) is a \(kind.rawValue) address, which no webhook may use"))
            }
            if kind != .global, !settings.allowPrivate, !named {
                return .failure(Refusal(code: "webhookAddressNotAllowed",
                                        message: "refused: \(host) \(literal == nil ? "resolves to" : "is") a \(kind.rawValue) address; this server sends webhooks only to public addresses (an operator allows a private host with isle serve --webhook-hosts)"))
            }
        }
        return .success(WebhookTarget(host: host, address: Self.text(addresses[0]), hostIsAddress: literal != nil))
    }

    // MARK: Addresses

    /// The kind of a 4- or 16-byte address (IANA special-purpose registries).
    static func kind(_ a: [UInt8]) -> Kind {
        if a.count == 4 { return kind4(a) }
        guard a.count == 16 else { return .reserved }
        if a.allSatisfy({ $0 == 0 }) { return .unspecified }
        if a[0..<15].allSatisfy({ $0 == 0 }) && a[15] == 1 { return .loopback }
        // IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96): the IPv4 address decides.
        if a[0..<10].allSatisfy({ $0 == 0 }) && a[10] == 0xff && a[11] == 0xff { return kind4(Array(a[12..<16])) }
        if a[0..<12].allSatisfy({ $0 == 0 }) { return kind4(Array(a[12..<16])) }
        if a[0] == 0x00, a[1] == 0x64, a[2] == 0xff, a[3] == 0x9b { return kind4(Array(a[12..<16])) }
        // 6to4 (2002::/16) embeds an IPv4 address; Teredo (2001::/32) hides one.
        if a[0] == 0x20, a[1] == 0x02 { return kind4(Array(a[2..<6])) }
        if a[0] == 0x20, a[1] == 0x01, a[2] == 0x00, a[3] == 0x00 { return .reserved }
        if a[0] == 0xff { return .multicast }
        if a[0] == 0xfe, a[1] & 0xc0 == 0x80 { return .linkLocal }       // fe80::/10
        if a[0] == 0xfe, a[1] & 0xc0 == 0xc0 { return .privateNetwork }         // fec0::/10, site-local (deprecated)
        if a[0] & 0xfe == 0xfc { return .privateNetwork }                        // fc00::/7, unique local
        if a[0] == 0x20, a[1] == 0x01, a[2] == 0x0d, a[3] == 0xb8 { return .reserved }  // 2001:db8::/32, documentation
        if a[0] == 0x01, a[1] == 0x00, a[2..<8].allSatisfy({ $0 == 0 }) { return .reserved }  // 100::/64, discard
        if a[0] & 0xe0 != 0x20 { return .reserved }                      // outside 2000::/3, global unicast
        return .global
    }

    static func kind4(_ a: [UInt8]) -> Kind {
        switch (a[0], a[1], a[2]) {
        case (0, _, _): return .unspecified                               // 0.0.0.0/8, "this network"
        case (127, _, _): return .loopback
        case (10, _, _): return .privateNetwork
        case (172, 16...31, _): return .privateNetwork
        case (192, 168, _): return .privateNetwork
        case (169, 254, _): return .linkLocal                             // cloud metadata lives here
        case (100, 64...127, _): return .sharedNAT                        // 100.64.0.0/10
        case (192, 0, 0): return .privateNetwork                                 // IETF protocol assignments
        case (198, 18...19, _): return .privateNetwork                           // benchmarking
        case (192, 0, 2), (198, 51, 100), (203, 0, 113): return .reserved  // documentation
        case (224...239, _, _): return .multicast
        case (240...255, _, _): return .reserved                          // reserved, and the broadcast address
        default: return .global
        }
    }

    /// A literal IPv4 or IPv6 address's bytes; nil for a name.
    static func parse(_ host: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    /// An address's text (`127.0.0.1`, `::1`).
    static func text(_ a: [UInt8]) -> String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = a.count == 4 ? AF_INET : AF_INET6
        let ok = a.withUnsafeBytes { raw in inet_ntop(family, raw.baseAddress, &buffer, socklen_t(buffer.count)) != nil }
        return ok ? String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
    }

    /// Every address `host` resolves to (getaddrinfo, on NIO's thread pool: it blocks).
    @Sendable static func resolve(_ host: String) async throws -> [[UInt8]] {
        try await NIOThreadPool.singleton.runIfActive {
            var hints = addrinfo()
            hints.ai_family = AF_UNSPEC
            #if canImport(Darwin)
            hints.ai_socktype = SOCK_STREAM
            #else
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
            #endif
            var result: UnsafeMutablePointer<addrinfo>?
            let status = getaddrinfo(host, nil, &hints, &result)
            guard status == 0, let first = result else { throw Refusal(code: "webhookHostUnresolvable", message: "unresolvable") }
            defer { freeaddrinfo(first) }
            var addresses: [[UInt8]] = []
            var next: UnsafeMutablePointer<addrinfo>? = first
            while let info = next {
                if let sa = info.pointee.ai_addr {
                    switch Int32(sa.pointee.sa_family) {
                    case AF_INET:
                        var a = sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
                        addresses.append(withUnsafeBytes(of: &a) { Array($0) })
                    case AF_INET6:
                        var a = sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr }
                        addresses.append(withUnsafeBytes(of: &a) { Array($0) })
                    default: break
                    }
                }
                next = info.pointee.ai_next
            }
            var seen = Set<[UInt8]>()
            return addresses.filter { seen.insert($0).inserted }
        }
    }
}
