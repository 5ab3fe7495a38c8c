#if canImport(Security) && (os(iOS) || os(macOS) || os(watchOS) || os(tvOS) || os(visionOS))
public import Foundation
public import Security

/// The Keychain: one generic-password item holds the SDK's state (the installation secret among
/// it). Readable after the first unlock (a Live Activity wakes the app in the background) and
/// never copied to another device by a backup (`ThisDeviceOnly`): a restored phone registers as
/// a new installation with its own tokens. Kept to the four calls Apple documents; it cannot be
/// compiled on the Linux machines Isle is built on.
public struct KeychainStorage: IsleClientStorage {
    public let service: String
    public let account: String
    public init(service: String = "dev.isle.client", account: String = "state") {
        self.service = service
        self.account = account
    }

    var query: [String: Any] {
        [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service, kSecAttrAccount as String: account]
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
