public import Foundation
public import IsleCore

/// An app Isle sends for: its provider key and its attributes types.
public struct AppRecord: Sendable, Hashable {
    public var bundleID: String
    public var teamID: String
    public var keyID: String
    /// The .p8 key (PEM). Never logged.
    /// The `.p8` key as the store holds it: sealed by a ``MasterKey`` in a SQLite store
    /// (`isle-sealed:v1:…`); ``MasterKey/openKey(of:with:)`` gives the PEM.
    public var keyPEM: String
    /// The app declares NSSupportsLiveActivitiesFrequentUpdates.
    public var frequentUpdatesDeclared: Bool
    public var schemas: [ActivitySchema]
    public var createdAt: Date
    /// Public keys that verify the app's registration tickets (docs/security.md): the backend keeps
    /// the private keys.
    public var ticketKeys: [TicketKey]
    /// Keys limited to one APNs environment (Apple's environment-scoped keys): a push to that
    /// environment is signed with its key; the others with the app's own key.
    public var environmentKeys: [EnvironmentKey]

    public init(bundleID: String, teamID: String, keyID: String, keyPEM: String, frequentUpdatesDeclared: Bool = false, schemas: [ActivitySchema] = [], createdAt: Date,
                ticketKeys: [TicketKey] = [], environmentKeys: [EnvironmentKey] = []) {
        self.ticketKeys = ticketKeys
        self.environmentKeys = environmentKeys
        self.bundleID = bundleID
        self.teamID = teamID
        self.keyID = keyID
        self.keyPEM = keyPEM
        self.frequentUpdatesDeclared = frequentUpdatesDeclared
        self.schemas = schemas
        self.createdAt = createdAt
    }

    public func schema(_ type: String) -> ActivitySchema? { schemas.first { $0.attributesType == type } }

    /// The key that signs pushes to `environment`: its own, else the app's.
    public func signingKey(for environment: PushEnvironment) -> SigningKey {
        if let k = environmentKeys.first(where: { $0.environment == environment }) { return SigningKey(keyID: k.keyID, teamID: k.teamID, keyPEM: k.keyPEM, environment: environment) }
        return SigningKey(keyID: keyID, teamID: teamID, keyPEM: keyPEM, environment: nil)
    }
}

/// A provider key limited to one APNs environment (Apple lets a key be scoped to the sandbox or
/// to production; such a key used on the other host is refused with `BadEnvironmentKeyIdInToken`).
public struct EnvironmentKey: Sendable, Hashable {
    public var environment: PushEnvironment
    public var keyID: String
    public var teamID: String
    /// Sealed like the app's key (``AppRecord/keyPEM``).
    public var keyPEM: String
    public var createdAt: Date
    public init(environment: PushEnvironment, keyID: String, teamID: String, keyPEM: String, createdAt: Date) {
        self.environment = environment
        self.keyID = keyID
        self.teamID = teamID
        self.keyPEM = keyPEM
        self.createdAt = createdAt
    }
}

/// The key a push is signed with: the environment's own (`environment` set), or the app's.
public struct SigningKey: Sendable, Hashable {
    public var keyID: String
    public var teamID: String
    public var keyPEM: String
    public var environment: PushEnvironment?
}

/// A public key (P-256, PEM) that verifies registration tickets, named by `id` (the ticket's `kid`).
public struct TicketKey: Sendable, Hashable {
    public var id: String
    public var publicKeyPEM: String
    public var createdAt: Date
    public init(id: String, publicKeyPEM: String, createdAt: Date) {
        self.id = id
        self.publicKeyPEM = publicKeyPEM
        self.createdAt = createdAt
    }
}

/// An app on one device.
public struct InstallationRecord: Sendable, Hashable {
    public var id: String
    public var bundleID: String
    /// The backend's user, to start activities on all of a user's devices.
    public var userID: String?
    /// Push-to-start tokens (hex) by attributes type.
    public var pushToStartTokens: [String: String]
    public var widgetToken: String?
    /// The app's control push token (iOS 18 `ControlPushHandler`): `controls` pushes reload its
    /// Control Center controls.
    public var controlsToken: String?
    public var liveActivitiesEnabled: Bool
    public var frequentPushesEnabled: Bool
    public var updatedAt: Date
    /// SHA-256 (hex) of the installation secret the app got at its first registration; device
    /// calls for this installation and its activities must present the secret.
    public var secretHash: String?
    /// The APNs environment of the installation's tokens (its build's `aps-environment`); nil:
    /// the server's default (`isle serve --sandbox/--production`).
    public var environment: PushEnvironment?
    /// The system has broadcast channels (iOS 18 and later), as the app reported; nil: not said
    /// (a push-to-start then asks for a token, which every version gives).
    public var broadcastChannels: Bool?
    /// The topics the installation follows for starts (a favourite team): `POST
    /// /v1/topics/{topic}/start` starts an activity on each installation following the topic.
    public var topics: [String]
    public init(id: String, bundleID: String, userID: String? = nil, pushToStartTokens: [String: String] = [:], widgetToken: String? = nil,
                liveActivitiesEnabled: Bool = true, frequentPushesEnabled: Bool = false, updatedAt: Date, secretHash: String? = nil, environment: PushEnvironment? = nil,
                controlsToken: String? = nil, broadcastChannels: Bool? = nil, topics: [String] = []) {
        self.broadcastChannels = broadcastChannels
        self.topics = topics
        self.controlsToken = controlsToken
        self.secretHash = secretHash
        self.environment = environment
        self.id = id
        self.bundleID = bundleID
        self.userID = userID
        self.pushToStartTokens = pushToStartTokens
        self.widgetToken = widgetToken
        self.liveActivitiesEnabled = liveActivitiesEnabled
        self.frequentPushesEnabled = frequentPushesEnabled
        self.updatedAt = updatedAt
    }
}

/// The server's record of an activity's state: the same rules as the device.
public enum ActivityRecordState: String, Sendable, Hashable, Codable, CaseIterable {
    /// Started by push-to-start; no update token yet.
    case starting
    case active
    case ended
    case dismissed
    /// Its token is dead (410 / BadDeviceToken): nothing more can reach it.
    case unreachable

    public var acceptsPushes: Bool { self == .active || self == .starting }
}

public struct ActivityRecord: Sendable, Hashable {
    public var id: String
    public var bundleID: String
    /// The backend's own key, e.g. an order id. Unique per app among live activities.
    public var externalKey: String?
    public var installationID: String?
    public var attributesType: String
    public var attributes: JSONValue?
    public var content: JSONValue?
    public var state: ActivityRecordState
    public var updateToken: String?
    public var channelID: String?
    public var relevanceScore: Double?
    public var staleDate: Date?
    public var startedAt: Date
    public var endedAt: Date?
    public var dismissedAt: Date?
    /// The last `timestamp` sent to it (Unix seconds): every push gets a larger one.
    public var lastTimestamp: Int64?
    public var topics: [String]
    public var stateReason: String?
    /// The APNs environment of its update token (from the app's report or its installation's);
    /// nil: the server's default.
    public var environment: PushEnvironment?

    public init(id: String, bundleID: String, externalKey: String? = nil, installationID: String? = nil, attributesType: String, attributes: JSONValue? = nil,
                content: JSONValue? = nil, state: ActivityRecordState = .active, updateToken: String? = nil, channelID: String? = nil, relevanceScore: Double? = nil,
                staleDate: Date? = nil, startedAt: Date, endedAt: Date? = nil, dismissedAt: Date? = nil, lastTimestamp: Int64? = nil, topics: [String] = [], stateReason: String? = nil,
                environment: PushEnvironment? = nil) {
        self.environment = environment
        self.id = id
        self.bundleID = bundleID
        self.externalKey = externalKey
        self.installationID = installationID
        self.attributesType = attributesType
        self.attributes = attributes
        self.content = content
        self.state = state
        self.updateToken = updateToken
        self.channelID = channelID
        self.relevanceScore = relevanceScore
        self.staleDate = staleDate
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.dismissedAt = dismissedAt
        self.lastTimestamp = lastTimestamp
        self.topics = topics
        self.stateReason = stateReason
    }
}

public enum PushJobKind: String, Sendable, Hashable, Codable {
    case start, update, end, widgets
    /// A `controls` push: the app's Control Center controls reload (iOS 18).
    case controls
    /// An update or end broadcast to a channel.
    case broadcast
}

/// A broadcast channel the server created (iOS 18).
public struct ChannelRecord: Sendable, Hashable {
    public var id: String
    public var bundleID: String
    public var storagePolicy: Int
    public var createdAt: Date
    /// The environment it was created in: a channel lives in one (docs/protocol.md §7.1); nil: the
    /// server's default.
    public var environment: PushEnvironment?
    public init(id: String, bundleID: String, storagePolicy: Int, createdAt: Date, environment: PushEnvironment? = nil) {
        self.environment = environment
        self.id = id
        self.bundleID = bundleID
        self.storagePolicy = storagePolicy
        self.createdAt = createdAt
    }
}

/// An activity renewed past the system's 8-hour end (docs/server.md, "Activities that outlive 8
/// hours"): before the end a successor is started by push-to-start with the activity's attributes
/// and content, under its key; the activity ends once the successor's token is back.
public struct RenewalRecord: Sendable, Hashable {
    public var activityID: String
    public var bundleID: String
    /// Renewed while the activity's end would come before this.
    public var renewUntil: Date
    /// The successor's start alert (Apple asks for one with every push-to-start): `{"title", "body", "sound"?}`.
    public var alert: JSONValue
    public var createdAt: Date
    /// The activity started to follow this one (set before its start is queued).
    public var successorID: String?
    /// The activity this one follows.
    public var predecessorID: String?
    /// The successor's attributes and content when the server has none of the activity's own.
    public var attributes: JSONValue?
    public var contentState: JSONValue?

    public init(activityID: String, bundleID: String, renewUntil: Date, alert: JSONValue, createdAt: Date, successorID: String? = nil, predecessorID: String? = nil,
                attributes: JSONValue? = nil, contentState: JSONValue? = nil) {
        self.attributes = attributes
        self.contentState = contentState
        self.activityID = activityID
        self.bundleID = bundleID
        self.renewUntil = renewUntil
        self.alert = alert
        self.createdAt = createdAt
        self.successorID = successorID
        self.predecessorID = predecessorID
    }
}

/// A topic a backend opened as an audience (docs/server.md, "Topics as audiences"): its followers
/// on iOS 18 and later share a broadcast channel per APNs environment, made on demand; the rest
/// are reached by token.
public struct TopicRecord: Sendable, Hashable {
    public var bundleID: String
    public var topic: String
    /// The storage policy of the topic's channels (0: no storage, 1: the most recent message).
    public var storagePolicy: Int
    /// A channel with no push for this long and no live follower is closed.
    public var closeAfterIdle: TimeInterval
    public var createdAt: Date
    /// When the backend ended it (its channels close once the end went out); nil: open.
    public var endedAt: Date?
    /// Its last update or end.
    public var lastPushAt: Date?
    /// The `content-state` of its last update sent at once (a scheduled one is not counted): an
    /// activity that starts following the topic later is brought up to it (docs/server.md,
    /// "Topics as audiences").
    public var lastContent: JSONValue?

    public init(bundleID: String, topic: String, storagePolicy: Int, closeAfterIdle: TimeInterval, createdAt: Date, endedAt: Date? = nil, lastPushAt: Date? = nil,
                lastContent: JSONValue? = nil) {
        self.lastContent = lastContent
        self.bundleID = bundleID
        self.topic = topic
        self.storagePolicy = storagePolicy
        self.closeAfterIdle = closeAfterIdle
        self.createdAt = createdAt
        self.endedAt = endedAt
        self.lastPushAt = lastPushAt
    }
}

/// A topic's broadcast channel in one APNs environment.
public struct TopicChannel: Sendable, Hashable {
    public var channelID: String
    public var bundleID: String
    public var topic: String
    public var environment: PushEnvironment
    public var createdAt: Date
    /// Its last broadcast (or its creation).
    public var lastUsedAt: Date

    public init(channelID: String, bundleID: String, topic: String, environment: PushEnvironment, createdAt: Date, lastUsedAt: Date) {
        self.channelID = channelID
        self.bundleID = bundleID
        self.topic = topic
        self.environment = environment
        self.createdAt = createdAt
        self.lastUsedAt = lastUsedAt
    }
}

public enum PushJobState: String, Sendable, Hashable, Codable, CaseIterable {
    /// Waiting for its `sendAt`; it takes its place in its activity's order when it comes due.
    case scheduled
    /// In its activity's (or channel's) line, waiting to be sent or retried.
    case queued
    /// Handed to a worker, being sent.
    case claimed
    case sent, failed, superseded, dropped

    /// Nothing more will happen to the job.
    public var isFinished: Bool { self == .sent || self == .failed || self == .superseded || self == .dropped }
}

/// What a job sends, typed: built from the request and validated when Isle accepts the push,
/// encoded once then (``encoded``), and read back from the store as this type, never as a tree
/// of strings. Live Activity pushes — start, update and end, to a token or a broadcast channel —
/// are IsleCore's ``LiveActivityPayload``; a widget or control reload is ``WidgetPayload`` (both
/// carry `{"content-changed": true}`; the job's kind says which).
public enum JobPayload: Sendable, Hashable {
    /// Boxed (`indirect`): a fan-out's million jobs share the one payload, a reference each.
    indirect case liveActivity(LiveActivityPayload)
    case widgets(WidgetPayload)

    /// The Live Activity payload; nil for a widget reload.
    public var liveActivity: LiveActivityPayload? {
        if case .liveActivity(let p) = self { p } else { nil }
    }
    /// `start`, `update` or `end`; nil for a widget reload.
    public var event: LiveActivityEvent? { liveActivity?.event }
    public var hasAlert: Bool { liveActivity?.alert != nil }

    /// `aps` as the store holds it: compact JSON in ``LiveActivityPayload/apsKeyOrder``, without
    /// `timestamp` (each send splices its own in, ``LiveActivityPayload/wireBytes(encodedAPS:timestamp:)``).
    public var encoded: String {
        switch self {
        case .liveActivity(let p): JSONValue.object(p.apsWithoutTimestamp).jsonString
        case .widgets(let w): w.jsonValue["aps"]?.jsonString ?? #"{"content-changed":true}"#
        }
    }

    /// A stored job's payload, from its `aps` text. `acceptedAt` stands in for the timestamp the
    /// stored text leaves out (it gets its own when it is sent). Throws for text Isle did not
    /// write for a job of `kind`.
    public init(kind: PushJobKind, encoded: some Collection<UInt8>, acceptedAt: Date) throws(PayloadDecodingError) {
        let value: JSONValue
        do { value = try JSONParser.parse(Array(encoded)) } catch { throw PayloadDecodingError(field: nil, reason: "not JSON: \(error)") }
        guard let aps = value.objectValue else { throw PayloadDecodingError(field: nil, reason: "expected an object") }
        try self.init(kind: kind, aps: aps, acceptedAt: acceptedAt)
    }

    public init(kind: PushJobKind, aps: JSONObject, acceptedAt: Date) throws(PayloadDecodingError) {
        if kind == .widgets || kind == .controls {
            guard aps["content-changed"] == .bool(true), aps.keys.count == 1 else {
                throw PayloadDecodingError(field: nil, reason: "a \(kind.rawValue) push is {\"content-changed\": true}")
            }
            self = .widgets(WidgetPayload())
            return
        }
        let p = try LiveActivityPayload(aps: aps, timestamp: acceptedAt)
        let fits = switch kind {
        case .start: p.event == .start
        case .update: p.event == .update
        case .end: p.event == .end
        case .broadcast: p.event != .start
        case .widgets, .controls: false
        }
        guard fits else { throw PayloadDecodingError(field: APSKey.event, reason: "\(p.event.rawValue) is not the event of a \(kind.rawValue) job") }
        self = .liveActivity(p)
    }
}

/// One push Isle has accepted: durable from the moment the API answers 202.
public struct PushJob: Sendable, Hashable {
    public var id: Int64
    public var bundleID: String
    public var kind: PushJobKind
    public var activityID: String?
    public var installationID: String?
    public var channelID: String?
    /// What it sends, typed (its `timestamp` is the one it was accepted with; the wire gets the
    /// timestamp fixed at its first claim).
    public var payload: JobPayload
    /// ``payload`` as the store holds it (``JobPayload/encoded``): what a send splices its
    /// timestamp into, so a payload is encoded once, when it is accepted.
    public var encodedAPS: [UInt8]
    /// The priority the caller asked for (nil = Isle decides).
    public var requestedPriority: PushPriority?
    public var runAt: Date
    public var state: PushJobState
    public var attempts: Int
    public var claimedBy: String?
    public var claimedUntil: Date?
    public var lastError: String?
    public var createdAt: Date
    /// Jobs with one lane (an activity's, a broadcast channel's) go out one at a time in `seq` order.
    public var lane: String?
    /// Its place in its lane (nil while scheduled).
    public var seq: Int64?
    /// The W3C `traceparent` of the request that queued it, when the server traces
    /// (docs/server.md, "Tracing"): its attempts' spans join that trace.
    public var traceParent: String?
    /// The requests APNs received for it so far (a claim that sent nothing, because the app was
    /// paused or the server stopped, is not one).
    public var apnsRequests: Int = 0
    /// What APNs answered its last request; nil before the first.
    public var lastAnswer: APNsAnswer?

    public var hasAlert: Bool { payload.hasAlert }

    /// `encodedAPS` nil: encoded from `payload`.
    public init(id: Int64, bundleID: String, kind: PushJobKind, activityID: String?, installationID: String?, channelID: String?, payload: JobPayload, encodedAPS: [UInt8]? = nil,
                requestedPriority: PushPriority?, runAt: Date, state: PushJobState, attempts: Int, claimedBy: String?, claimedUntil: Date?, lastError: String?, createdAt: Date,
                lane: String?, seq: Int64?) {
        self.id = id
        self.bundleID = bundleID
        self.kind = kind
        self.activityID = activityID
        self.installationID = installationID
        self.channelID = channelID
        self.payload = payload
        self.encodedAPS = encodedAPS ?? Array(payload.encoded.utf8)
        self.requestedPriority = requestedPriority
        self.runAt = runAt
        self.state = state
        self.attempts = attempts
        self.claimedBy = claimedBy
        self.claimedUntil = claimedUntil
        self.lastError = lastError
        self.createdAt = createdAt
        self.lane = lane
        self.seq = seq
    }
}

/// APNs' answer to one request: its HTTP status and, for a refusal, its `reason`.
public struct APNsAnswer: Sendable, Hashable {
    public var status: Int
    public var reason: String?
    public init(status: Int, reason: String?) {
        self.status = status
        self.reason = reason
    }

    /// APNs' answer in a delivery record; nil when APNs answered nothing (status 0: the request
    /// failed on the way, or was refused before it left).
    public init?(delivery: DeliveryRecord) {
        guard delivery.status > 0 else { return nil }
        self.init(status: delivery.status, reason: delivery.reason)
    }
}

/// A push to enqueue.
public struct NewPushJob: Sendable, Hashable {
    public var bundleID: String
    public var kind: PushJobKind
    public var activityID: String?
    public var installationID: String?
    public let payload: JobPayload
    /// ``payload`` as stored, encoded once: the jobs of a fan-out share one encoding (``forActivity(_:)``).
    public let apsText: String
    public var hasAlert: Bool { payload.hasAlert }
    public var requestedPriority: PushPriority?
    public var runAt: Date
    public var channelID: String?
    /// The W3C `traceparent` of the API request that queued it, when the server traces (set by
    /// the server as it queues the job): the job's attempts become spans of that trace.
    public var traceParent: String?

    public init(bundleID: String, kind: PushJobKind, activityID: String? = nil, installationID: String? = nil, channelID: String? = nil, payload: JobPayload,
                requestedPriority: PushPriority? = nil, runAt: Date) {
        self.bundleID = bundleID
        self.kind = kind
        self.activityID = activityID
        self.installationID = installationID
        self.channelID = channelID
        self.payload = payload
        apsText = payload.encoded
        self.requestedPriority = requestedPriority
        self.runAt = runAt
    }

    /// The same push to another activity (payload and its encoding shared, not made again).
    public func forActivity(_ id: String) -> NewPushJob {
        var job = self
        job.activityID = id
        return job
    }
}

/// One attempt to deliver a job.
public struct DeliveryRecord: Sendable, Hashable, Codable {
    public var jobID: Int64
    public var activityID: String?
    public var apnsID: APNsID?
    public var apnsUniqueID: String?
    /// HTTP status, or 0 when APNs could not be reached.
    public var status: Int
    public var reason: String?
    public var latencyMS: Double
    public var priority: PushPriority
    /// Isle sent priority 5 although 10 was asked for (budget).
    public var downgraded: Bool
    public var at: Date
    /// The store's id for the record (set when read; a cursor for paging).
    public var id: Int64?
    /// What the device did with an accepted push, when the APNs tells (`isle sim` does, in its
    /// `isle-sim-outcome` header: "throttled: …"; Apple's APNs never does).
    public var deviceNote: String?

    public init(jobID: Int64, activityID: String?, apnsID: APNsID?, apnsUniqueID: String?, status: Int, reason: String?, latencyMS: Double, priority: PushPriority, downgraded: Bool, at: Date) {
        self.jobID = jobID
        self.activityID = activityID
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.status = status
        self.reason = reason
        self.latencyMS = latencyMS
        self.priority = priority
        self.downgraded = downgraded
        self.at = at
    }
}

/// A stored answer to a request made with an `Idempotency-Key`.
public struct IdempotencyRecord: Sendable, Hashable {
    /// How long a key is remembered: a repeat within this gets the first answer; after it the key
    /// may be used for a new request.
    public static let lifetime: TimeInterval = 86_400

    /// The client's `Idempotency-Key`, prefixed with the caller's key scope (`backend:` or
    /// `device:`): a device cannot take a key the backend will use.
    public var key: String
    public var bundleID: String
    /// SHA-256 of method + path + body: the same key with another request is a conflict.
    public var requestHash: String
    public var status: Int
    public var body: String
    public var createdAt: Date
    /// When set, the store adds the ids of the jobs it queues with this record to `body` under
    /// this name, so a replay gives the whole first answer.
    public var jobsField: String?
    public init(key: String, bundleID: String, requestHash: String, status: Int, body: String, createdAt: Date, jobsField: String? = nil) {
        self.key = key
        self.bundleID = bundleID
        self.requestHash = requestHash
        self.status = status
        self.body = body
        self.createdAt = createdAt
        self.jobsField = jobsField
    }

    /// The body with the job ids added, when ``jobsField`` asks for them.
    public func body(withJobs ids: [Int64]) -> String {
        guard let field = jobsField, case .object(var o)? = try? JSONParser.parse(Array(body.utf8)) else { return body }
        o[field] = .array(ids.map { .int($0) })
        return JSONValue.object(o).jsonString
    }

    public func isExpired(now: Date) -> Bool { createdAt < now.addingTimeInterval(-Self.lifetime) }
}

extension JobPayload {
    /// An update of `contentState`, accepted at `at`.
    public static func update(_ contentState: JSONValue, alert: LiveActivityAlert? = nil, staleDate: Date? = nil, relevanceScore: Double? = nil, at: Date) -> JobPayload {
        .liveActivity(LiveActivityPayload(event: .update, timestamp: at, contentState: contentState, staleDate: staleDate, relevanceScore: relevanceScore, alert: alert))
    }

    /// An end, with or without a final `contentState`, accepted at `at`.
    public static func end(_ contentState: JSONValue? = nil, alert: LiveActivityAlert? = nil, dismissalDate: Date? = nil, at: Date) -> JobPayload {
        .liveActivity(LiveActivityPayload(event: .end, timestamp: at, contentState: contentState, alert: alert, dismissalDate: dismissalDate))
    }

    /// A push-to-start of `attributesType` (the device drops one without an alert), accepted at `at`.
    public static func start(attributesType: String, attributes: JSONValue, contentState: JSONValue, alert: LiveActivityAlert, at: Date) -> JobPayload {
        .liveActivity(LiveActivityPayload(event: .start, timestamp: at, contentState: contentState, alert: alert, attributesType: attributesType,
                                          attributes: attributes, inputPushToken: true))
    }
}
