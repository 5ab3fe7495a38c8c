public import Crypto
public import Foundation
import IsleCore
import IsleHTTPAPI
import IsleStore
public import IsleDelivery

/// A registration ticket (docs/security.md, "Binding comes from the backend"): a short-lived JWT
/// the app's backend signs (ES256) to say "this external key and/or this user belong to the app
/// that presents me". Isle stores only the public key; the backend keeps the private one — as in
/// OneSignal's identity verification.
///
/// Header `{"alg":"ES256","kid":"<ticket key id>","typ":"JWT"}`; claims:
/// - `aud`: the app's bundle id (required);
/// - `exp`: Unix seconds (required), at most ``maximumLifetime`` ahead;
/// - `key`: the activity's external key, and/or `user`: the installation's user id;
/// - `inst` (optional): the only installation that may present it.
public struct RegistrationTicket: Sendable, Hashable {
    public var bundleID: String
    public var expires: Date
    public var externalKey: String?
    public var userID: String?
    public var installationID: String?

    /// Tickets are short-lived: an `exp` further ahead than this is refused.
    public static let maximumLifetime: TimeInterval = 24 * 3600

    public init(bundleID: String, expires: Date, externalKey: String? = nil, userID: String? = nil, installationID: String? = nil) {
        self.bundleID = bundleID
        self.expires = expires
        self.externalKey = externalKey
        self.userID = userID
        self.installationID = installationID
    }

    /// Signs the ticket, as a backend does (Swift backends, `isle ticket`, tests).
    public func signed(with key: P256.Signing.PrivateKey, keyID: String) throws -> String {
        var claims: JSONObject = ["aud": .string(bundleID), "exp": .int(Int64(saturating: expires.timeIntervalSince1970.rounded(.down)))]
        if let externalKey { claims["key"] = .string(externalKey) }
        if let userID { claims["user"] = .string(userID) }
        if let installationID { claims["inst"] = .string(installationID) }
        let header: JSONValue = ["alg": "ES256", "kid": .string(keyID), "typ": "JWT"]
        let input = Self.base64url(header.jsonBytes) + "." + Self.base64url(JSONValue.object(claims).jsonBytes)
        let signature = try key.signature(for: Array(input.utf8))
        return input + "." + Self.base64url(Array(signature.rawRepresentation))
    }

    /// Why a ticket is refused: `code` for the API's error, `message` for people. Never echoes the ticket.
    public struct Refusal: Error, Sendable, Hashable {
        public var code: String
        public var message: String
    }

    /// Verifies `text` for `app` at `now`: signature by one of the app's ticket keys, audience,
    /// expiry and lifetime. What it names is checked by the caller.
    public static func verify(_ text: String, app: AppRecord, now: Date) throws(Refusal) -> RegistrationTicket {
        func refuse(_ code: String, _ message: String) -> Refusal { Refusal(code: code, message: message) }
        guard text.utf8.count <= 4096 else { throw refuse("invalidTicket", "the ticket is longer than 4096 bytes") }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = base64urlDecode(parts[0]), let claimBytes = base64urlDecode(parts[1]), let signatureBytes = base64urlDecode(parts[2]) else {
            throw refuse("invalidTicket", "the ticket is not a JWT (three base64url parts)")
        }
        guard let header = try? JSONParser.parse(headerBytes), header["alg"]?.stringValue == "ES256" else {
            throw refuse("invalidTicket", "the ticket's header must say alg ES256")
        }
        guard !app.ticketKeys.isEmpty else {
            throw refuse("noTicketKey", "\(app.bundleID) has no ticket key: make one with isle app ticket-key create (the backend keeps the private key)")
        }
        let kid = header["kid"]?.stringValue
        let candidates = kid.map { k in app.ticketKeys.filter { $0.id == k } } ?? app.ticketKeys
        guard !candidates.isEmpty else { throw refuse("invalidTicket", "the ticket's kid names no ticket key of \(app.bundleID)") }
        guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes) else {
            throw refuse("invalidTicket", "the ticket's signature is not an ES256 signature (64 bytes R‖S)")
        }
        let input = Array(text.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        let signedByApp = candidates.contains { k in
            guard let key = try? P256.Signing.PublicKey(pemRepresentation: k.publicKeyPEM) else { return false }
            return key.isValidSignature(signature, for: input)
        }
        guard signedByApp else { throw refuse("invalidTicket", "the ticket's signature does not verify with \(app.bundleID)'s ticket keys") }
        guard let claims = try? JSONParser.parse(claimBytes), claims.objectValue != nil else { throw refuse("invalidTicket", "the ticket's claims are not a JSON object") }
        guard claims["aud"]?.stringValue == app.bundleID else { throw refuse("invalidTicket", "the ticket's aud is not \(app.bundleID)") }
        guard let exp = claims["exp"]?.numberValue?.doubleValue, exp.isFinite else { throw refuse("invalidTicket", "the ticket has no exp (Unix seconds)") }
        guard exp > now.timeIntervalSince1970 else { throw refuse("ticketExpired", "the ticket expired: ask the backend for a new one") }
        guard exp <= now.timeIntervalSince1970 + maximumLifetime else {
            throw refuse("invalidTicket", "the ticket's exp is more than 24 hours ahead: tickets are short-lived")
        }
        func claim(_ k: String) throws(Refusal) -> String? {
            switch claims[k] {
            case nil, .null?: return nil
            case .string(let s)? where !s.isEmpty: return s
            default: throw refuse("invalidTicket", "the ticket's \(k) must be a non-empty string")
            }
        }
        let t = RegistrationTicket(bundleID: app.bundleID, expires: Date(timeIntervalSince1970: exp), externalKey: try claim("key"), userID: try claim("user"),
                                   installationID: try claim("inst"))
        guard t.externalKey != nil || t.userID != nil else { throw refuse("invalidTicket", "the ticket names neither a key nor a user") }
        return t
    }

    /// A new ticket key pair: the private key for the backend (PEM), the public one for Isle.
    public static func makeKey(now: Date) -> (privateKeyPEM: String, key: TicketKey) {
        let key = P256.Signing.PrivateKey()
        let id = "tk_" + Hex.encode((0..<6).map { _ in UInt8.random(in: 0...255) })
        return (key.pemRepresentation, TicketKey(id: id, publicKeyPEM: key.publicKey.pemRepresentation, createdAt: now))
    }

    /// The public key of `pem` (a public or a private P-256 key), as Isle stores it; nil if it is neither.
    public static func publicKeyPEM(of pem: String) -> String? {
        if let k = try? P256.Signing.PublicKey(pemRepresentation: pem) { return k.pemRepresentation }
        if let k = try? P256.Signing.PrivateKey(pemRepresentation: pem) { return k.publicKey.pemRepresentation }
        return nil
    }

    static func base64url(_ bytes: [UInt8]) -> String { Base64URL.encode(bytes) }
    static func base64urlDecode(_ s: Substring) -> [UInt8]? { Base64URL.decode(s) }
}

/// Base64url without padding (RFC 4648 §5): a JWT's parts, and the API's opaque cursors.
enum Base64URL {
    static func encode(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// Nil unless `s` is only the alphabet's characters and decodes.
    static func decode(_ s: Substring) -> [UInt8]? {
        guard s.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { return nil }
        var t = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while t.count % 4 != 0 { t += "=" }
        return Data(base64Encoded: t).map(Array.init)
    }
}

extension RegistrationTicket.Refusal {
    /// The API's answer: 403 naming `field` — the ticket does not authorize the binding (a 401
    /// would say the API key is wrong; clients retry neither).
    func apiError(field: String = "ticket") -> APIError {
        APIError(.forbidden, code, message, field: field)
    }
}
