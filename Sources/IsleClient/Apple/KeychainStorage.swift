#if canImport(Security) && (os(iOS) || os(macOS) || os(watchOS) || os(tvOS) || os(visionOS))
public import Foundation
import Security

/// The Keychain: one generic-password item holds the SDK's state (the installation secret among
/// it). Readable after the first unlock (a Live Activity wakes the app in the background) and
/// never copied to another device by a backup (`ThisDeviceOnly`): a restored phone registers as
/// a new installation with its own tokens.
///
/// `accessGroup` shares the item with the app's extensions (a keychain access group both carry
/// in their entitlements, e.g. `TEAMID.com.example.pizza.shared`): the widget extension then
/// reports the widget push token into the same installation (docs/client.md). On macOS the item
/// lives in the data protection keychain, as on iOS (`kSecUseDataProtectionKeychain`), not in the
/// legacy file keychain, which would ask the person for a password and ignores access groups.
public struct KeychainStorage: IsleClientStorage {
    public let service: String
    public let account: String
    public let accessGroup: String?

    public init(service: String = "dev.isle.client", account: String = "state", accessGroup: String? = nil) {
        self.service = service
        self.account = account
        self.accessGroup = accessGroup
    }

    var query: [String: Any] {
        var q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service, kSecAttrAccount as String: account,
                                kSecUseDataProtectionKeychain as String: true]
        if let accessGroup { q[kSecAttrAccessGroup as String] = accessGroup }
        return q
    }

    public func load() throws -> Data? {
        var q = query
        q[kSecReturnData as String] = true
        q[kSecMatchLimit as String] = kSecMatchLimitOne
        var result: AnyObject?
        let status = SecItemCopyMatching(q as CFDictionary, &result)
        if status == errSecItemNotFound { return nil }
        guard status == errSecSuccess else { throw KeychainError(status: status) }
        return result as? Data
    }

    public func save(_ data: Data) throws {
        let update = SecItemUpdate(query as CFDictionary, [kSecValueData as String: data] as CFDictionary)
        if update == errSecSuccess { return }
        guard update == errSecItemNotFound else { throw KeychainError(status: update) }
        var add = query
        add[kSecValueData as String] = data
        add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly
        let status = SecItemAdd(add as CFDictionary, nil)
        guard status == errSecSuccess else { throw KeychainError(status: status) }
    }
}

/// A Keychain call failed (`OSStatus`).
public struct KeychainError: Error, Sendable, CustomStringConvertible {
    public let status: OSStatus
    public var description: String { "Keychain error \(status)" }
}
#endif
