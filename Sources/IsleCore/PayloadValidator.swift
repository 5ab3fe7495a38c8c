public import Foundation

/// One finding of the validator: a stable code, where it is, what is wrong, how to fix it.
public struct ValidationIssue: Sendable, Hashable, Codable, CustomStringConvertible {
    public enum Severity: String, Sendable, Hashable, Codable { case error, warning }

    public let severity: Severity
    public let code: ValidationCode
    /// JSON path, e.g. `$.aps.content-state.eta`; `$` for the whole payload.
    public let path: String
    /// What is wrong.
    public let message: String
    /// How to fix it.
    public let fix: String

    public var description: String { "\(severity.rawValue) [\(code.rawValue)] \(path): \(message) \(fix)" }
}

/// Stable identifiers for validator findings (docs/protocol.md, Validation). Never renamed.
public enum ValidationCode: String, Sendable, Hashable, Codable, CaseIterable {
    // Errors
    case notJSON, emptyPayload, notAnObject, missingAps, apsNotObject
    case missingEvent, unknownEvent
    case missingTimestamp, timestampNotInteger
    case startMissingAlert, startMissingAttributesType, startMissingAttributes
    case missingContentState, contentStateNotObject, attributesNotObject
    case payloadTooLarge
    case relevanceScoreNotNumber
    case dismissalDateOnNonEnd
    case dateNotInteger
    case invalidAlert
    case contentStateMismatch, attributesMismatch, attributesTypeMismatch
    case invalidInputPushToken, invalidInputPushChannel
    case broadcastCannotStart
    case widgetsNotContentChanged
    // Warnings
    case timestampInMilliseconds, timestampFarFromNow
    case dateInMilliseconds, fractionalSeconds
    case unixTimeInDateField, isoStringInDateField, nullValue
    case customKeyInAps, duplicateKey
    case dismissalDateTooFar, staleDateInPast
    case highPriorityWithoutAlert
    case startKeyOnNonStart
    case activityDataTooLarge

    public var severity: ValidationIssue.Severity {
        switch self {
        case .timestampInMilliseconds, .timestampFarFromNow, .dateInMilliseconds, .fractionalSeconds, .unixTimeInDateField, .isoStringInDateField,
            .nullValue, .customKeyInAps, .duplicateKey, .dismissalDateTooFar, .staleDateInPast, .highPriorityWithoutAlert,
            .startKeyOnNonStart, .activityDataTooLarge:
            .warning
        default:
            .error
        }
    }
}

/// The outcome of validating one payload.
public struct ValidationReport: Sendable, Hashable, Codable {
    public var issues: [ValidationIssue]
    /// Bytes measured on the exact payload.
    public var size: Int
    public var sizeLimit: Int

    public var errors: [ValidationIssue] { issues.filter { $0.severity == .error } }
    public var warnings: [ValidationIssue] { issues.filter { $0.severity == .warning } }
    /// True when nothing blocks sending.
    public var isValid: Bool { errors.isEmpty }

    public func has(_ code: ValidationCode) -> Bool { issues.contains { $0.code == code } }
}

/// Checks a payload before it goes to APNs: everything APNs or ActivityKit would reject or
/// silently drop is an error; everything that probably does not do what the sender meant is a
/// warning (docs/protocol.md, Validation).
public struct PayloadValidator: Sendable {
    public struct Options: Sendable {
        public var pushType: PushType
        /// A broadcast (channel) push: `update`/`end` only, 5120 bytes.
        public var broadcast: Bool
        /// The `apns-priority` the payload will be sent with, when known.
        public var priority: PushPriority?
        /// The app's schema for this attributes type, when registered.
        public var schema: ActivitySchema?
        /// The time "now" for the time-based warnings (injected; tests use fixed dates).
        public var now: Date

        public init(pushType: PushType = .liveactivity, broadcast: Bool = false, priority: PushPriority? = nil, schema: ActivitySchema? = nil, now: Date = Date()) {
            self.pushType = pushType
            self.broadcast = broadcast
            self.priority = priority
            self.schema = schema
            self.now = now
        }

        public var sizeLimit: Int { broadcast ? broadcastMaximumPayloadSize : pushType.maximumPayloadSize }
    }

    public var options: Options
    public init(options: Options) { self.options = options }

    /// The `aps` keys ActivityKit reads; anything else inside `aps` is ignored by the device.
    public static let liveActivityApsKeys: Set<String> = [
        "timestamp", "event", "content-state", "stale-date", "dismissal-date", "relevance-score", "alert",
        "attributes-type", "attributes", "input-push-token", "input-push-channel",
    ]
    /// Generic `aps` keys APNs defines for other push types (docs/protocol.md §5.1).
    static let genericApsKeys: Set<String> = [
        "alert", "badge", "sound", "thread-id", "category", "content-available", "mutable-content", "target-content-id",
        "interruption-level", "relevance-score", "filter-criteria", "stale-date", "content-state", "timestamp", "event",
        "dismissal-date", "attributes-type", "attributes", "content-changed",
    ]

    public func validate(_ payload: LiveActivityPayload) -> ValidationReport { validate(bytes: payload.encoded) }

    public func validate(bytes: [UInt8]) -> ValidationReport {
        var v = Run(options: options, size: bytes.count)
        v.run(bytes)
        return ValidationReport(issues: v.issues, size: bytes.count, sizeLimit: options.sizeLimit)
    }

    /// Validates a payload that is already a value (built from parsed JSON, so no key repeats),
    /// whose encoding is `size` bytes: the same checks as ``validate(bytes:)`` without parsing it
    /// again.
    public func validate(value: JSONValue, size: Int) -> ValidationReport {
        var v = Run(options: options, size: size)
        v.checkSize(size)
        v.check(value)
        return ValidationReport(issues: v.issues, size: size, sizeLimit: options.sizeLimit)
    }

    private struct Run {
        let options: Options
        let size: Int
        var issues: [ValidationIssue] = []

        init(options: Options, size: Int) {
            self.options = options
            self.size = size
        }

        mutating func add(_ code: ValidationCode, _ path: String, _ message: String, fix: String) {
            issues.append(ValidationIssue(severity: code.severity, code: code, path: path, message: message, fix: fix))
        }

        mutating func run(_ bytes: [UInt8]) {
            if bytes.isEmpty {
                return add(.emptyPayload, "$", "The payload is empty.", fix: "Send a JSON object with an \"aps\" dictionary.")
            }
            checkSize(bytes.count)
            let parsed: JSONParser.Result
            do { parsed = try JSONParser.parseWithDiagnostics(bytes) } catch {
                return add(.notJSON, "$", "The payload is not JSON: \(error).", fix: "Send valid, uncompressed UTF-8 JSON.")
            }
            for path in parsed.duplicateKeys {
                add(.duplicateKey, path, "This key appears more than once in its object; only the last value counts.", fix: "Send each key once.")
            }
            check(parsed.value)
        }

        mutating func checkSize(_ count: Int) {
            if count > options.sizeLimit {
                let kind = options.broadcast ? "broadcast" : options.pushType.rawValue
                add(.payloadTooLarge, "$", "The payload is \(count) bytes, \(count - options.sizeLimit) over the \(options.sizeLimit)-byte limit for \(kind) pushes; APNs answers 413 PayloadTooLarge.",
                    fix: "Shorten strings or drop fields from content-state; send details the app can fetch itself.")
            }
        }

        /// Everything after parsing: the shape of the payload and its `aps`.
        mutating func check(_ value: JSONValue) {
            guard let root = value.objectValue else {
                return add(.notAnObject, "$", "The payload is \(value.kindName), not an object.", fix: "Send a JSON object: {\"aps\": {…}}.")
            }
            guard let apsValue = root["aps"] else {
                return add(.missingAps, "$.aps", "The payload has no \"aps\" dictionary.", fix: "Put the push's keys inside \"aps\": {\"aps\": {\"event\": \"update\", …}}.")
            }
            guard let aps = apsValue.objectValue else {
                return add(.apsNotObject, "$.aps", "\"aps\" is \(apsValue.kindName), not an object.", fix: "Make \"aps\" a JSON object.")
            }
            switch options.pushType {
            case .liveactivity: liveActivity(aps)
            case .widgets: widgets(aps)
            default: generic(aps)
            }
        }

        // MARK: widgets

        mutating func widgets(_ aps: JSONObject) {
            if aps["content-changed"] != .bool(true) {
                add(.widgetsNotContentChanged, "$.aps.content-changed", "A widgets push must carry \"content-changed\": true, found \(aps["content-changed"].map(\.briefDescription) ?? "nothing").",
                    fix: "Send exactly {\"aps\":{\"content-changed\":true}}.")
            }
            for key in aps.keys where key != "content-changed" {
                add(.customKeyInAps, JSONPath.appending(key, to: "$.aps"), "WidgetKit ignores \"\(key)\" in a widgets push.", fix: "Remove it; widgets reload their own timelines.")
            }
        }

        mutating func generic(_ aps: JSONObject) {
            for key in aps.keys where !PayloadValidator.genericApsKeys.contains(key) {
                add(.customKeyInAps, JSONPath.appending(key, to: "$.aps"), "APNs ignores custom keys inside \"aps\".", fix: "Move \"\(key)\" beside \"aps\", at the top level.")
            }
        }

        // MARK: liveactivity

        mutating func liveActivity(_ aps: JSONObject) {
            for key in aps.keys where !PayloadValidator.liveActivityApsKeys.contains(key) {
                add(.customKeyInAps, JSONPath.appending(key, to: "$.aps"), "ActivityKit ignores \"\(key)\" inside \"aps\".",
                    fix: "Custom data belongs beside \"aps\"; data for the Live Activity belongs in \"content-state\".")
            }
            let event: LiveActivityEvent?
            switch aps["event"] {
            case nil:
                add(.missingEvent, "$.aps.event", "\"event\" is missing.", fix: "Add \"event\": \"start\", \"update\" or \"end\".")
                event = nil
            case .string(let s)?:
                event = LiveActivityEvent(rawValue: s)
                if event == nil {
                    let hint = LiveActivityEvent(rawValue: s.lowercased()) != nil ? " (it is case-sensitive)" : ""
                    add(.unknownEvent, "$.aps.event", "\"event\" is \"\(s)\"\(hint).", fix: "Use \"start\", \"update\" or \"end\", lowercase.")
                }
            case let other?:
                add(.unknownEvent, "$.aps.event", "\"event\" is \(other.kindName), not a string.", fix: "Use \"start\", \"update\" or \"end\".")
                event = nil
            }
            timestamp(aps["timestamp"])
            let staleDate = apsDate(aps, "stale-date")
            let dismissalDate = apsDate(aps, "dismissal-date")

            if let score = aps["relevance-score"], score.numberValue == nil {
                add(.relevanceScoreNotNumber, "$.aps.relevance-score", "\"relevance-score\" is \(score.kindName) \(score.briefDescription), not a number.",
                    fix: "Send a number such as 50 or 100; higher scores are shown first.")
            }
            let hasAlert = aps["alert"] != nil
            if let alert = aps["alert"] { validateAlert(alert) }

            if options.broadcast, event == .start {
                add(.broadcastCannotStart, "$.aps.event", "A broadcast push cannot start a Live Activity.",
                    fix: "Start activities with push-to-start (input-push-channel subscribes them to the channel), then broadcast updates.")
            }
            if event == .start {
                if !hasAlert {
                    add(.startMissingAlert, "$.aps.alert", "A start push has no \"alert\"; APNs answers 200 and the device drops it.",
                        fix: "Add \"alert\": {\"title\": …, \"body\": …}.")
                }
                switch aps["attributes-type"] {
                case nil:
                    add(.startMissingAttributesType, "$.aps.attributes-type", "A start push has no \"attributes-type\".",
                        fix: "Add the Swift name of the ActivityAttributes struct, exactly as written (case-sensitive).")
                case .string(let name)?:
                    if let schema = options.schema, schema.attributesType != name {
                        add(.attributesTypeMismatch, "$.aps.attributes-type", "\"attributes-type\" is \"\(name)\" but the registered type is \"\(schema.attributesType)\"; the device starts nothing.",
                            fix: "Send \"\(schema.attributesType)\" (the Swift struct name, case-sensitive).")
                    }
                case let other?:
                    add(.startMissingAttributesType, "$.aps.attributes-type", "\"attributes-type\" is \(other.kindName), not a string.", fix: "Send the Swift struct name as a string.")
                }
                if let attributes = aps["attributes"] {
                    if attributes.objectValue == nil {
                        add(.attributesNotObject, "$.aps.attributes", "\"attributes\" is \(attributes.kindName), not an object.", fix: "Send the static attributes as an object.")
                    } else if let schema = options.schema {
                        schemaCheck(attributes, schema.attributes, path: "$.aps.attributes", code: .attributesMismatch, what: "attributes")
                    }
                } else {
                    add(.startMissingAttributes, "$.aps.attributes", "A start push has no \"attributes\".",
                        fix: "Add the static ActivityAttributes values (not the ContentState fields) as \"attributes\".")
                }
                if let token = aps["input-push-token"], token.numberValue?.exactInt64Value != 1 {
                    add(.invalidInputPushToken, "$.aps.input-push-token", "\"input-push-token\" is \(token.briefDescription).", fix: "Send \"input-push-token\": 1, or leave it out.")
                }
                if let channel = aps["input-push-channel"], (channel.stringValue ?? "").isEmpty {
                    add(.invalidInputPushChannel, "$.aps.input-push-channel", "\"input-push-channel\" is \(channel.briefDescription).", fix: "Send the base64 channel id as a string, or leave it out.")
                }
            } else if let event {
                for key in ["attributes-type", "attributes", "input-push-token", "input-push-channel"] where aps[key] != nil {
                    add(.startKeyOnNonStart, JSONPath.appending(key, to: "$.aps"), "\"\(key)\" only means something on a start push; the device ignores it on \(event.rawValue).", fix: "Remove it.")
                }
            }

            switch aps["content-state"] {
            case nil:
                if event == .start || event == .update {
                    add(.missingContentState, "$.aps.content-state", "A\(event == .update ? "n" : "") \(event!.rawValue) push has no \"content-state\"; the device cannot apply it.",
                        fix: "Add the ContentState values as \"content-state\".")
                }
            case .object?:
                if let schema = options.schema {
                    schemaCheck(aps["content-state"]!, schema.contentState, path: "$.aps.content-state", code: .contentStateMismatch, what: "content-state")
                }
            case let other?:
                add(.contentStateNotObject, "$.aps.content-state", "\"content-state\" is \(other.kindName), not an object.", fix: "Send the ContentState values as an object.")
            }

            if dismissalDate != nil, let event, event != .end {
                add(.dismissalDateOnNonEnd, "$.aps.dismissal-date", "\"dismissal-date\" only applies to end pushes; this is \(event.rawValue).",
                    fix: "Remove it, or send it with \"event\": \"end\".")
            }
            if let dismissalDate, event == .end, dismissalDate.timeIntervalSince(options.now) > 4 * 3600 {
                add(.dismissalDateTooFar, "$.aps.dismissal-date", "\"dismissal-date\" is \(Self.duration(dismissalDate.timeIntervalSince(options.now))) from now; the system removes an ended activity after 4 hours at the latest.",
                    fix: "Use a date within 4 hours of the end, or leave it out for the default.")
            }
            if let staleDate, staleDate < options.now {
                add(.staleDateInPast, "$.aps.stale-date", "\"stale-date\" is \(Self.duration(options.now.timeIntervalSince(staleDate))) in the past; the activity shows as stale at once.",
                    fix: "Send a future date, or leave it out.")
            }
            if options.priority == .high, event == .update, !hasAlert {
                add(.highPriorityWithoutAlert, "$.aps", "Priority 10 on an update without an alert spends the activity's hourly budget.",
                    fix: "Send routine updates with apns-priority 5; keep 10 for alerts and time-critical changes.")
            }
            if options.broadcast || options.pushType == .liveactivity {
                let stateSize = aps["content-state"].map { $0.jsonBytes.count } ?? 0
                let attrSize = aps["attributes"].map { $0.jsonBytes.count } ?? 0
                if stateSize + attrSize > 4096 {
                    add(.activityDataTooLarge, "$.aps", "content-state and attributes together are \(stateSize + attrSize) bytes; ActivityKit refuses more than 4 KB of Live Activity data.",
                        fix: "Keep static and dynamic data under 4096 bytes combined.")
                }
            }
        }

        mutating func timestamp(_ value: JSONValue?) {
            guard let value else {
                return add(.missingTimestamp, "$.aps.timestamp", "\"timestamp\" is missing; the device orders updates by it.", fix: "Add the current time as integer Unix seconds, e.g. \(Int64(options.now.timeIntervalSince1970)).")
            }
            guard let seconds = seconds(value, path: "$.aps.timestamp", key: "timestamp") else {
                return add(.timestampNotInteger, "$.aps.timestamp", "\"timestamp\" is \(value.kindName) \(value.briefDescription), not a number of Unix seconds.",
                    fix: "Send integer Unix seconds such as \(Int64(options.now.timeIntervalSince1970)).")
            }
            if Double(seconds) > 1e11 {
                add(.timestampInMilliseconds, "$.aps.timestamp", "\"timestamp\" \(seconds) looks like milliseconds.", fix: "Send seconds since 1970: \(seconds / 1000).")
            } else if abs(Double(seconds) - options.now.timeIntervalSince1970) > 3600 {
                let delta = Double(seconds) - options.now.timeIntervalSince1970
                add(.timestampFarFromNow, "$.aps.timestamp", "\"timestamp\" is \(Self.duration(abs(delta))) \(delta > 0 ? "in the future" : "in the past"); a later push with a smaller timestamp would be ignored, an older one may be dropped.",
                    fix: "Send the time the data was generated: now is \(Int64(options.now.timeIntervalSince1970)).")
            }
        }

        /// Unix seconds from an aps-level date. Apple documents a number and the device takes any
        /// finite one ≥ 0, so `1767225600.0` is the integer it looks like; a fraction is kept but
        /// warned about (Isle sends whole seconds; docs/simulator.md, "Numbers"). Nil: not a number
        /// of seconds (negative, or beyond any date: `1e30` is not a time).
        mutating func seconds(_ value: JSONValue, path: String, key: String) -> Int64? {
            guard let n = value.numberValue, n.doubleValue.isFinite, n.doubleValue >= 0 else { return nil }
            if let exact = n.exactInt64Value { return exact }
            guard let whole = Int64(exactly: n.doubleValue.rounded(.down)) else { return nil }
            add(.fractionalSeconds, path, "\"\(key)\" is \(n.literal): the device takes the fraction, but Isle and most servers send whole seconds.",
                fix: "Send \(whole).")
            return whole
        }

        /// Reads an aps-level date (`stale-date`, `dismissal-date`): Unix seconds.
        mutating func apsDate(_ aps: JSONObject, _ key: String) -> Date? {
            guard let value = aps[key] else { return nil }
            let path = JSONPath.appending(key, to: "$.aps")
            guard let seconds = seconds(value, path: path, key: key) else {
                add(.dateNotInteger, path, "\"\(key)\" is \(value.kindName) \(value.briefDescription), not a number of Unix seconds.", fix: "Send integer Unix seconds.")
                return nil
            }
            if Double(seconds) > 1e11 {
                add(.dateInMilliseconds, path, "\"\(key)\" \(seconds) looks like milliseconds.", fix: "Send seconds since 1970: \(seconds / 1000).")
                return Date(timeIntervalSince1970: Double(seconds) / 1000)
            }
            return Date(timeIntervalSince1970: Double(seconds))
        }

        mutating func validateAlert(_ alert: JSONValue) {
            guard let object = alert.objectValue else {
                return add(.invalidAlert, "$.aps.alert", "\"alert\" is \(alert.kindName), not an object.", fix: "Send {\"title\": …, \"body\": …, \"sound\": \"default\"}.")
            }
            for key in ["title", "body"] {
                let path = JSONPath.appending(key, to: "$.aps.alert")
                switch object[key] {
                case nil:
                    add(.invalidAlert, path, "The alert has no \"\(key)\".", fix: "Add a \(key): a string, or {\"loc-key\": …, \"loc-args\": […]}.")
                case .string?: break
                case .object(let loc)?:
                    if loc["loc-key"]?.stringValue == nil {
                        add(.invalidAlert, JSONPath.appending("loc-key", to: path), "A localized \(key) needs \"loc-key\" as a string.", fix: "Add the key from the app's Localizable.strings.")
                    }
                    if let args = loc["loc-args"], !(args.arrayValue?.allSatisfy { $0.stringValue != nil } ?? false) {
                        add(.invalidAlert, JSONPath.appending("loc-args", to: path), "\"loc-args\" must be an array of strings.", fix: "Send each argument as a string.")
                    }
                case let other?:
                    add(.invalidAlert, path, "The alert's \(key) is \(other.kindName).", fix: "Send a string, or {\"loc-key\": …, \"loc-args\": […]}.")
                }
            }
            if let sound = object["sound"], sound.stringValue == nil {
                add(.invalidAlert, "$.aps.alert.sound", "\"sound\" is \(sound.kindName).", fix: "Send \"default\" or the name of a sound file in the app bundle.")
            }
        }

        mutating func schemaCheck(_ value: JSONValue, _ schema: ObjectSchema, path: String, code: ValidationCode, what: String) {
            let result = schema.decode(value, path: path)
            for m in result.mismatches {
                add(code, m.path, "The device cannot decode \(what): expected \(m.expected), found \(m.found). APNs answers 200 and the update is silently not applied.",
                    fix: m.found.hasPrefix("nothing") ? "Add the field." : "Send \(m.expected).")
            }
            for notice in result.notices {
                switch notice.kind {
                case .unixTimeInDateField:
                    let v = notice.value.numberValue!.doubleValue
                    let corrected = v - ActivityKitEncoding.referenceDateOffset
                    let shown = Date(timeIntervalSinceReferenceDate: v)
                    add(.unixTimeInDateField, notice.path, "\(notice.value.briefDescription) looks like Unix time, but a Swift Date decodes seconds since 2001: the device would show \(Self.iso(shown)), about 31 years late.",
                        fix: "Send \(Self.number(corrected)) (Unix time − 978307200).")
                case .millisecondsInDateField:
                    // Not "Unix time": seconds since 2001 of this size are a date ~50,000 years
                    // ahead, which `iso` cannot print; the fix is the same conversion after ÷ 1000.
                    let v = notice.value.numberValue!.doubleValue
                    let corrected = (v / 1000).rounded(.down) - ActivityKitEncoding.referenceDateOffset
                    add(.dateInMilliseconds, notice.path, "\(notice.value.briefDescription) looks like Unix time in milliseconds, but a Swift Date decodes seconds since 2001: the device would show a date tens of thousands of years from now.",
                        fix: "Send \(Self.number(corrected)) (Unix milliseconds ÷ 1000 − 978307200).")
                case .isoStringInDateField:
                    var fix = "Send seconds since 2001-01-01 (Unix time − 978307200)."
                    if let text = notice.value.stringValue, let date = Self.parseISO(text) {
                        fix = "Send \(Self.number(date.timeIntervalSinceReferenceDate)) (seconds since 2001-01-01 for \(text))."
                    }
                    add(.isoStringInDateField, notice.path, "\(notice.value.briefDescription) is an ISO-8601 string; a Swift Date decodes only a number.", fix: fix)
                case .nullValue:
                    add(.nullValue, notice.path, "null decodes into an optional, but has been reported to break decoding on devices.", fix: "Leave the key out instead of sending null.")
                }
            }
        }

        static func parseISO(_ text: String) -> Date? {
            let f = ISO8601DateFormatter()
            if let d = f.date(from: text) { return d }
            f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            return f.date(from: text)
        }

        static func duration(_ seconds: TimeInterval) -> String {
            let s = Int(seconds.rounded())
            if s >= 86400 { return "\(s / 86400) d \(s % 86400 / 3600) h" }
            if s >= 3600 { return "\(s / 3600) h \(s % 3600 / 60) min" }
            if s >= 60 { return "\(s / 60) min" }
            return "\(s) s"
        }

        static func number(_ d: Double) -> String { d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : String(d) }

        static func iso(_ date: Date) -> String {
            var cal = Calendar(identifier: .gregorian)
            cal.timeZone = TimeZone(identifier: "UTC")!
            let c = cal.dateComponents([.year, .month, .day, .hour, .minute], from: date)
            return String(format: "%04d-%02d-%02d %02d:%02d UTC", c.year!, c.month!, c.day!, c.hour!, c.minute!)
        }
    }
}
