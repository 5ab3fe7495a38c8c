import Foundation

/// One HTTP/2 request as the APNs client hands it to a transport.
public struct APNsTransportRequest: Sendable {
    public var method: String
    /// Absolute URL: `https://api.push.apple.com:443/3/device/<token>`.
    public var url: String
    /// Headers in order; names lowercase.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(method: String, url: String, headers: [(name: String, value: String)], body: [UInt8]) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
    }

    public func value(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

/// What came back.
public struct APNsTransportResponse: Sendable {
    public var status: Int
    /// Names lowercase.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// The first value of a header; `name` lowercase (transports hand header names over lowercased, as HTTP/2 sends them).
    public func value(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

/// Failures below HTTP: no connection, TLS refused, timed out, connection lost mid-request.
public struct APNsTransportError: Error, Sendable, CustomStringConvertible {
    /// `overloaded`: more requests are waiting for a stream than the transport allows; nothing was sent.
    public enum Kind: String, Sendable { case timedOut, connectionFailed, tlsFailed, cancelled, overloaded, other }
    public let kind: Kind
    public let reason: String
    public init(kind: Kind, reason: String) {
        self.kind = kind
        self.reason = reason
    }
    public var description: String { "\(kind.rawValue): \(reason)" }
}

/// The HTTP/2 layer under ``APNsClient``. Swap it without touching callers (a faster HTTP/2
/// client, or an in-memory one for unit tests).
public protocol APNsTransport: Sendable {
    /// Sends one request and waits for the full response, or throws ``APNsTransportError``.
    func execute(_ request: APNsTransportRequest, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse
    /// Closes connections. Called once.
    func shutdown() async throws
}

/// The HTTP/2 clients Isle ships.
public enum APNsTransportKind: String, Sendable, Hashable, CaseIterable {
    /// ``NIOHTTP2Transport``: swift-nio-http2 directly, made for APNs (the default).
    case http2
    /// ``AsyncHTTPClientTransport``: AsyncHTTPClient, the general-purpose client.
    case asyncHTTPClient = "async-http-client"

    public static let `default` = APNsTransportKind.http2
}

/// Where APNs lives (docs/protocol.md §1.1, §7; docs/protocol.md, Wire).
public enum APNsEnvironment: Sendable, Hashable {
    case production
    case sandbox
    /// Any server that speaks APNs (such as Isle's simulator), with the CA certificates (PEM) to
    /// trust for it; `nil` trusts the system's roots. Broadcasts and channel management go to
    /// their own URLs when given (Apple serves them on other hosts; so does Isle's simulator),
    /// else to `url`.
    case custom(url: String, broadcastURL: String? = nil, managementURL: String? = nil, trustRootsPEM: String?)

    public var name: String {
        switch self {
        case .production: "production"
        case .sandbox: "sandbox"
        case .custom(let url, _, _, _): "custom (\(url))"
        }
    }

    public var endpoints: APNsEndpoints {
        switch self {
        case .production:
            APNsEndpoints(device: "https://api.push.apple.com:443", broadcast: "https://api-broadcast.push.apple.com:443", channelManagement: "https://api-manage-broadcast.push.apple.com:2196")
        case .sandbox:
            APNsEndpoints(device: "https://api.sandbox.push.apple.com:443", broadcast: "https://api-broadcast.sandbox.push.apple.com:443", channelManagement: "https://api-manage-broadcast.sandbox.push.apple.com:2195")
        case .custom(let url, let broadcast, let management, _):
            APNsEndpoints(device: url, broadcast: broadcast ?? url, channelManagement: management ?? url)
        }
    }

    public var trustRootsPEM: String? { if case .custom(_, _, _, let roots) = self { roots } else { nil } }
}

/// CA certificates to trust, as PEM text: one or several, as `cat a.pem b.pem` makes them — a
/// file without a final newline leaves `-----END CERTIFICATE----------BEGIN CERTIFICATE-----` on
/// one line, which is read as two certificates, not refused.
enum TrustRoots {
    static func normalized(_ pem: String) -> String {
        pem.replacingOccurrences(of: "-----END CERTIFICATE----------BEGIN", with: "-----END CERTIFICATE-----\n-----BEGIN")
    }
}

/// The three APNs services' base URLs; each can be overridden.
public struct APNsEndpoints: Sendable, Hashable {
    public var device: String
    public var broadcast: String
    public var channelManagement: String

    public init(device: String, broadcast: String, channelManagement: String) {
        self.device = Self.trimmed(device)
        self.broadcast = Self.trimmed(broadcast)
        self.channelManagement = Self.trimmed(channelManagement)
    }

    static func trimmed(_ url: String) -> String { url.hasSuffix("/") ? String(url.dropLast()) : url }
}

/// Both transports give each provider token its own connections (docs/protocol.md, Wire: "One
/// token per connection").
/// A request's provider token, by hashes: the token itself never leaves the header block.
struct ProviderCredential: Hashable, Sendable {
    /// The whole `authorization` value.
    var token: UInt64
    /// The JWT's header (`alg`, `kid`): one per signing key.
    var key: UInt64

    init(authorization: String?) {
        guard let value = authorization else {
            token = 0
            key = 0
            return
        }
        let utf8 = value.utf8
        token = Self.fnv1a(utf8[...])
        let jwt = value.hasPrefix("bearer ") ? utf8.dropFirst(7) : utf8[...]
        key = Self.fnv1a(jwt.firstIndex(of: UInt8(ascii: ".")).map { jwt[..<$0] } ?? jwt)
    }

    static func fnv1a(_ bytes: Substring.UTF8View) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return hash
    }
}
