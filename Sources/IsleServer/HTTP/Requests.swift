import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery

// The API's request bodies as typed values, each decoded once, with errors that name the field and
// say what was expected. Sizes are bounded here (docs/security.md): nothing unbounded is stored.

/// Field readers over a JSON object body.
struct Body {
    let object: JSONObject

    /// Reads the request's body (at most 1 MiB) as a JSON object. A string (or key) holding U+0000
    /// is refused, naming where: no store can keep it (PostgreSQL's text refuses it).
    static func read(_ request: Request) async throws -> Body {
        var request = request
        let object = try await JSONBody.read(&request, limit: Limits.body).object
        try Self.refuseUnstorable(.object(object), path: "")
        return Body(object: object)
    }

    static func refuseUnstorable(_ value: JSONValue, path: String) throws {
        func name(_ p: String) -> String { p.isEmpty ? "body" : p }
        switch value {
        case .string(let s):
            if s.unicodeScalars.contains("\u{0}") { throw APIError.invalid(name(path), "\(name(path)) holds a NUL character (U+0000), which Isle cannot store") }
        case .array(let a):
            for (i, v) in a.enumerated() { try refuseUnstorable(v, path: "\(path)[\(i)]") }
        case .object(let o):
            for (k, v) in o {
                let p = path.isEmpty ? k : "\(path).\(k)"
                if k.unicodeScalars.contains("\u{0}") { throw APIError.invalid(name(path), "a key in \(name(path)) holds a NUL character (U+0000), which Isle cannot store") }
                try refuseUnstorable(v, path: p)
            }
        default: break
        }
    }

    func string(_ k: String, required: Bool = false) throws -> String? {
        switch object[k] {
        case nil, .null?:
            if required { throw APIError.invalid(k, "\(k) is required: a non-empty string") }
            return nil
        case .string(let s)?:
            if s.isEmpty { throw APIError.invalid(k, "\(k) must not be empty") }
            if s.count > 512 { throw APIError.invalid(k, "\(k) is longer than 512 characters") }
            return s
        default: throw APIError.invalid(k, "\(k) must be a string")
        }
    }

    /// A string of at most `limit` characters (Unicode scalars, as JSON Schema's maxLength counts).
    func bounded(_ k: String, _ limit: Int, required: Bool = false) throws -> String? {
        try Self.bounded(try string(k, required: required), k, limit)
    }

    static func bounded(_ value: String?, _ field: String, _ limit: Int) throws -> String? {
        guard let value else { return nil }
        guard !value.isEmpty, value.unicodeScalars.count <= limit else { throw APIError.invalid(field, "\(field) must be 1 to \(limit) characters (got \(value.unicodeScalars.count))") }
        return value
    }

    func bool(_ k: String) throws -> Bool? {
        switch object[k] {
        case nil: return nil
        case .bool(let b)?: return b
        default: throw APIError.invalid(k, "\(k) must be true or false")
        }
    }

    func number(_ k: String) throws -> Double? {
        switch object[k] {
        case nil, .null?: return nil
        case .number(let n)?: return n.doubleValue
        default: throw APIError.invalid(k, "\(k) must be a number")
        }
    }

    func date(_ k: String) throws -> Date? {
        guard let d = try number(k) else { return nil }
        guard d > 1_000_000_000, d < 100_000_000_000 else { throw APIError.invalid(k, "\(k) must be Unix seconds (e.g. \(Int(Date().timeIntervalSince1970)))") }
        return Date(timeIntervalSince1970: d)
    }

    func object(_ k: String, required: Bool = false) throws -> JSONValue? {
        switch object[k] {
        case nil, .null?:
            if required { throw APIError.invalid(k, "\(k) is required: an object") }
            return nil
        case .object?: return object[k]
        default: throw APIError.invalid(k, "\(k) must be an object")
        }
    }

    /// Topics: at most ``Limits/topics``, each at most ``Limits/topic`` characters.
    func topics() throws -> [String] {
        guard let v = object["topics"] else { return [] }
        guard let a = v.arrayValue, a.allSatisfy({ ($0.stringValue ?? "").isEmpty == false }) else { throw APIError.invalid("topics", "topics must be an array of non-empty strings") }
        guard a.count <= Limits.topics else { throw APIError.invalid("topics", "at most \(Limits.topics) topics") }
        let topics = a.compactMap(\.stringValue)
        for (i, t) in topics.enumerated() { _ = try Self.bounded(t, "topics[\(i)]", Limits.topic) }
        return topics
    }

    /// `environment`: the APNs environment of the caller's tokens — `sandbox` or `production`
    /// (`development`, the `aps-environment` entitlement's name for the sandbox, is accepted too).
    func environment(_ k: String = "environment") throws -> PushEnvironment? {
        switch object[k] {
        case nil, .null?: return nil
        case .string(let s)?:
            guard let e = PushEnvironment(reported: s) else {
                throw APIError.invalid(k, "\(k) must be sandbox or production (the build's aps-environment: development is the sandbox); got \"\(s.prefix(40))\"")
            }
            return e
        default: throw APIError.invalid(k, "\(k) must be a string: sandbox or production")
        }
    }

    func token(_ k: String, required: Bool) throws -> String? {
        guard let s = try string(k, required: required) else { return nil }
        do { return try DeviceToken(hex: s).hex } catch { throw APIError.invalid(k, "\(k): \(error.reason)") }
    }

    func priority() throws -> PushPriority? {
        guard let p = try number("priority") else { return nil }
        switch p {
        case 5: return .low
        case 10: return .high
        default: throw APIError.invalid("priority", "priority must be 5 or 10")
        }
    }

    /// `alert`: `{"title": "…"|{"loc-key","loc-args"}, "body": …, "sound"?: "default"|"<file>"}`.
    func alert() throws -> JSONValue? {
        guard let a = object["alert"] else { return nil }
        guard let o = a.objectValue else { throw APIError.invalid("alert", "alert must be an object with title and body") }
        for k in ["title", "body"] {
            switch o[k] {
            case .string(let s)? where !s.isEmpty: continue
            case .object(let loc)? where !(loc["loc-key"]?.stringValue ?? "").isEmpty:
                if let unknown = loc.keys.first(where: { $0 != "loc-key" && $0 != "loc-args" }) {
                    throw APIError.invalid("alert.\(k).\(unknown)", "unknown key \(unknown) in alert.\(k); use loc-key and loc-args")
                }
                if let args = loc["loc-args"], !(args.arrayValue?.allSatisfy { $0.stringValue != nil } ?? false) {
                    throw APIError.invalid("alert.\(k).loc-args", "loc-args must be an array of strings")
                }
            default: throw APIError.invalid("alert.\(k)", "alert.\(k) is required: a string, or {\"loc-key\": …, \"loc-args\": […]}")
            }
        }
        if let s = o["sound"], s.stringValue == nil { throw APIError.invalid("alert.sound", "alert.sound must be a string") }
        for k in o.keys where !["title", "body", "sound"].contains(k) { throw APIError.invalid("alert.\(k)", "unknown alert key \(k); use title, body and sound") }
        return a
    }

    /// `alert`, checked by ``alert()``, as the typed alert Isle sends.
    func typedAlert() throws -> LiveActivityAlert? {
        guard let a = try alert() else { return nil }
        do { return try LiveActivityAlert(json: a) } catch { throw APIError.invalid(error.field ?? "alert", error.reason) }
    }

    /// `ticket`: a registration ticket (a JWT, at most 4,096 bytes; verified by the controller).
    func ticket() throws -> String? {
        switch object["ticket"] {
        case nil, .null?: return nil
        case .string(let s)? where !s.isEmpty && s.utf8.count <= 4096: return s
        default: throw APIError.invalid("ticket", "ticket must be the registration ticket your backend signed: a JWT string of at most 4096 bytes")
        }
    }

    /// Refuses keys outside `known`, naming them and what is accepted.
    func only(_ known: [String]) throws {
        for k in object.keys where !known.contains(k) {
            throw APIError.invalid(k, "unknown field \(k); expected \(known.joined(separator: ", "))")
        }
    }
}

/// Sizes (docs/security.md).
enum Limits {
    static let body = 1 << 20
    static let id = 128
    static let externalKey = 256
    static let topic = 128
    static let topics = 32
    static let attributesType = 128
    static let pushToStartTypes = 32
    static let userID = 256
    /// Attributes and content state each, serialized (a Live Activity payload is at most 4 KB).
    static let activityJSON = 4096

    /// A page size from the query (`?limit=`, `?deliveries=`): a whole number from 1 to 1000, or
    /// `fallback` when absent.
    static func pageSize(_ request: Request, _ name: String, fallback: Int = 100) throws -> Int {
        guard let text = request.uri.queryParameters[Substring(name)] else { return fallback }
        guard let n = Int(String(text)), (1...1000).contains(n) else { throw APIError.invalid(name, "\(name) must be a whole number from 1 to 1000") }
        return n
    }

    /// An id from the path, at most ``id`` characters.
    static func pathID(_ value: String, _ name: String) throws -> String {
        guard !value.isEmpty, value.unicodeScalars.count <= id else { throw APIError.invalid(name, "the \(name) id must be 1 to \(id) characters") }
        return value
    }
}

// MARK: Device requests

/// `PUT /v1/installations/{id}`: what the device reports about itself. `userID` is refused: the
/// backend binds it.
struct InstallationReport {
    enum WidgetChange { case keep, clear, set(String) }
    /// Attributes type → hex token, or nil to remove it.
    var pushToStartTokens: [String: String?] = [:]
    var widget = WidgetChange.keep
    var liveActivitiesEnabled: Bool?
    var frequentPushesEnabled: Bool?
    /// The APNs environment of the installation's tokens; nil keeps what is stored.
    var environment: PushEnvironment?
    /// The backend's registration ticket naming the installation's user (``RegistrationTicket``).
    var ticket: String?

    init(_ b: Body) throws {
        if b.object["userID"] != nil {
            throw APIError.invalid("userID", "userID is bound by your backend — PUT /v1/installations/{id}/user with the backend key, or a registration ticket naming the user in ticket: the device key is public, so Isle never takes a user id on the device's word")
        }
        try b.only(WireContract.installation)
        ticket = try b.ticket()
        if let t = b.object["pushToStartTokens"] {
            guard let o = t.objectValue else { throw APIError.invalid("pushToStartTokens", "pushToStartTokens must be an object: attributes type → hex token") }
            guard o.count <= Limits.pushToStartTypes else { throw APIError.invalid("pushToStartTokens", "at most \(Limits.pushToStartTypes) attributes types") }
            for (type, value) in o {
                _ = try Body.bounded(type, "pushToStartTokens.\(type.prefix(40))", Limits.attributesType)
                if value.isNull { pushToStartTokens[type] = .some(nil); continue }
                guard let s = value.stringValue, let t = try? DeviceToken(hex: s) else { throw APIError.invalid("pushToStartTokens.\(type)", "pushToStartTokens.\(type) must be a hex token") }
                pushToStartTokens[type] = .some(t.hex)
            }
        }
        if b.object["widgetToken"]?.isNull == true {
            widget = .clear
        } else if let w = try b.token("widgetToken", required: false) {
            widget = .set(w)
        }
        liveActivitiesEnabled = try b.bool("liveActivitiesEnabled")
        frequentPushesEnabled = try b.bool("frequentPushesEnabled")
        environment = try b.environment()
    }

    func apply(to inst: inout InstallationRecord, now: Date) {
        for (type, token) in pushToStartTokens { inst.pushToStartTokens[type] = token }
        switch widget {
        case .keep: break
        case .clear: inst.widgetToken = nil
        case .set(let w): inst.widgetToken = w
        }
        if let liveActivitiesEnabled { inst.liveActivitiesEnabled = liveActivitiesEnabled }
        if let frequentPushesEnabled { inst.frequentPushesEnabled = frequentPushesEnabled }
        if let environment { inst.environment = environment }
        inst.updatedAt = now
    }
}

/// `POST /v1/activities`: the app registers an activity it started (or one started by push).
struct ActivityRegistration {
    var attributesType: String
    var channelID: String?
    var token: String?
    var externalKey: String?
    var topics: [String]
    var installationID: String?
    var attributes: JSONValue?
    var contentState: JSONValue?
    var relevanceScore: Double?
    /// The APNs environment of `token`; nil: the installation's (or the server's default).
    var environment: PushEnvironment?
    /// The backend's registration ticket for `externalKey` (``RegistrationTicket``).
    var ticket: String?

    init(_ b: Body) throws {
        try b.only(WireContract.activityRegistration)
        ticket = try b.ticket()
        attributesType = try b.bounded("attributesType", Limits.attributesType, required: true)!
        environment = try b.environment()
        channelID = try b.bounded("channelID", Limits.id)
        token = try b.token("token", required: channelID == nil)
        externalKey = try b.bounded("externalKey", Limits.externalKey)
        topics = try b.topics()
        installationID = try b.bounded("installationID", Limits.id)
        attributes = b.object["attributes"]
        contentState = b.object["contentState"]
        relevanceScore = try b.number("relevanceScore")
    }

    /// Attributes and content state within the size limit, decoding with the registered schema.
    func checked(_ schema: ActivitySchema?) throws -> (attributes: JSONValue?, contentState: JSONValue?) {
        (try Self.checkedObject(attributes, "attributes", schema: schema?.attributes), try Self.checkedObject(contentState, "contentState", schema: schema?.contentState))
    }

    static func checkedObject(_ value: JSONValue?, _ field: String, schema: ObjectSchema?) throws -> JSONValue? {
        guard let value, !value.isNull else { return nil }
        guard value.objectValue != nil else { throw APIError.invalid(field, "\(field) must be an object") }
        let size = value.jsonBytes.count
        guard size <= Limits.activityJSON else {
            throw APIError(.unprocessableContent, "tooLarge", "\(field) is \(size) bytes; a Live Activity's \(field) must fit a 4 KB payload (at most \(Limits.activityJSON))", field: field)
        }
        if let schema, let first = schema.decode(value, path: field).mismatches.first {
            throw APIError(.unprocessableContent, "schemaMismatch", "\(first.path): expected \(first.expected), found \(first.found)", field: PayloadCheck.field(first.path))
        }
        return value
    }
}

/// `PUT /v1/activities/{id}/token`: a rotated update token.
struct TokenReport {
    var token: String
    init(_ b: Body) throws {
        try b.only(WireContract.token)
        token = try b.token("token", required: true)!
    }
}

// MARK: Backend requests

/// `PUT /v1/installations/{id}/user`: the backend binds (or, with null, unbinds) the person.
struct UserBinding {
    var userID: String?
    init(_ b: Body) throws {
        try b.only(WireContract.userBinding)
        guard b.object.keys.contains("userID") else { throw APIError.invalid("userID", "give userID: the backend's id for the person (a string), or null to unbind") }
        if b.object["userID"]?.isNull == true { userID = nil; return }
        guard let id = try b.string("userID"), id.utf8.count <= Limits.userID else { throw APIError.invalid("userID", "userID must be 1 to \(Limits.userID) bytes") }
        userID = id
    }
}

/// An update or end, for activities and channels alike: the `aps` Isle will send (its timestamp is
/// added at send time), the priority asked for, and when to send.
struct ActivityPush {
    enum Event: String, CaseIterable { case update, end }
    var event: Event
    /// The push as Isle will send it, typed; its timestamp is the acceptance's (``payload(acceptedAt:)``)
    /// until the send fixes its own.
    private var push: LiveActivityPayload
    var priority: PushPriority?
    var sendAt: Date?
    var hasAlert: Bool { push.alert != nil }

    init(_ b: Body, event: Event) throws {
        self.event = event
        push = LiveActivityPayload(event: event == .end ? .end : .update, timestamp: Date(timeIntervalSince1970: 0))
        push.contentState = try b.object("contentState", required: event == .update)
        push.alert = try b.typedAlert()
        push.staleDate = try b.date("staleDate").map(Self.wholeSeconds)
        push.relevanceScore = try b.number("relevanceScore")
        if event == .end { push.dismissalDate = try b.date("dismissalDate").map(Self.wholeSeconds) }
        if event == .update, b.object["dismissalDate"] != nil { throw APIError.invalid("dismissalDate", "dismissalDate applies to end only") }
        priority = try b.priority()
        sendAt = try b.date("sendAt")
        for k in b.object.keys where !WireContract.end.contains(k) {
            throw APIError.invalid(k, "unknown field \(k); expected contentState, alert, staleDate, relevanceScore, dismissalDate (end), priority, sendAt")
        }
    }

    /// The job's payload, accepted at `now`.
    func payload(acceptedAt now: Date) -> JobPayload {
        var p = push
        p.timestamp = now
        return .liveActivity(p)
    }

    /// APNs takes whole Unix seconds for `stale-date` and `dismissal-date`; the server's record
    /// keeps what the device will see.
    static func wholeSeconds(_ d: Date) -> Date { Date(timeIntervalSince1970: d.timeIntervalSince1970.rounded(.towardZero)) }
}

/// `POST /v1/installations/{id}/start`, `POST /v1/users/{user}/start`: push-to-start.
struct StartRequest {
    var attributesType: String
    /// The push-to-start as Isle will send it (its timestamp set when accepted, ``payload(acceptedAt:)``).
    private var push: LiveActivityPayload
    var attributes: JSONValue
    var contentState: JSONValue
    var relevanceScore: Double?
    var externalKey: String?
    var topics: [String]

    init(_ b: Body) throws {
        try b.only(WireContract.start)
        attributesType = try b.bounded("attributesType", Limits.attributesType, required: true)!
        attributes = try b.object("attributes", required: true)!
        contentState = try b.object("contentState", required: true)!
        guard let alert = try b.typedAlert() else { throw APIError.invalid("alert", "a start needs an alert: the device drops a push-to-start without one") }
        push = LiveActivityPayload(event: .start, timestamp: Date(timeIntervalSince1970: 0), contentState: contentState, alert: alert, attributesType: attributesType,
                                   attributes: attributes, inputPushToken: true)
        push.staleDate = try b.date("staleDate").map(ActivityPush.wholeSeconds)
        relevanceScore = try b.number("relevanceScore")
        push.relevanceScore = relevanceScore
        externalKey = try b.bounded("externalKey", Limits.externalKey)
        topics = try b.topics()
    }

    func payload(acceptedAt now: Date) -> JobPayload {
        var p = push
        p.timestamp = now
        return .liveActivity(p)
    }
}

/// `POST /v1/channels`.
struct ChannelCreation {
    var storagePolicy: Int
    /// Where the channel is created (a channel lives in one environment); nil: the server's default.
    var environment: PushEnvironment?
    init(_ b: Body) throws {
        try b.only(WireContract.channelCreation)
        environment = try b.environment()
        // Compared as a number first: converting an out-of-range Double to Int would trap.
        let requested = try b.number("storagePolicy") ?? 0
        guard requested == 0 || requested == 1 else { throw APIError.invalid("storagePolicy", "storagePolicy must be 0 (no message stored) or 1 (most recent stored)") }
        storagePolicy = requested == 1 ? 1 : 0
    }
}

extension Parameters {
    /// A path parameter with its percent-encoding removed: ids such as broadcast channel ids
    /// (base64, so they may hold `/`, `+` and `=`) or a backend's own keys travel percent-encoded.
    /// Bounded as docs/security.md says (keys 256 characters, topics 128, ids 128); U+0000 refused.
    func decoded(_ name: String) throws -> String {
        let raw = try require(name)
        guard let value = raw.removingPercentEncoding else { throw APIError.invalid(name, "\(name) in the path is not valid percent-encoding") }
        let limit = switch name {
        case "key": Limits.externalKey
        case "topic": Limits.topic
        case "user": Limits.userID
        default: Limits.id
        }
        guard !value.isEmpty, value.unicodeScalars.count <= limit else { throw APIError.invalid(name, "\(name) in the path must be 1 to \(limit) characters") }
        guard !value.unicodeScalars.contains("\u{0}") else { throw APIError.invalid(name, "\(name) in the path holds a NUL character (%00)") }
        return value
    }
}
