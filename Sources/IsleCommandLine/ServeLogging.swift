import Foundation
#if canImport(Glibc)
import Glibc
#endif
import IsleCore
import Logging
import Synchronization

/// How `isle serve` writes its log (docs/server.md, "Logs"): text as swift-log's default handler
/// writes it, or JSON, one object per line with stable keys.
enum LogFormat: String, CaseIterable, Sendable {
    case text, json
}

/// The log level and format `isle serve` runs with, shared by every copy of its loggers: SIGHUP
/// changes them for all at once (``ServeReload``).
final class LogControl: Sendable {
    private let state: Mutex<(level: Logger.Level, format: LogFormat)>
    /// One line at a time on standard error, whichever thread logs.
    private let output = Mutex<Void>(())

    init(level: Logger.Level, format: LogFormat) {
        state = Mutex((level, format))
    }

    var level: Logger.Level {
        get { state.withLock { $0.level } }
        set { state.withLock { $0.level = newValue } }
    }

    var format: LogFormat {
        get { state.withLock { $0.format } }
        set { state.withLock { $0.format = newValue } }
    }

    /// A logger that writes through this control.
    func logger(label: String, metadataProvider: Logger.MetadataProvider? = nil) -> Logger {
        Logger(label: label) { label in ServeLogHandler(label: label, control: self, metadataProvider: metadataProvider) }
    }

    func write(_ line: String) {
        output.withLock { _ in
            var text = line
            text.append("\n")
            text.withUTF8 { bytes in
                var rest = UnsafeRawBufferPointer(bytes)
                while !rest.isEmpty {
                    let n = Glibc.write(STDERR_FILENO, rest.baseAddress, rest.count)
                    if n < 0 { if errno == EINTR { continue } else { return } }
                    rest = UnsafeRawBufferPointer(rebasing: rest[n...])
                }
            }
        }
    }
}

/// swift-log's handler for `isle serve`. The level is the process's (``LogControl``): `--log-level`
/// at the start and the config file at each SIGHUP; a copy of a logger cannot set its own.
struct ServeLogHandler: LogHandler {
    let label: String
    let control: LogControl
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, control: LogControl, metadataProvider: Logger.MetadataProvider?) {
        self.label = label
        self.control = control
        self.metadataProvider = metadataProvider
    }

    var logLevel: Logger.Level {
        get { control.level }
        // The process's level is set in one place (LogControl); a component's copy does not change it.
        set {}
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        write(level: event.level, message: event.message, metadata: event.metadata, source: event.source)
    }

    /// swift-log before `log(event:)` calls this one; both write the same line.
    func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        write(level: level, message: message, metadata: explicit, source: source)
    }

    private func write(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?, source: String) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let explicit { all.merge(explicit) { _, new in new } }
        let now = Date()
        switch control.format {
        case .text: control.write(Self.text(now, level: level, label: label, message: message.description, metadata: all, source: source))
        case .json: control.write(Self.json(now, level: level, label: label, message: message.description, metadata: all, source: source))
        }
    }

    static func timestamp(_ date: Date) -> String {
        date.formatted(.iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true).timeSeparator(.colon).timeZone(separator: .omitted))
    }

    /// As swift-log's stream handler writes it: time, level, label, metadata, source, message.
    static func text(_ date: Date, level: Logger.Level, label: String, message: String, metadata: Logger.Metadata, source: String) -> String {
        let pairs = metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        return "\(timestamp(date)) \(level) \(label):\(pairs.isEmpty ? "" : " " + pairs) [\(source)] \(message)"
    }

    /// One JSON object: `time` (ISO 8601, UTC, milliseconds), `level`, `logger`, `message`,
    /// `source`, `trace_id` and `span_id` when the line was written inside a traced span, and
    /// `metadata` (an object; nested values as swift-log gives them).
    static func json(_ date: Date, level: Logger.Level, label: String, message: String, metadata: Logger.Metadata, source: String) -> String {
        var o: JSONObject = ["time": .string(timestamp(date)), "level": .string(level.rawValue), "logger": .string(label), "message": .string(message), "source": .string(source)]
        var rest = metadata
        for key in ["trace_id", "span_id"] {
            if let value = rest.removeValue(forKey: key) { o[key] = .string("\(value)") }
        }
        if !rest.isEmpty { o["metadata"] = .object(rest.reduce(into: JSONObject()) { $0[$1.key] = Self.value($1.value) }) }
        return JSONValue.object(o).jsonString
    }

    static func value(_ v: Logger.MetadataValue) -> JSONValue {
        switch v {
        case .string(let s): .string(s)
        case .stringConvertible(let c): .string(c.description)
        case .array(let items): .array(items.map(value))
        case .dictionary(let d): .object(d.reduce(into: JSONObject()) { $0[$1.key] = value($1.value) })
        }
    }
}
