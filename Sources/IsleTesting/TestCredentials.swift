import Crypto
public import Foundation

/// Throwaway provider-key material for tests: a fresh P-256 key in `.p8` (PKCS#8 PEM) form.
public struct TestProviderKey: Sendable {
    public static let keyID = "ABC123DEFG"
    public static let teamID = "DEF123GHIJ"

    public let privateKeyPEM: String
    public let publicKeyPEM: String
    public let keyID: String
    public let teamID: String

    public init(keyID: String = Self.keyID, teamID: String = Self.teamID) {
        let key = P256.Signing.PrivateKey()
        privateKeyPEM = key.pemRepresentation
        publicKeyPEM = key.publicKey.pemRepresentation
        self.keyID = keyID
        self.teamID = teamID
    }

    /// Writes the key to a `.p8` file in a fresh temporary folder and returns its path.
    public func writeP8() throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("AuthKey_\(keyID).p8").path
        try privateKeyPEM.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}

/// Where the repository's test fixtures live.
public enum Fixtures {
    /// `Tests/Fixtures`, found from this source file's location.
    public static var directory: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Tests/Fixtures")
    }

    public static func data(_ relativePath: String) throws -> Data {
        try Data(contentsOf: directory.appendingPathComponent(relativePath))
    }

    public static func text(_ relativePath: String) throws -> String {
        String(decoding: try data(relativePath), as: UTF8.self)
    }
}
