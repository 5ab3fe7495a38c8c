import Crypto
import Foundation
public import IsleDelivery

/// The operator's key that seals every app's `.p8` signing key at rest (AES-256-GCM).
///
/// The database then holds `isle-sealed:v1:<base64 of nonce ‖ ciphertext ‖ tag>`, authenticated
/// with the app's bundle id, so a sealed key copied onto another app's row does not open. The
/// master key lives outside the database (`ISLE_MASTER_KEY`, or a file given with
/// `--master-key-file` / `ISLE_MASTER_KEY_FILE`): someone who copies `isle.sqlite` alone cannot
/// push to anyone's phones.
public struct MasterKey: Sendable {
    let key: SymmetricKey

    /// The prefix of a sealed value.
    public static let sealedPrefix = "isle-sealed:v1:"

    /// 32 random bytes.
    public static func generate() -> MasterKey { MasterKey(key: SymmetricKey(size: .bits256)) }

    init(key: SymmetricKey) { self.key = key }

    /// From its text form: 32 bytes in standard base64 (what ``base64`` and `isle master-key` print).
    public init(base64 text: String) throws(StoreError) {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let data = Data(base64Encoded: trimmed), data.count == 32 else {
            throw StoreError(.unavailable, "the master key must be 32 bytes in base64 (44 characters, as `isle master-key` prints); this one is not")
        }
        key = SymmetricKey(data: data)
    }

    /// From a file holding the base64 text. The file must not be readable by others.
    public init(file path: String) throws(StoreError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw StoreError(.unavailable, "cannot read the master key file \(path)")
        }
        if let mode = FilePermissions.mode(of: path), mode & 0o077 != 0 {
            throw StoreError(.unavailable, "the master key file \(path) is readable by others (mode \(String(mode & 0o777, radix: 8))); run: chmod 600 \(path)")
        }
        try self.init(base64: String(decoding: data, as: UTF8.self))
    }

    /// The text form, for `isle master-key`.
    public var base64: String { key.withUnsafeBytes { Data($0).base64EncodedString() } }

    public static func isSealed(_ stored: String) -> Bool { stored.hasPrefix(sealedPrefix) }

    /// Seals a secret (a `.p8` PEM) for the app `bundleID`.
    public func seal(_ plaintext: String, bundleID: String) -> String {
        // AES-GCM with a fresh random nonce cannot fail for a 256-bit key.
        let box = try! AES.GCM.seal(Data(plaintext.utf8), using: key, authenticating: Data(bundleID.utf8))
        return Self.sealedPrefix + box.combined!.base64EncodedString()
    }

    /// Opens a sealed secret; a value that is not sealed (a store that keeps nothing on disk) is
    /// returned as it is.
    public func open(_ stored: String, bundleID: String) throws(StoreError) -> String {
        guard Self.isSealed(stored) else { return stored }
        guard let data = Data(base64Encoded: String(stored.dropFirst(Self.sealedPrefix.count))),
              let box = try? AES.GCM.SealedBox(combined: data),
              let plain = try? AES.GCM.open(box, using: key, authenticating: Data(bundleID.utf8)) else {
            throw StoreError(.unavailable, "the master key does not open the stored key of \(bundleID): it was sealed with another master key, or the row was altered")
        }
        return String(decoding: plain, as: UTF8.self)
    }

    /// The plaintext key of `app`: opened with `masterKey`, or an explanation of what to do.
    public static func openKey(of app: AppRecord, with masterKey: MasterKey?) throws(StoreError) -> String {
        try openKey(app.keyPEM, bundleID: app.bundleID, with: masterKey)
    }

    /// A stored key of app `bundleID` (its own, or an environment's), opened with `masterKey`.
    public static func openKey(_ stored: String, bundleID: String, with masterKey: MasterKey?) throws(StoreError) -> String {
        guard isSealed(stored) else { return stored }
        guard let masterKey else {
            throw StoreError(.unavailable, "the .p8 key of \(bundleID) is encrypted at rest and no master key was given: set ISLE_MASTER_KEY or --master-key-file to the key it was added with")
        }
        return try masterKey.open(stored, bundleID: bundleID)
    }

    /// Refuses an app whose key, or an environment's key, is a `.p8` in clear.
    public static func refuseClear(_ a: AppRecord) throws(StoreError) {
        for pem in [a.keyPEM] + a.environmentKeys.map(\.keyPEM) where !isSealed(pem) && pem.contains("PRIVATE KEY") {
            throw StoreError(.unavailable, "refusing to store the .p8 key of \(a.bundleID) in clear: seal it with the master key first")
        }
    }
}

/// File modes, for refusing secrets that others can read.
public enum FilePermissions {
    /// The permission bits of a file, or nil when it does not exist.
    public static func mode(of path: String) -> Int? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
              let permissions = attributes[.posixPermissions] as? NSNumber else { return nil }
        return permissions.intValue
    }

    /// Why `path` and its SQLite companions (`-wal`, `-shm`) must not be served, or nil when they
    /// are private to their owner.
    public static func problem(withDatabase path: String) -> String? {
        let files = [path, path + "-wal", path + "-shm"]
        let open = files.compactMap { f -> (String, Int)? in
            guard let mode = mode(of: f), mode & 0o077 != 0 else { return nil }
            return (f, mode & 0o777)
        }
        guard !open.isEmpty else { return nil }
        let list = open.map { "\($0.0) (mode \(String($0.1, radix: 8)))" }.joined(separator: ", ")
        return "\(list) can be read by other users of this machine, and the database holds every app's tokens and API key hashes; run: chmod 600 \(files.joined(separator: " "))"
    }
}
