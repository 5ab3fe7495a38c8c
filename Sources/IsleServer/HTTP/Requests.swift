import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery
import IsleWire

// The API's request bodies: read once into their wire types (IsleWire's `API`, the one
// definition the OpenAPI document is made from), then into what the handlers act on, with the
// rules between fields. Every refusal names the field and says what was expected.

/// Reading a request's body.
enum Body {
    /// The body (at most 1 MiB) as a JSON object. A string (or key) holding U+0000 is a 422
    /// naming where: no store can keep it (PostgreSQL's text refuses it).
    static func object(_ request: Request) async throws -> JSONObject {
        var request = request
        let object = try await JSONBody.read(&request, limit: Limits.body).object
        try Self.refuseUnstorable(.object(object), path: "")
        return object
    }

    /// The body read into `type`: a missing field, a wrong kind of value or an unknown field is a
    /// 400 naming it.
    static func read<T: Decodable>(_ type: T.Type, _ request: Request) async throws -> T {
        try decode(type, try await object(request))
    }

    static func decode<T: Decodable>(_ type: T.Type, _ object: JSONObject) throws -> T {
        do { return try WireDecoder.decode(type, from: .object(object)) } catch { throw APIError(.badRequest, error.code, error.reason, field: error.field) }
    }

    static func refuseUnstorable(_ value: JSONValue, path: String) throws {
        func name(_ p: String) -> String { p.isEmpty ? "body" : p }
        func refuse(_ p: String, _ message: String) -> APIError { APIError(.unprocessableContent, "unstorable", message, field: name(p)) }
        switch value {
        case .string(let s):
            if s.unicodeScalars.contains("\u{0}") { throw refuse(path, "\(name(path)) holds a NUL character (U+0000), which Isle cannot store") }
        case .array(let a):
            for (i, v) in a.enumerated() { try refuseUnstorable(v, path: "\(path)[\(i)]") }
        case .object(let o):
            for (k, v) in o {
                let p = path.isEmpty ? k : "\(path).\(k)"
                if k.unicodeScalars.contains("\u{0}") { throw refuse(path, "a key in \(name(path)) holds a NUL character (U+0000), which Isle cannot store") }
                try refuseUnstorable(v, path: p)
            }
        default: break
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
    var controls = WidgetChange.keep
    var liveActivitiesEnabled: Bool?
    var frequentPushesEnabled: Bool?
    /// The APNs environment of the installation's tokens; nil keeps what is stored.
    var environment: PushEnvironment?
    /// The backend's registration ticket naming the installation's user (``RegistrationTicket``).
    var ticket: String?
    var broadcastChannels: Bool?
    /// The topics it follows for starts; nil keeps what is stored.
    var topics: [String]?

    init(_ object: JSONObject) throws {
        if object["userID"] != nil {
            throw APIError.invalid("userID", "userID is bound by your backend — PUT /v1/installations/{id}/user with the backend key, or a registration ticket naming the user in ticket: the device key is public, so Isle never takes a user id on the device's word")
        }
        let w = try Body.decode(API.InstallationReport.self, object)
        ticket = w.ticket?.text
        pushToStartTokens = w.pushToStartTokens?.tokens ?? [:]
        switch w.widgetToken {
        case nil: widget = .keep
        case .clear?: widget = .clear
        case .set(let t)?: widget = .set(t.text)
        }
        switch w.controlsToken {
        case nil: controls = .keep
        case .clear?: controls = .clear
        case .set(let t)?: controls = .set(t.text)
        }
        liveActivitiesEnabled = w.liveActivitiesEnabled
        frequentPushesEnabled = w.frequentPushesEnabled
        environment = w.environment?.environment
        broadcastChannels = w.broadcastChannels
        topics = w.topics?.names
    }

    func apply(to inst: inout InstallationRecord, now: Date) {
        for (type, token) in pushToStartTokens { inst.pushToStartTokens[type] = token }
        switch widget {
        case .keep: break
        case .clear: inst.widgetToken = nil
        case .set(let w): inst.widgetToken = w
        }
        switch controls {
        case .keep: break
        case .clear: inst.controlsToken = nil
        case .set(let c): inst.controlsToken = c
        }
        if let liveActivitiesEnabled { inst.liveActivitiesEnabled = liveActivitiesEnabled }
        if let frequentPushesEnabled { inst.frequentPushesEnabled = frequentPushesEnabled }
        if let environment { inst.environment = environment }
        if let broadcastChannels { inst.broadcastChannels = broadcastChannels }
        if let topics { inst.topics = topics }
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

    init(_ w: API.ActivityRegistration) throws {
        guard w.token != nil || w.channelID != nil else {
            throw APIError(.unprocessableContent, "tokenOrChannelRequired", "token is required: the activity's update token in hex (or channelID, for an activity on a broadcast channel)", field: "token")
        }
        ticket = w.ticket?.text
        attributesType = w.attributesType.text
        environment = w.environment?.environment
        channelID = w.channelID?.text
        token = w.token?.text
        externalKey = w.externalKey?.text
        topics = w.topics?.names ?? []
        installationID = w.installationID.text
        attributes = w.attributes.map(JSONValue.object)
        contentState = w.contentState.map(JSONValue.object)
        relevanceScore = w.relevanceScore
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

// MARK: Backend requests

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
    var contentState: JSONValue? { push.contentState }

    /// Reads an update's or an end's body.
    init(_ object: JSONObject, event: Event) throws {
        switch event {
        case .update:
            let w = try Body.decode(API.Update.self, object)
            try self.init(event: .update, contentState: w.contentState, alert: w.alert, staleDate: w.staleDate, relevanceScore: w.relevanceScore, dismissalDate: nil,
                          priority: w.priority, sendAt: w.sendAt)
        case .end:
            let w = try Body.decode(API.End.self, object)
            try self.init(event: .end, contentState: w.contentState, alert: w.alert, staleDate: w.staleDate, relevanceScore: w.relevanceScore, dismissalDate: w.dismissalDate,
                          priority: w.priority, sendAt: w.sendAt)
        }
    }

    init(event: Event, contentState: JSONObject?, alert: API.Alert?, staleDate: Date?, relevanceScore: Double?, dismissalDate: Date?, priority: PriorityNumber?, sendAt: Date?) throws {
        self.event = event
        push = LiveActivityPayload(event: event == .end ? .end : .update, timestamp: Date(timeIntervalSince1970: 0))
        push.contentState = contentState.map(JSONValue.object)
        push.alert = try alert.map(Self.typed)
        push.staleDate = staleDate.map(Self.wholeSeconds)
        push.relevanceScore = relevanceScore
        push.dismissalDate = dismissalDate.map(Self.wholeSeconds)
        self.priority = priority?.priority
        self.sendAt = sendAt
    }

    /// The push, for activities' own tokens: priority 1 is a broadcast's alone (Apple takes a
    /// Live Activity push to a device token at 10 or 5), so it is a 422 naming the field.
    func toDeviceTokens() throws -> ActivityPush {
        guard priority != .powerConsiderate else {
            throw APIError(.unprocessableContent, "priorityNotAllowed",
                           "priority 1 is for broadcast channels (POST /v1/channels/{channel}/update); Apple takes a Live Activity push to a device token at 10 or 5", field: "priority")
        }
        return self
    }

    /// The alert as Isle sends it.
    static func typed(_ alert: API.Alert) throws -> LiveActivityAlert {
        do { return try LiveActivityAlert(json: alert.json) } catch { throw APIError.invalid(error.field ?? "alert", error.reason) }
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

/// `sendAt`: a push is sent within the job deadline of its acceptance (``ServerConfiguration/jobDeadline``),
/// so one scheduled past it would give up when it came due: refused when accepted instead, naming the field.
enum Scheduling {
    static func check(_ sendAt: Date?, now: Date, deadline: TimeInterval) throws {
        guard let sendAt, sendAt.timeIntervalSince(now) > deadline else { return }
        let hours = deadline / 3600
        throw APIError(.unprocessableContent, "sendAtTooLate",
                       "sendAt is \(Int(sendAt.timeIntervalSince(now) / 60)) minutes ahead; a push is sent within \(hours.formatted(.number.precision(.fractionLength(0...1)))) hours of being accepted (the server's job deadline), so this one would give up before it was due: send the request later",
                       field: "sendAt")
    }
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
    /// When to send it (a scheduled start); nil: now.
    var sendAt: Date?

    init(_ w: API.Start) throws {
        sendAt = w.sendAt
        attributesType = w.attributesType.text
        attributes = .object(w.attributes)
        contentState = .object(w.contentState)
        push = LiveActivityPayload(event: .start, timestamp: Date(timeIntervalSince1970: 0), contentState: contentState, alert: try ActivityPush.typed(w.alert),
                                   attributesType: attributesType, attributes: attributes, inputPushToken: true)
        push.staleDate = w.staleDate.map(ActivityPush.wholeSeconds)
        relevanceScore = w.relevanceScore
        push.relevanceScore = relevanceScore
        externalKey = w.externalKey?.text
        topics = w.topics?.names ?? []
    }

    func payload(acceptedAt now: Date) -> JobPayload {
        var p = push
        p.timestamp = now
        return .liveActivity(p)
    }

    /// The start on a broadcast channel (iOS 18): `input-push-channel` in place of `input-push-token`.
    func payload(acceptedAt now: Date, channel: String) -> JobPayload {
        var p = push
        p.timestamp = now
        p.inputPushToken = false
        p.inputPushChannel = channel
        return .liveActivity(p)
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
