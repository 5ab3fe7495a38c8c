public import Foundation

/// Encodes app values exactly the way ActivityKit decodes them.
///
/// ActivityKit decodes `content-state` and `attributes` with a `JSONDecoder` using its default
/// strategies (docs/protocol.md §5.2), so Isle encodes them with a `JSONEncoder` using its defaults:
/// a `Date` is seconds since 2001-01-01, a `ClosedRange<Date>` is `[lower, upper]`, keys are the
/// Swift property names verbatim. No custom key or date strategy is ever applied (docs/protocol.md, Wire).
public enum ActivityKitEncoding {
    /// Seconds between 1970-01-01 and 2001-01-01: the offset between Unix time and `Date`'s Codable form.
    public static let referenceDateOffset: Double = 978_307_200

    /// Keys come out sorted: `JSONEncoder` on Linux otherwise writes them in hash order, which
    /// changes from process to process. Sorting is output formatting, not a coding strategy, so
    /// ActivityKit decodes the bytes exactly the same, and Isle's bytes are reproducible.
    public static func jsonValue(of value: some Encodable) throws(PayloadEncodingError) -> JSONValue {
        let data: Data
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            data = try encoder.encode(value)
        } catch {
            throw PayloadEncodingError(reason: "the value could not be encoded to JSON: \(error)")
        }
        do {
            return try JSONParser.parse(data)
        } catch {
            throw PayloadEncodingError(reason: "JSONEncoder produced text Isle cannot read back: \(error)")
        }
    }

    /// The number a `Date` becomes inside `content-state` or `attributes`.
    public static func codableSeconds(for date: Date) -> Double { date.timeIntervalSinceReferenceDate }

    /// Integer Unix seconds, as APNs wants `timestamp`, `stale-date` and `dismissal-date`.
    public static func unixSeconds(_ date: Date) -> Int64 { Int64(date.timeIntervalSince1970.rounded(.down)) }
}

public struct PayloadEncodingError: Error, Sendable, CustomStringConvertible {
    public let reason: String
    public init(reason: String) { self.reason = reason }
    public var description: String { reason }
}
