import Foundation
import IsleCore

/// Reading what the user typed: JSON inline or `@file`, dates in several forms.
enum Inputs {
    /// `{"a":1}` inline, `@path` for a file, `@-` for standard input.
    static func json(_ text: String, flag: String) throws(CLIError) -> JSONValue {
        let source: [UInt8]
        let origin: String
        if text.hasPrefix("@") {
            let path = String(text.dropFirst())
            origin = path == "-" ? "standard input" : path
            source = try read(path, flag: flag)
        } else {
            origin = "the value"
            source = Array(text.utf8)
        }
        do { return try JSONParser.parse(source) } catch {
            throw CLIError("\(flag): \(origin) is not JSON: \(error)")
        }
    }

    static func read(_ path: String, flag: String) throws(CLIError) -> [UInt8] {
        if path == "-" {
            return Array(FileHandle.standardInput.readDataToEndOfFile())
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            let why = FileManager.default.fileExists(atPath: path) ? "it cannot be read" : "no such file"
            throw CLIError("\(flag): cannot read \(path): \(why)")
        }
        return Array(data)
    }

    static func schema(_ path: String?) throws(CLIError) -> ActivitySchema? {
        guard let path else { return nil }
        let bytes = try read(path, flag: "--schema")
        do { return try ActivitySchema(jsonText: String(decoding: bytes, as: UTF8.self)) } catch {
            throw CLIError("--schema: \(path): \(error)")
        }
    }

    /// Unix seconds (`1767225600`), ISO-8601 (`2026-01-01T00:00:00Z`), `now`, or relative to
    /// now (`+30m`, `-2h`, `+90s`, `+1d`).
    static func date(_ text: String, flag: String, now: Date) throws(CLIError) -> Date {
        let t = text.trimmingCharacters(in: .whitespaces)
        if t == "now" { return now }
        if let first = t.first, first == "+" || first == "-", let unit = t.last, "smhd".contains(unit), let n = Double(t.dropFirst().dropLast()) {
            let seconds = n * ["s": 1, "m": 60, "h": 3600, "d": 86400][String(unit)]!
            return now.addingTimeInterval(first == "+" ? seconds : -seconds)
        }
        if let n = Int64(t) {
            if n > 100_000_000_000 { throw CLIError("\(flag): \(n) looks like milliseconds; give Unix seconds (\(n / 1000))") }
            return Date(timeIntervalSince1970: Double(n))
        }
        let iso = ISO8601DateFormatter()
        if let d = iso.date(from: t) { return d }
        iso.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let d = iso.date(from: t) { return d }
        throw CLIError("\(flag): \"\(text)\" is not a date; use Unix seconds, ISO-8601 (2026-01-01T12:00:00Z), now, or +30m / +2h")
    }

    static func priority(_ value: Int, flag: String = "--priority") throws(CLIError) -> PushPriority {
        guard let p = PushPriority(rawValue: value) else { throw CLIError("\(flag): \(value) is not a priority; use 5 (low, no budget) or 10 (immediate)") }
        return p
    }

    static func token(_ hex: String, flag: String = "--token") throws(CLIError) -> DeviceToken {
        do { return try DeviceToken(hex: hex) } catch { throw CLIError("\(flag): \(error.reason)") }
    }
}
