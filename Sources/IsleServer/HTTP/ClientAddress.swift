import Foundation
import Hummingbird
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An address range (`10.0.0.0/8`, `127.0.0.1`, `fd00::/8`) of proxies whose `X-Forwarded-For` Isle
/// believes (`isle serve --trusted-proxies`; docs/server.md, "Behind a reverse proxy").
public struct AddressRange: Sendable, Hashable, CustomStringConvertible {
    let bytes: [UInt8]
    let prefix: Int
    public let description: String

    /// Nil for text that is not an IPv4 or IPv6 address with an optional `/prefix` in range.
    public init?(_ text: String) {
        let parts = text.trimmingCharacters(in: .whitespaces).split(separator: "/", maxSplits: 1).map(String.init)
        guard let first = parts.first, let bytes = Self.parse(first) else { return nil }
        let bits = bytes.count * 8
        var prefix = bits
        if parts.count == 2 {
            guard let p = Int(parts[1]), (0...bits).contains(p) else { return nil }
            prefix = p
        }
        self.bytes = bytes
        self.prefix = prefix
        description = parts.count == 2 ? "\(first)/\(prefix)" : first
    }

    /// The 4 or 16 bytes of an IPv4 or IPv6 address (an IPv4-mapped IPv6 address as IPv4).
    static func parse(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        let b = withUnsafeBytes(of: &v6) { Array($0) }
        if b[0..<10].allSatisfy({ $0 == 0 }), b[10] == 0xff, b[11] == 0xff { return Array(b[12...]) }
        return b
    }

    public func contains(_ address: String) -> Bool {
        guard let a = Self.parse(address), a.count == bytes.count else { return false }
        var left = prefix
        for i in 0..<bytes.count where left > 0 {
            let take = min(8, left)
            let mask = UInt8(truncatingIfNeeded: 0xff << (8 - take))
            if a[i] & mask != bytes[i] & mask { return false }
            left -= take
        }
        return true
    }
}

/// The client's real address behind trusted proxies: when the connection comes from one of
/// `trusted`, the rightmost `X-Forwarded-For` entry that is not itself a trusted proxy (entries
/// to its left could have been written by the client). Otherwise the header is ignored: a client
/// cannot choose the address its limits are counted against.
struct ClientAddressMiddleware: RouterMiddleware {
    typealias Context = IsleRequestContext
    let trusted: [AddressRange]

    static func clientAddress(peer: String?, forwardedFor: [String], trusted: [AddressRange]) -> String? {
        guard let peer, trusted.contains(where: { $0.contains(peer) }) else { return peer }
        let hops = forwardedFor.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        for hop in hops.reversed() {
            // `[v6]:port`, `[v6]`, `v4:port` (some proxies add the port), `v6`, `v4`.
            var address = hop.hasPrefix("[") ? String(hop.dropFirst().prefix { $0 != "]" }) : hop
            if !hop.hasPrefix("["), address.filter({ $0 == ":" }).count == 1 { address = String(address.prefix { $0 != ":" }) }
            guard AddressRange.parse(address) != nil else { return peer }  // garbage: keep the proxy's own
            if !trusted.contains(where: { $0.contains(address) }) { return address }
        }
        return peer
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard !trusted.isEmpty else { return try await next(request, context) }
        var context = context
        context.remoteAddress = Self.clientAddress(peer: context.remoteAddress, forwardedFor: request.headers[values: .init("X-Forwarded-For")!], trusted: trusted)
        return try await next(request, context)
    }
}
