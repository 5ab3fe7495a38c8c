public import Foundation
public import IsleCore
public import IsleDelivery

// The request bodies. Rules between fields (a token or a channel; an update's content state) are
// the server's, after decoding; each type states what its fields mean for the document.

extension API {
    /// `PUT /v1/installations/{installation}`: what the device reports about itself.
    public struct InstallationReport: Codable, Sendable, WireDocumented {
        public var pushToStartTokens: PushToStartTokens?
        public var widgetToken: WirePatch<HexToken>?
        public var controlsToken: WirePatch<HexToken>?
        public var liveActivitiesEnabled: Bool?
        public var frequentPushesEnabled: Bool?
        public var environment: EnvironmentName?
        public var ticket: Ticket?
        public var broadcastChannels: Bool?
        public var topics: TopicList?

        public init(pushToStartTokens: PushToStartTokens? = nil, widgetToken: WirePatch<HexToken>? = nil, controlsToken: WirePatch<HexToken>? = nil,
                    liveActivitiesEnabled: Bool? = nil, frequentPushesEnabled: Bool? = nil, environment: EnvironmentName? = nil, ticket: Ticket? = nil,
                    broadcastChannels: Bool? = nil, topics: TopicList? = nil) {
            self.broadcastChannels = broadcastChannels
            self.topics = topics
            self.pushToStartTokens = pushToStartTokens
            self.widgetToken = widgetToken
            self.controlsToken = controlsToken
            self.liveActivitiesEnabled = liveActivitiesEnabled
            self.frequentPushesEnabled = frequentPushesEnabled
            self.environment = environment
            self.ticket = ticket
        }

        public static var wireDescription: String? { "What the device reports about itself; every field is optional, and an absent one keeps what is stored. userID is never taken from the device: the backend binds it (PUT /v1/installations/{id}/user, or a ticket)." }
        public static var wireFields: [String: String] {
            ["pushToStartTokens": "Attributes type → its push-to-start token (hex), or null to forget it; at most 32 types.",
             "widgetToken": "The app's widget push token (iOS 26; hex), or null to forget it.",
             "controlsToken": "The app's control push token (iOS 18, ControlPushHandler; hex), or null to forget it: POST /v1/installations/{id}/controls/reload pushes to it.",
             "environment": "The APNs environment of this installation's tokens: the build's aps-environment (development is the sandbox). Absent or null keeps what is stored; never said: the server's default (isle serve --sandbox/--production).",
             "ticket": "A registration ticket naming the installation's user (claim user): binds userID without the backend key. See docs/security.md.",
             "broadcastChannels": "The system has broadcast channels (iOS 18 and later): a push-to-start with a topic then puts the activity on the topic's channel (input-push-channel).",
             "topics": "The topics this installation follows for starts (a favourite team), replacing those stored: POST /v1/topics/{topic}/start starts an activity on each installation following the topic."]
        }
    }

    /// `POST /v1/activities`: the app registers an activity it started, or one started by push.
    public struct ActivityRegistration: Codable, Sendable, WireDocumented {
        public var attributesType: AttributesTypeName
        public var token: HexToken?
        public var channelID: RecordID?
        public var externalKey: ExternalKey?
        public var topics: TopicList?
        public var attributes: JSONObject?
        public var contentState: JSONObject?
        public var relevanceScore: Double?
        public var environment: EnvironmentName?
        public var ticket: Ticket?
        public var installationID: RecordID

        public init(attributesType: AttributesTypeName, installationID: RecordID, token: HexToken? = nil, channelID: RecordID? = nil, externalKey: ExternalKey? = nil,
                    topics: TopicList? = nil, attributes: JSONObject? = nil, contentState: JSONObject? = nil, relevanceScore: Double? = nil,
                    environment: EnvironmentName? = nil, ticket: Ticket? = nil) {
            self.attributesType = attributesType
            self.installationID = installationID
            self.token = token
            self.channelID = channelID
            self.externalKey = externalKey
            self.topics = topics
            self.attributes = attributes
            self.contentState = contentState
            self.relevanceScore = relevanceScore
            self.environment = environment
            self.ticket = ticket
        }

        public static var wireDescription: String? { "An activity the app started (token), or one it follows on a broadcast channel (channelID): one of the two is required (else 422 tokenOrChannelRequired)." }
        public static var wireFields: [String: String] {
            ["installationID": "The installation the activity runs on (registered first with PUT /v1/installations/{id}); the request carries its secret in Isle-Installation-Secret.",
             "token": "The activity's update token (hex). Required unless channelID is given.",
             "channelID": "Instead of token: the activity is subscribed to this channel (one of the app's: else 404).",
             "externalKey": "The backend's key for the activity: only with ticket (naming it), or to link the activity the backend started on this installation by push-to-start.",
             "attributes": "At most 4096 bytes as JSON (else 422 tooLarge); checked against the schema the app registered for attributesType (422 schemaMismatch).",
             "contentState": "At most 4096 bytes as JSON (else 422 tooLarge); checked against the schema the app registered for attributesType (422 schemaMismatch).",
             "environment": "The APNs environment of token. Absent or null: the installation's, else the server's default.",
             "ticket": "Required with externalKey (unless it links an activity the backend started by push-to-start on this installation): the backend's registration ticket naming that key. See docs/security.md."]
        }
    }

    /// `PUT /v1/activities/{activity}/token`: the activity's rotated update token.
    public struct TokenReport: Codable, Sendable {
        public var token: HexToken
        public init(token: HexToken) { self.token = token }
    }

    /// `PUT /v1/installations/{installation}/user`: the backend binds the person, or unbinds with null.
    public struct UserBinding: Codable, Sendable, WireDocumented {
        public var userID: WirePatch<UserID>
        public init(userID: WirePatch<UserID>) { self.userID = userID }
        public static var wireFields: [String: String] { ["userID": "The backend's id for the person, or null to unbind."] }
    }

    /// `PUT /v1/activities/{activity}/key`: the backend binds its key to an activity the app registered.
    public struct KeyBinding: Codable, Sendable, WireDocumented {
        public var externalKey: WirePatch<ExternalKey>
        public init(externalKey: WirePatch<ExternalKey>) { self.externalKey = externalKey }
        public static var wireFields: [String: String] { ["externalKey": "The backend's key for the activity, or null to unbind it."] }
    }

    /// An alert: the device lights up and shows it (an update's, an end's, a start's).
    public struct Alert: Codable, Sendable, Hashable {
        public var title: AlertText
        public var body: AlertText
        public var sound: String?
        public init(title: AlertText, body: AlertText, sound: String? = nil) {
            self.title = title
            self.body = body
            self.sound = sound
        }
        /// As the `aps` alert of a Live Activity push takes it.
        public var json: JSONValue {
            var o: JSONObject = ["title": title.wire, "body": body.wire]
            if let sound { o["sound"] = .string(sound) }
            return .object(o)
        }
    }

    /// `POST …/update`: new content for an activity, its key's, a topic's or a channel's.
    public struct Update: Codable, Sendable, WireDocumented {
        public var contentState: JSONObject
        public var alert: Alert?
        public var staleDate: Date?
        public var relevanceScore: Double?
        public var priority: PriorityNumber?
        public var sendAt: Date?
        public init(contentState: JSONObject, alert: Alert? = nil, staleDate: Date? = nil, relevanceScore: Double? = nil, priority: PriorityNumber? = nil, sendAt: Date? = nil) {
            self.contentState = contentState
            self.alert = alert
            self.staleDate = staleDate
            self.relevanceScore = relevanceScore
            self.priority = priority
            self.sendAt = sendAt
        }
        public static var wireFields: [String: String] { PushWords.fields }
    }

    /// `POST …/end`: the activity ends (with its final content, if given).
    public struct End: Codable, Sendable, WireDocumented {
        public var contentState: JSONObject?
        public var alert: Alert?
        public var staleDate: Date?
        public var relevanceScore: Double?
        public var dismissalDate: Date?
        public var priority: PriorityNumber?
        public var sendAt: Date?
        public init(contentState: JSONObject? = nil, alert: Alert? = nil, staleDate: Date? = nil, relevanceScore: Double? = nil, dismissalDate: Date? = nil,
                    priority: PriorityNumber? = nil, sendAt: Date? = nil) {
            self.contentState = contentState
            self.alert = alert
            self.staleDate = staleDate
            self.relevanceScore = relevanceScore
            self.dismissalDate = dismissalDate
            self.priority = priority
            self.sendAt = sendAt
        }
        public static var wireFields: [String: String] {
            PushWords.fields.merging(["contentState": "The final content; without it (or null) the end keeps the content the phone shows.",
                                      "dismissalDate": "When the system removes the ended activity (Unix seconds; a fraction is dropped); absent: the system's default (up to 4 hours)."]) { $1 }
        }
    }

    /// `POST /v1/installations/{installation}/start`, `POST /v1/users/{user}/start`: push-to-start.
    public struct Start: Codable, Sendable, WireDocumented {
        public var attributesType: AttributesTypeName
        public var attributes: JSONObject
        public var contentState: JSONObject
        public var alert: Alert
        public var staleDate: Date?
        public var relevanceScore: Double?
        public var externalKey: ExternalKey?
        public var topics: TopicList?
        public var sendAt: Date?
        public init(attributesType: AttributesTypeName, attributes: JSONObject, contentState: JSONObject, alert: Alert, staleDate: Date? = nil, relevanceScore: Double? = nil,
                    externalKey: ExternalKey? = nil, topics: TopicList? = nil, sendAt: Date? = nil) {
            self.sendAt = sendAt
            self.attributesType = attributesType
            self.attributes = attributes
            self.contentState = contentState
            self.alert = alert
            self.staleDate = staleDate
            self.relevanceScore = relevanceScore
            self.externalKey = externalKey
            self.topics = topics
        }
        public static var wireFields: [String: String] {
            ["alert": "Required: the device drops a push-to-start without one.", "externalKey": "The backend's key for the started activities.",
             "staleDate": PushWords.fields["staleDate"]!,
             "sendAt": "Start at this time (Unix seconds), not now (a match's kick-off): the start waits, scheduled, until then; at most the server's job deadline ahead (8 hours by default; else 422 sendAtTooLate)."]
        }
    }

    /// `PUT /v1/activities/{activity}/renewal`: renew the activity past the system's 8-hour end.
    public struct RenewalSettings: Codable, Sendable, WireDocumented {
        public var renewUntil: Date
        public var alert: Alert
        public var attributes: JSONObject?
        public var contentState: JSONObject?
        public init(renewUntil: Date, alert: Alert, attributes: JSONObject? = nil, contentState: JSONObject? = nil) {
            self.renewUntil = renewUntil
            self.alert = alert
            self.attributes = attributes
            self.contentState = contentState
        }
        public static var wireDescription: String? {
            "Before the system ends the activity (8 hours after it started), Isle starts a successor by push-to-start on its installation with its attributes and current content, under its key and topics, and ends the activity at once when the successor's token is back; repeated until renewUntil."
        }
        public static var wireFields: [String: String] {
            ["renewUntil": "Renew while the activity would end before this (Unix seconds; at most 30 days ahead).",
             "alert": "The successor's start alert: Apple asks for one with every push-to-start (the person sees it).",
             "attributes": "The activity's attributes, for the successor: required when the server has none (IsleClient never sends them; ActivityKit keeps them).",
             "contentState": "The content for the successor if nothing has been pushed to the activity by then (otherwise its last pushed content is used)."]
        }
    }

    /// `POST /v1/channels`.
    public struct ChannelCreation: Codable, Sendable, WireDocumented {
        public var storagePolicy: StoragePolicyNumber?
        public var environment: EnvironmentName?
        public init(storagePolicy: StoragePolicyNumber? = nil, environment: EnvironmentName? = nil) {
            self.storagePolicy = storagePolicy
            self.environment = environment
        }
        public static var wireFields: [String: String] {
            ["storagePolicy": "0 (default): the channel keeps no message for offline devices; 1: the most recent.",
             "environment": "The APNs environment to create the channel in (a channel lives in one). Absent or null: the server's default."]
        }
    }

    /// `PUT /v1/topics/{topic}`: the backend opens a topic as an audience (or changes its settings).
    public struct TopicSettings: Codable, Sendable, WireDocumented {
        public var storagePolicy: StoragePolicyNumber?
        public var closeAfterIdle: IdleSeconds?
        public init(storagePolicy: StoragePolicyNumber? = nil, closeAfterIdle: IdleSeconds? = nil) {
            self.storagePolicy = storagePolicy
            self.closeAfterIdle = closeAfterIdle
        }
        public static var wireDescription: String? {
            "Opens the topic as an audience: followers on iOS 18 and later get its broadcast channel (one per APNs environment, made when the first follower asks), the rest are reached by token. Putting an ended topic opens it again."
        }
        public static var wireFields: [String: String] {
            ["storagePolicy": "The channels' storage policy: 0 (default) keeps no message for an offline device, 1 the most recent.",
             "closeAfterIdle": "A channel with no broadcast for this many seconds and no live follower is closed (default: the server's --topic-idle, 24 hours)."]
        }
    }

    /// `POST /v1/topics/{topic}/channel` (device key): the topic's channel for this installation's environment.
    public struct TopicChannelRequest: Codable, Sendable, WireDocumented {
        public var installationID: RecordID
        public init(installationID: RecordID) { self.installationID = installationID }
        public static var wireFields: [String: String] { ["installationID": "The installation asking (with its Isle-Installation-Secret): the channel is its APNs environment's."] }
    }

    /// `POST /v1/webhooks`.
    public struct WebhookCreation: Codable, Sendable, WireDocumented {
        public var url: WebhookURL
        public var eventTypes: [EventType]?
        public init(url: WebhookURL, eventTypes: [EventType]? = nil) {
            self.url = url
            self.eventTypes = eventTypes
        }
        public static var wireFields: [String: String] { WebhookWords.fields }
        public static var wireFieldExtras: [String: JSONObject] { ["eventTypes": ["minItems": 1]] }
    }

    /// `PATCH /v1/webhooks/{webhook}`: at least one field.
    public struct WebhookChange: Codable, Sendable, WireDocumented {
        public var url: WebhookURL?
        public var eventTypes: WirePatch<[EventType]>?
        public var enabled: Bool?
        public init(url: WebhookURL? = nil, eventTypes: WirePatch<[EventType]>? = nil, enabled: Bool? = nil) {
            self.url = url
            self.eventTypes = eventTypes
            self.enabled = enabled
        }
        public static var wireFields: [String: String] {
            WebhookWords.fields.merging(["enabled": "false: nothing is sent until it is enabled again (a webhook.disabled event tells the stream); true: enabled, its failure cleared, what waited is sent."]) { $1 }
        }
        public static var wireExtra: JSONObject { ["minProperties": 1] }
        public static var wireFieldExtras: [String: JSONObject] { ["eventTypes": ["minItems": 1]] }
    }

    /// `POST /v1/webhooks/{webhook}/rotate-secret`.
    public struct WebhookRotation: Codable, Sendable, WireDocumented {
        public var overlapSeconds: OverlapSeconds?
        public init(overlapSeconds: OverlapSeconds? = nil) { self.overlapSeconds = overlapSeconds }
        public static var wireFields: [String: String] { ["overlapSeconds": "How long requests are signed with the old secret too (null or absent: 86400)."] }
    }

    /// `POST /v1/webhooks/{webhook}/replay`.
    public struct WebhookReplay: Codable, Sendable, WireDocumented {
        public var after: EventCursor
        public init(after: EventCursor) { self.after = after }
        public static var wireFields: [String: String] { ["after": "Send again the events after this: a next of GET /v1/events, or an event id (evt_<n>). Past the newest event: 422 cursorAhead."] }
    }

    /// `POST /v1/webhooks/{webhook}/redeliver`.
    public struct WebhookRedelivery: Codable, Sendable {
        public var eventID: EventID
        public init(eventID: EventID) { self.eventID = eventID }
    }
}

enum PushWords {
    static let date = "Unix seconds (a fraction is dropped)"
    static let fields: [String: String] = [
        "contentState": "The new content state: the app's ContentState as JSON (checked against the schema the app registered, if any).",
        "alert": "Lights the screen up and shows this (title and body: text, or loc-key and loc-args).",
        "staleDate": "When the system marks the activity stale: \(date).",
        "relevanceScore": "Orders the app's activities in the Dynamic Island and on the Lock Screen.",
        "priority": "10: send now (counts against the hourly budget); 5: when the device's power allows; 1 (broadcast channels only: a push to an activity's token is a 422 priorityNotAllowed): prioritize the device's power, never wake it. Absent: Isle chooses (docs/server.md).",
        "sendAt": "Send at this time (Unix seconds), not now; the job waits, scheduled, until then. At most the server's job deadline ahead (8 hours by default; else 422 sendAtTooLate).",
    ]
}

enum WebhookWords {
    static let fields: [String: String] = [
        "url": "An absolute http:// or https:// URL (no user or password, no fragment), at most 512 characters. By default only hosts whose addresses are all public are taken; the server may allow only some hosts (isle serve --webhook-hosts). A host refused is a 422 (webhookHostNotAllowed, webhookAddressNotAllowed).",
        "eventTypes": "The event types it receives (at least one); null or absent: every type. Other events are passed over (its cursor moves past them).",
    ]
}
