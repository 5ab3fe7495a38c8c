import Crypto
import Foundation
import IsleAPNs
import IsleCore
import IsleTesting
import Logging

/// Runs `body` with a recording sink and a client that trusts only the sink's CA.
func withSinkAndClient<R: Sendable>(
    clock: ManualWallClock = ManualWallClock(),
    key: TestProviderKey = TestProviderKey(),
    requestTimeout: Duration = .seconds(30),
    validates: Bool = true,
    _ body: (RecordingAPNsServer, APNsClient) async throws -> R
) async throws -> R {
    try await RecordingAPNsServer.withServer { sink in
        let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
        let configuration = APNsClient.Configuration(
            environment: .custom(url: sink.baseURL, trustRootsPEM: sink.caCertificatePEM),
            credentials: credentials, requestTimeout: requestTimeout, connectTimeout: .seconds(20), validatesPayloads: validates)
        let client = try APNsClient(configuration: configuration, clock: clock, logger: Logger(label: "isle.test"))
        do {
            let result = try await body(sink, client)
            try await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

enum Samples {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)
    static let token = try! DeviceToken(hex: String(repeating: "a1b2c3d4", count: 10))
    static let bundleID = "com.example.pizza"
    static func update(_ t: Date = now, alert: Bool = false) -> LiveActivityPayload {
        LiveActivityPayload(
            event: .update, timestamp: t, contentState: ["driverName": "Anne", "deliveryTimer": [788_918_400, 788_919_900]],
            alert: alert ? LiveActivityAlert(title: "Delivery Update", body: "Soon") : nil)
    }
}

/// Splits and decodes a JWT independently of IsleAPNs' own code.
struct DecodedJWT {
    let header: [String: Any]
    let claims: [String: Any]
    let claimsText: String
    let headerText: String
    let signingInput: String
    let signature: Data

    init(_ jwt: String) throws {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3 else { throw DecodeError() }
        func b64(_ s: String) throws -> Data {
            guard !s.contains("=") else { throw DecodeError() }
            var t = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while t.count % 4 != 0 { t += "=" }
            guard let d = Data(base64Encoded: t) else { throw DecodeError() }
            return d
        }
        headerText = String(decoding: try b64(parts[0]), as: UTF8.self)
        claimsText = String(decoding: try b64(parts[1]), as: UTF8.self)
        header = try JSONSerialization.jsonObject(with: Data(headerText.utf8)) as? [String: Any] ?? [:]
        claims = try JSONSerialization.jsonObject(with: Data(claimsText.utf8)) as? [String: Any] ?? [:]
        signingInput = parts[0] + "." + parts[1]
        signature = try b64(parts[2])
    }

    func verifies(with publicKeyPEM: String) throws -> Bool {
        let key = try P256.Signing.PublicKey(pemRepresentation: publicKeyPEM)
        let sig = try P256.Signing.ECDSASignature(rawRepresentation: signature)
        return key.isValidSignature(sig, for: Data(signingInput.utf8))
    }

    struct DecodeError: Error {}
}
