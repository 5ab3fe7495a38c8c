public import Foundation

/// An `apns-id` (a device push) or `apns-request-id` (a broadcast or channel request): a UUID,
/// sent and stored in its canonical lowercase form ("Sending notification requests to APNs",
/// `apns-id`; `BadMessageId` answers any other). One type from the claim that fixes it to the
/// header, the answer, the delivery record and the API.
public struct APNsID: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    /// `8-4-4-4-12` lowercase hex.
    public let text: String

    /// Any-case canonical text (`8-4-4-4-12` hex digits); nil for anything else.
    public init?(_ text: some StringProtocol) {
        let bytes = Array(text.utf8)
        guard bytes.count == 36 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(36)
        for (i, b) in bytes.enumerated() {
            if i == 8 || i == 13 || i == 18 || i == 23 {
                guard b == UInt8(ascii: "-") else { return nil }
                out.append(b)
                continue
            }
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"): out.append(b)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): out.append(b + 32)
            default: return nil
            }
        }
        self.text = String(decoding: out, as: UTF8.self)
    }

    public init(_ uuid: UUID) {
        self.init(bytes: withUnsafeBytes(of: uuid.uuid) { Array($0) })
    }

    /// From 16 bytes, in order.
    init(bytes: [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(36)
        for (i, byte) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { text.append(UInt8(ascii: "-")) }
            text.append(hex[Int(byte >> 4)])
            text.append(hex[Int(byte & 0x0F)])
        }
        self.text = String(decoding: text, as: UTF8.self)
    }

    /// A random (version 4) id.
    public static func random() -> APNsID { APNsID(UUID()) }

    /// A version 7 UUID (RFC 9562: 48 bits of Unix milliseconds, then random bits): ordered by
    /// time, so an index on it grows at its end, and made without opening `/dev/urandom` as
    /// `UUID()` does on Linux.
    public static func version7(now: Date, using random: inout some RandomNumberGenerator) -> APNsID {
        let ms = UInt64(max(0, (now.timeIntervalSince1970 * 1000).rounded(.down)))
        let a: UInt64 = random.next(), b: UInt64 = random.next()
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: ms >> (8 * UInt64(5 - i))) }
        for i in 6..<16 { bytes[i] = UInt8(truncatingIfNeeded: (i < 11 ? a >> (8 * UInt64(i - 6)) : b >> (8 * UInt64(i - 11)))) }
        bytes[6] = 0x70 | (bytes[6] & 0x0F)
        bytes[8] = 0x80 | (bytes[8] & 0x3F)
        return APNsID(bytes: bytes)
    }

    public var uuid: UUID { UUID(uuidString: text)! }
    public var description: String { text }
    public static func < (l: APNsID, r: APNsID) -> Bool { l.text < r.text }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        let s = try c.decode(String.self)
        guard let id = APNsID(s) else { throw DecodingError.dataCorruptedError(in: c, debugDescription: "not a UUID: \(s.prefix(40))") }
        self = id
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(text)
    }
}
