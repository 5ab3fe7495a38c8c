public import Foundation
public import IsleStore
import IsleDelivery

/// First-setup helpers shared by the CLI and tests.
public enum ServerSetup {
    /// Creates an API key and returns (id, secret). Only the secret's hash is stored.
    public static func createKey(store: any APIKeyRepository, bundleID: String, scope: APIKeyScope, now: Date = Date()) async throws -> (id: String, secret: String) {
        let secret = APIKeys.newSecret(scope: scope)
        let id = "key_" + UUID().uuidString.lowercased().prefix(12)
        try await store.insertAPIKey(APIKeyRecord(id: String(id), bundleID: bundleID, scope: scope, secretHash: APIKeys.hash(secret), createdAt: now))
        return (String(id), secret)
    }
}
