/// `apns-push-type` values and the topic each needs (docs/protocol.md §2.1). Always lowercase on
/// the wire (docs/protocol.md, Wire).
public enum PushType: String, Sendable, CaseIterable, Codable {
    case alert, background, complication, controls, fileprovider, liveactivity, location, mdm, pushtotalk, voip, widgets

    /// What is appended to the bundle id to form `apns-topic`.
    public var topicSuffix: String {
        switch self {
        case .alert, .background, .mdm: ""
        case .complication: ".complication"
        case .controls: ".push-type.controls"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .location: ".location-query"
        case .pushtotalk: ".voip-ptt"
        case .voip: ".voip"
        case .widgets: ".push-type.widgets"
        }
    }

    public func topic(bundleID: String) -> String { bundleID + topicSuffix }

    /// Largest payload APNs accepts for a device push of this type (docs/protocol.md §4).
    public var maximumPayloadSize: Int { self == .voip ? 5120 : 4096 }
}

/// `apns-priority` (docs/protocol.md §2).
public enum PushPriority: Int, Sendable, CaseIterable, Codable, Comparable {
    /// Prioritize the device's power; may not wake it.
    case powerConsiderate = 1
    /// Delivered based on power considerations; does not count against the Live Activity budget.
    case low = 5
    /// Delivered immediately; counts against the Live Activity budget.
    case high = 10

    public static func < (lhs: PushPriority, rhs: PushPriority) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// Largest broadcast payload (docs/protocol.md §4, §7.3).
public let broadcastMaximumPayloadSize = 5120

/// A device or Live Activity push token, hex, normalised to lowercase.
///
/// Any even length of at least 16 bytes is accepted: never assume 32 bytes, Live Activity
/// tokens are longer (docs/protocol.md, Wire).
public struct DeviceToken: Sendable, Hashable, Codable, CustomStringConvertible {
    public static let minimumByteCount = 16

    public let hex: String

    public init(hex input: String) throws(DeviceTokenError) {
        let trimmed = input.trimmingWhitespace()
        if trimmed.isEmpty { throw DeviceTokenError(reason: "the device token is empty") }
        if let bad = trimmed.first(where: { !$0.isHexDigit }) {
            throw DeviceTokenError(reason: "the device token must be hexadecimal; found '\(bad)'")
        }
        if trimmed.count % 2 != 0 {
            throw DeviceTokenError(reason: "the device token has an odd number of hex digits (\(trimmed.count)); each byte is two digits")
        }
        if trimmed.count / 2 < Self.minimumByteCount {
            throw DeviceTokenError(reason: "the device token is \(trimmed.count / 2) bytes; expected at least \(Self.minimumByteCount)")
        }
        hex = trimmed.lowercased()
    }

    /// A token already parsed once, as ``hex`` gave it (a server's stored form): not checked again.
    /// Parse text from outside with ``init(hex:)``.
    public init(parsedHex: String) {
        hex = parsedHex
    }

    public init(bytes: some Sequence<UInt8>) throws(DeviceTokenError) {
        try self.init(hex: bytes.map { b in
            let s = String(b, radix: 16)
            return s.count == 1 ? "0" + s : s
        }.joined())
    }

    public var bytes: [UInt8] {
        var out: [UInt8] = []
        var it = hex.utf8.makeIterator()
        while let hi = it.next(), let lo = it.next() { out.append(Self.nibble(hi) << 4 | Self.nibble(lo)) }
        return out
    }

    private static func nibble(_ c: UInt8) -> UInt8 { c <= 0x39 ? c - 0x30 : c - 0x61 + 10 }

    /// A shortened form safe for logs and messages: first and last four digits.
    public var redacted: String { "\(hex.prefix(4))…\(hex.suffix(4))" }

    /// Never print the full token: it is a secret that lets anyone push to the device.
    public var description: String { redacted }

    public init(from decoder: any Decoder) throws {
        let hex = try decoder.singleValueContainer().decode(String.self)
        do { try self.init(hex: hex) } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: error.reason))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(hex)
    }
}

public struct DeviceTokenError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public var description: String { reason }
}

extension String {
    func trimmingWhitespace() -> String {
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s.removeFirst() }
        while let l = s.last, l.isWhitespace { s.removeLast() }
        return String(s)
    }
}

/// The APNs environment a device token belongs to (docs/protocol.md §1.1): a token works only on its
/// own environment's hosts, anywhere else APNs answers 400 `BadDeviceToken` (docs/protocol.md §3.4);
/// channels cannot be shared across environments either (§7.1).
/// Debug builds hold `sandbox` tokens; TestFlight and App Store builds `production` ones.
public enum PushEnvironment: String, Sendable, Hashable, CaseIterable, Codable {
    case sandbox, production

    /// Reads a reported environment: `sandbox`, `production`, or the `aps-environment`
    /// entitlement's own values (`development`, `production`), exactly; nil for anything else.
    public init?(reported text: String) {
        switch text {
        case "sandbox", "development": self = .sandbox
        case "production": self = .production
        default: return nil
        }
    }
}
