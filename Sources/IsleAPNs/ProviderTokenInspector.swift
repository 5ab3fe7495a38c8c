public import Crypto
public import Foundation
public import IsleCore

/// Decodes a provider token and checks it against APNs' rules (docs/protocol.md §1.2–1.3).
public struct ProviderTokenInspection: Sendable {
    public var header: JSONValue?
    public var claims: JSONValue?
    public var keyID: String?
    public var teamID: String?
    public var issuedAt: Date?
    /// True / false when a public key was given; nil when not checked.
    public var signatureValid: Bool?
    /// Rule violations; empty means APNs would accept the token's form.
    public var problems: [String]

    public var isAcceptable: Bool { problems.isEmpty && signatureValid != false }
}

public enum ProviderTokenInspector {
    /// - Parameters:
    ///   - publicKey: verify the ES256 signature with this key (e.g. from the `.p8`).
    ///   - now: for the one-hour age rule.
    public static func inspect(_ jwt: String, publicKey: P256.Signing.PublicKey? = nil, now: Date) -> ProviderTokenInspection {
        var result = ProviderTokenInspection(problems: [])
        let token = jwt.trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "bearer ", with: "")
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            result.problems.append("a JWT has three base64url parts separated by '.', this has \(parts.count)")
            return result
        }
        func json(_ part: Substring, _ name: String) -> JSONValue? {
            guard let bytes = Base64URL.decode(part) else {
                result.problems.append("the \(name) is not base64url without padding")
                return nil
            }
            guard let value = try? JSONParser.parse(bytes) else {
                result.problems.append("the \(name) is not JSON")
                return nil
            }
            return value
        }
        result.header = json(parts[0], "header")
        result.claims = json(parts[1], "claims")
        if let header = result.header {
            if header["alg"] != "ES256" { result.problems.append("header alg must be \"ES256\", found \(header["alg"]?.briefDescription ?? "nothing")") }
            if let kid = header["kid"]?.stringValue {
                result.keyID = kid
                if kid.count != 10 { result.problems.append("header kid must be the 10-character Key ID, found \(kid.count) characters") }
            } else {
                result.problems.append("header kid (the Key ID) is missing")
            }
            let extra = (header.objectValue?.keys ?? []).filter { $0 != "alg" && $0 != "kid" }
            if !extra.isEmpty { result.problems.append("header has extra keys \(extra) (a typ key has been reported to cause InvalidProviderToken); send only alg and kid") }
        }
        if let claims = result.claims {
            if let iss = claims["iss"]?.stringValue {
                result.teamID = iss
                if iss.count != 10 { result.problems.append("claim iss must be the 10-character Team ID, found \(iss.count) characters") }
            } else {
                result.problems.append("claim iss (the Team ID) is missing")
            }
            switch claims["iat"] {
            case .number(let n)?:
                if let seconds = n.int64Value {
                    let iat = Date(timeIntervalSince1970: Double(seconds))
                    result.issuedAt = iat
                    let age = now.timeIntervalSince(iat)
                    if age > 3600 { result.problems.append("iat is \(Int(age / 60)) minutes old; APNs answers 403 ExpiredProviderToken after 60 minutes") }
                    if age < -60 { result.problems.append("iat is \(Int(-age / 60)) minutes in the future") }
                } else {
                    result.problems.append("claim iat must be an integer number of seconds, found \(n.literal)")
                }
            case let other?:
                result.problems.append("claim iat must be a JSON number, found \(other.kindName)")
            case nil:
                result.problems.append("claim iat is missing")
            }
            if claims["kid"] != nil { result.problems.append("kid belongs in the header, not the claims") }
        }
        let signature = Base64URL.decode(parts[2])
        if signature?.count != 64 {
            result.problems.append("the signature must be 64 bytes (raw R‖S), found \(signature?.count ?? 0); DER-encoded signatures are rejected by Apple's validator")
        }
        if let publicKey, let signature, let sig = try? P256.Signing.ECDSASignature(rawRepresentation: signature) {
            result.signatureValid = publicKey.isValidSignature(sig, for: Array("\(parts[0]).\(parts[1])".utf8))
            if result.signatureValid == false { result.problems.append("the signature does not verify with the given key") }
        } else if publicKey != nil {
            result.signatureValid = false
        }
        return result
    }
}

extension APNsCredentials {
    /// The public key, for ``ProviderTokenInspector``.
    public var publicKey: P256.Signing.PublicKey { privateKey.publicKey }
}
