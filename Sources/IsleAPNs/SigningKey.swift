public import Crypto
public import Foundation

/// Why a provider key or its identifiers cannot be used. Never contains key material.
public struct APNsCredentialsError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// The `.p8` token-signing key with its key id and team id: everything needed to mint provider
/// tokens. Checked when made, so a bad key fails at start, not at the first push.
public struct APNsCredentials: Sendable {
    public let keyID: String
    public let teamID: String
    let privateKey: P256.Signing.PrivateKey

    public init(keyID: String, teamID: String, privateKey: P256.Signing.PrivateKey) throws(APNsCredentialsError) {
        self.keyID = try Self.checkIdentifier(keyID, name: "key id", flag: "the Key ID shown next to the key in your Apple Developer account")
        self.teamID = try Self.checkIdentifier(teamID, name: "team id", flag: "your 10-character Team ID")
        self.privateKey = privateKey
    }

    /// Reads the key from PEM text (a `.p8` file's contents, PKCS#8 or SEC1), or from the bare
    /// base64 body of one.
    public init(keyID: String, teamID: String, pem: String) throws(APNsCredentialsError) {
        try self.init(keyID: keyID, teamID: teamID, privateKey: Self.parseKey(pem))
    }

    /// Reads the key from a `.p8` file.
    public init(keyID: String, teamID: String, keyFile path: String) throws(APNsCredentialsError) {
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            let why = FileManager.default.fileExists(atPath: path) ? "it is not readable UTF-8 text" : "no such file"
            throw APNsCredentialsError(reason: "cannot read the key file \(path): \(why)")
        }
        do { try self.init(keyID: keyID, teamID: teamID, pem: text) } catch {
            throw APNsCredentialsError(reason: "\(path): \(error.reason)")
        }
    }

    /// The public half, for verifying tokens (`isle jwt inspect`) or registering with a fake APNs.
    public var publicKeyPEM: String { privateKey.publicKey.pemRepresentation }

    static func parseKey(_ text: String) throws(APNsCredentialsError) -> P256.Signing.PrivateKey {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.isEmpty { throw APNsCredentialsError(reason: "the key is empty") }
        if !trimmed.hasPrefix("-----BEGIN") {
            let body = trimmed.filter { !$0.isWhitespace }
            guard Data(base64Encoded: body) != nil else {
                throw APNsCredentialsError(reason: "the key is neither PEM (-----BEGIN PRIVATE KEY-----) nor base64; expected the contents of the .p8 file Apple gave you")
            }
            // A bare body: Apple's .p8 files are PKCS#8; accept SEC1 too.
            for armor in ["PRIVATE KEY", "EC PRIVATE KEY"] {
                if let key = try? P256.Signing.PrivateKey(pemRepresentation: pemDocument(armor: armor, body: body)) { return key }
            }
            throw APNsCredentialsError(reason: "the key is not a valid ES256 (P-256) private key")
        }
        if trimmed.contains("BEGIN PUBLIC KEY") {
            throw APNsCredentialsError(reason: "this is a public key; APNs provider tokens are signed with the private key from the .p8 file")
        }
        if trimmed.contains("BEGIN CERTIFICATE") {
            throw APNsCredentialsError(reason: "this is a certificate; Isle uses token-based authentication with the .p8 signing key (Live Activities do not support certificate authentication)")
        }
        do {
            // Re-wrap the body at 64 columns: keys pasted through environment variables or
            // JSON often arrive on one line, which strict PEM parsers refuse.
            let lines = trimmed.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let first = lines.first, let last = lines.last, first.hasPrefix("-----BEGIN "), last.hasPrefix("-----END ") else {
                throw APNsCredentialsError(reason: "the PEM text has no matching BEGIN/END lines")
            }
            let armor = String(first.dropFirst("-----BEGIN ".count).dropLast(5))
            let body = lines.dropFirst().dropLast().joined().filter { !$0.isWhitespace }
            return try P256.Signing.PrivateKey(pemRepresentation: pemDocument(armor: armor, body: body))
        } catch let error as APNsCredentialsError {
            throw error
        } catch {
            throw APNsCredentialsError(reason: "the key is not a valid ES256 (P-256) private key in PEM form")
        }
    }

    static func pemDocument(armor: String, body: String) -> String {
        var lines: [Substring] = []
        var rest = Substring(body)
        while !rest.isEmpty {
            lines.append(rest.prefix(64))
            rest = rest.dropFirst(64)
        }
        return "-----BEGIN \(armor)-----\n" + lines.joined(separator: "\n") + "\n-----END \(armor)-----\n"
    }

    static func checkIdentifier(_ value: String, name: String, flag: String) throws(APNsCredentialsError) -> String {
        let v = value.trimmingCharacters(in: .whitespaces)
        guard v.count == 10, v.allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber) }) else {
            throw APNsCredentialsError(reason: "the \(name) \"\(v)\" must be 10 uppercase letters or digits (\(flag))")
        }
        return v
    }

    /// Mints a provider token: header `{"alg":"ES256","kid":…}`, claims `{"iss":…,"iat":<integer>}`,
    /// signature raw R‖S, all base64url without padding (docs/protocol.md, Wire).
    public func makeProviderToken(issuedAt: Date) -> ProviderToken {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header = #"{"alg":"ES256","kid":"\#(keyID)"}"#
        let claims = #"{"iss":"\#(teamID)","iat":\#(iat)}"#
        let signingInput = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(claims.utf8))
        // swift-crypto's ECDSA over P-256 hashes with SHA-256: exactly ES256.
        let signature = try! privateKey.signature(for: Array(signingInput.utf8))  // signing cannot fail for a valid key
        let jwt = signingInput + "." + Base64URL.encode(Array(signature.rawRepresentation))
        return ProviderToken(jwt: jwt, issuedAt: Date(timeIntervalSince1970: Double(iat)), keyID: keyID, teamID: teamID)
    }
}

/// A signed provider token (JWT). Its `description` is redacted: a JWT is a credential.
public struct ProviderToken: Sendable, Hashable, CustomStringConvertible {
    public let jwt: String
    public let issuedAt: Date
    public let keyID: String
    public let teamID: String
    /// The `authorization` header value, `bearer <jwt>`: made once per token, shared by every request.
    public let authorization: String

    public init(jwt: String, issuedAt: Date, keyID: String, teamID: String) {
        self.jwt = jwt
        self.issuedAt = issuedAt
        self.keyID = keyID
        self.teamID = teamID
        authorization = "bearer " + jwt
    }

    public var description: String { "ProviderToken(kid: \(keyID), iss: \(teamID), iat: \(Int64(issuedAt.timeIntervalSince1970)), jwt: <redacted>)" }
}

enum Base64URL {
    static func encode(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func decode(_ text: some StringProtocol) -> [UInt8]? {
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !s.contains("=") else { return nil }
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s).map(Array.init)
    }
}
