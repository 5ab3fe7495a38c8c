public import Foundation
public import IsleCore
public import IsleDelivery

// The answers. Every field of an answer is written; an optional one as null (``WireEncoder``),
// except in a ``WireSparse`` type, whose absent fields are left out (an accepted push's `jobs`).

extension API {
    /// An activity as Isle keeps it.
    public struct Activity: Codable, Sendable, Hashable, WireDocumented {
        public var id: String
        public var externalKey: String?
        public var installationID: String?
        public var attributesType: String
        public var attributes: JSONObject?
        public var contentState: JSONObject?
        public var state: ActivityRecordState
        public var stateReason: String?
        public var hasToken: Bool
        public var topics: [String]
        public var relevanceScore: Double?
        public var staleDate: Date?
        public var startedAt: Date
        public var endedAt: Date?
        public var dismissedAt: Date?
        public var environment: PushEnvironment?

        public init(id: String, externalKey: String?, installationID: String?, attributesType: String, attributes: JSONObject?, contentState: JSONObject?,
                    state: ActivityRecordState, stateReason: String?, hasToken: Bool, topics: [String], relevanceScore: Double?, staleDate: Date?, startedAt: Date,
                    endedAt: Date?, dismissedAt: Date?, environment: PushEnvironment?) {
            self.id = id
            self.externalKey = externalKey
            self.installationID = installationID
            self.attributesType = attributesType
            self.attributes = attributes
            self.contentState = contentState
            self.state = state
            self.stateReason = stateReason
            self.hasToken = hasToken
            self.topics = topics
            self.relevanceScore = relevanceScore
            self.staleDate = staleDate
            self.startedAt = startedAt
            self.endedAt = endedAt
            self.dismissedAt = dismissedAt
            self.environment = environment
        }

        public static var wireDescription: String? { "An activity as Isle keeps it." }
        public static var wireFields: [String: String] {
            ["attributes": "The activity's static attributes, or null.", "contentState": "Its content state as last delivered or registered, or null.",
             "stateReason": "Why it is in its state (ended by the device, a token APNs retired, …).", "hasToken": "Whether Isle holds an update token for it.",
             "environment": "The APNs environment of its token; null: the server's default."]
        }
    }

    /// `GET /v1/activities/{activity}`: the activity's fields with a page of its deliveries.
    public struct ActivityDetail: Codable, Sendable, WireDocumented {
        public var activity: Activity
        public var budget: Budget
        public var deliveries: [Delivery]
        public var moreDeliveries: DeliveryCursor?
        public init(activity: Activity, budget: Budget, deliveries: [Delivery], moreDeliveries: DeliveryCursor?) {
            self.activity = activity
            self.budget = budget
            self.deliveries = deliveries
            self.moreDeliveries = moreDeliveries
        }
        enum Keys: String, CodingKey { case budget, deliveries, moreDeliveries }
        // The activity's fields and the page's side by side, as one object.
        public init(from decoder: any Decoder) throws {
            activity = try Activity(from: decoder)
            let c = try decoder.container(keyedBy: Keys.self)
            budget = try c.decode(Budget.self, forKey: .budget)
            deliveries = try c.decode([Delivery].self, forKey: .deliveries)
            moreDeliveries = try c.decodeIfPresent(DeliveryCursor.self, forKey: .moreDeliveries)
        }
        public func encode(to encoder: any Encoder) throws {
            try activity.encode(to: encoder)
            var c = encoder.container(keyedBy: Keys.self)
            try c.encode(budget, forKey: .budget)
            try c.encode(deliveries, forKey: .deliveries)
            try c.encodeIfPresent(moreDeliveries, forKey: .moreDeliveries)
        }
        public static var wireDescription: String? { Activity.wireDescription.map { $0 + " With its priority-10 budget and a page of its deliveries." } }
        public static var wireFields: [String: String] {
            Activity.wireFields.merging(["budget": "The priority-10 budget this activity's pushes spend, counted as Isle counts it (docs/server.md, \"The priority-10 budget\").",
                                         "deliveries": "The newest deliveries (?deliveries=, default 100), oldest first.",
                                         "moreDeliveries": "Older deliveries: ask again with ?before= this; null when there are none."]) { $1 }
        }
    }

    /// The priority-10 budget an activity's pushes spend, in the last hour.
    public struct Budget: Codable, Sendable, Hashable, WireDocumented {
        public var per: BudgetScope
        public var used: Int
        public var limit: Int
        public init(per: BudgetScope, used: Int, limit: Int) {
            self.per = per
            self.used = used
            self.limit = limit
        }
        public static var wireDescription: String? { "Priority-10 pushes in the last hour against the hourly budget; past it, Isle sends priority 5." }
        public static var wireFields: [String: String] {
            ["per": "installation: the app on that phone, all its activities and channels together (the default, as a phone may count it); activity: this activity alone (isle serve --budget-per activity, or an activity registered without an installation).",
             "used": "Priority-10 pushes counted in the last hour.", "limit": "The pushes Isle sends at priority 10 in an hour: the budget (more when the app declares frequent updates and the person has them on), less the one Isle keeps in hand per installation."]
        }
    }

    public struct DeliveryCursor: Codable, Sendable {
        public var before: Int64
        public init(before: Int64) { self.before = before }
    }

    /// `GET /v1/activities`: a page, newest first.
    public struct ActivityPage: Codable, Sendable, WireDocumented {
        public var activities: [Activity]
        public var next: String?
        public init(activities: [Activity], next: String?) {
            self.activities = activities
            self.next = next
        }
        public static var wireFields: [String: String] { ["next": "Ask with after=next for the page after this one; null on the last page."] }
    }

    /// One push's answer from APNs.
    public struct Delivery: Codable, Sendable, WireDocumented {
        public var id: Int64?
        public var jobID: Int64
        public var activityID: String?
        public var apnsID: String?
        public var apnsUniqueID: String?
        public var status: Int64
        public var reason: String?
        public var latencyMS: Double
        public var priority: Int
        public var downgraded: Bool
        public var at: Date
        public init(id: Int64?, jobID: Int64, activityID: String?, apnsID: String?, apnsUniqueID: String?, status: Int64, reason: String?, latencyMS: Double, priority: Int,
                    downgraded: Bool, at: Date) {
            self.id = id
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
        public static var wireFields: [String: String] {
            ["status": "APNs' HTTP status (200: accepted; 0: no answer)", "reason": "APNs' reason, when it refused", "downgraded": "Sent at priority 5 though 10 was asked (the budget)"]
        }
    }

    /// An installation as Isle keeps it (never its tokens or secret).
    public struct Installation: Codable, Sendable, WireDocumented {
        public var id: String
        public var bundleID: String
        public var userID: String?
        public var pushToStartTypes: [String]
        public var hasWidgetToken: Bool
        public var hasControlsToken: Bool
        public var liveActivitiesEnabled: Bool
        public var frequentPushesEnabled: Bool
        public var updatedAt: Date
        public var environment: PushEnvironment?
        public var broadcastChannels: Bool?
        public var topics: [String]
        public init(id: String, bundleID: String, userID: String?, pushToStartTypes: [String], hasWidgetToken: Bool, hasControlsToken: Bool = false, liveActivitiesEnabled: Bool,
                    frequentPushesEnabled: Bool, updatedAt: Date, environment: PushEnvironment?, broadcastChannels: Bool? = nil, topics: [String] = []) {
            self.broadcastChannels = broadcastChannels
            self.topics = topics
            self.hasControlsToken = hasControlsToken
            self.id = id
            self.bundleID = bundleID
            self.userID = userID
            self.pushToStartTypes = pushToStartTypes
            self.hasWidgetToken = hasWidgetToken
            self.liveActivitiesEnabled = liveActivitiesEnabled
            self.frequentPushesEnabled = frequentPushesEnabled
            self.updatedAt = updatedAt
            self.environment = environment
        }
        public static var wireFields: [String: String] {
            ["pushToStartTypes": "The attributes types it holds a push-to-start token for.",
             "broadcastChannels": "The system has broadcast channels (iOS 18 and later), as the app reported; null: not said.",
             "topics": "The topics it follows for starts."]
        }
    }

    /// `PUT /v1/installations/{installation}`: the installation's fields, and its secret once.
    public struct InstallationRegistration: Codable, Sendable, WireDocumented {
        public var installation: Installation
        public var installationSecret: String?
        public init(installation: Installation, installationSecret: String?) {
            self.installation = installation
            self.installationSecret = installationSecret
        }
        enum Keys: String, CodingKey { case installationSecret }
        public init(from decoder: any Decoder) throws {
            installation = try Installation(from: decoder)
            installationSecret = try decoder.container(keyedBy: Keys.self).decodeIfPresent(String.self, forKey: .installationSecret)
        }
        public func encode(to encoder: any Encoder) throws {
            try installation.encode(to: encoder)
            if let installationSecret {
                var c = encoder.container(keyedBy: Keys.self)
                try c.encode(installationSecret, forKey: .installationSecret)
            }
        }
        public static var wireOmitted: Set<String> { ["installationSecret"] }
        public static var wireFields: [String: String] {
            Installation.wireFields.merging(["installationSecret": "Only in the answer to a first registration that presented no secret (never in a replayed answer): keep it (the Keychain) and send it as Isle-Installation-Secret."]) { $1 }
        }
    }

    public struct InstallationDeletion: Codable, Sendable, WireDocumented {
        public var id: String
        public var deleted: Bool
        public var activitiesEnded: Int64
        public init(id: String, activitiesEnded: Int64) {
            self.id = id
            self.deleted = true
            self.activitiesEnded = activitiesEnded
        }
        public static var wireFields: [String: String] { ["activitiesEnded": "How many of its live activities were ended."] }
    }

    /// A validator's warning (a strict request refuses on any).
    public struct Finding: Codable, Sendable, Hashable {
        public var code: String
        public var field: String?
        public var message: String
        public var fix: String
        public init(code: String, field: String?, message: String, fix: String) {
            self.code = code
            self.field = field
            self.message = message
            self.fix = fix
        }
    }

    /// A push (or pushes) accepted: committed, and sent by the engine.
    public struct Accepted: Codable, Sendable, WireDocumented, WireSparse {
        public var accepted: Int64
        public var activityID: String?
        public var activityIDs: [String]?
        public var warnings: [Finding]?
        public var jobs: [Int64]?
        public var audience: Audience?
        public init(accepted: Int64, activityID: String? = nil, activityIDs: [String]? = nil, warnings: [Finding]? = nil, jobs: [Int64]? = nil, audience: Audience? = nil) {
            self.audience = audience
            self.accepted = accepted
            self.activityID = activityID
            self.activityIDs = activityIDs
            self.warnings = warnings
            self.jobs = jobs
        }
        public static var wireDescription: String? { "Accepted: committed before this answer, and sent by the delivery engine (events tell the outcome)." }
        public static var wireFields: [String: String] {
            ["accepted": "How many pushes were queued.", "activityID": "The activity, when one was addressed.", "activityIDs": "The activities, when a key names several.",
             "warnings": "The validator's warnings (absent: none); with Isle-Strict: true they are a 422 instead.",
             "jobs": "The queued jobs' ids (GET /v1/jobs; DELETE /v1/jobs/{job}); absent from a replayed answer of a fan-out.",
             "audience": "A topic's two legs: its broadcasts and the followers they reach, and the followers reached by token (absent for other targets)."]
        }
    }

    /// How a topic update reaches its followers: one broadcast per channel, a push per token.
    public struct Audience: Codable, Sendable, WireDocumented {
        public var broadcasts: Int64
        public var channelFollowers: Int64
        public var tokenFollowers: Int64
        public init(broadcasts: Int64, channelFollowers: Int64, tokenFollowers: Int64) {
            self.broadcasts = broadcasts
            self.channelFollowers = channelFollowers
            self.tokenFollowers = tokenFollowers
        }
        public static var wireFields: [String: String] {
            ["broadcasts": "Broadcasts queued: one per channel of the topic (an APNs environment each).",
             "channelFollowers": "Live followers on those channels (iOS 18 and later): the broadcasts reach them.",
             "tokenFollowers": "Live followers reached by a push to their own token (before iOS 18, or with no channel)."]
        }
    }

    /// An activity's renewal past the system's 8 hours.
    public struct Renewal: Codable, Sendable, WireDocumented {
        public var activityID: String
        public var renewUntil: Date
        public var successorID: String?
        public var predecessorID: String?
        public init(activityID: String, renewUntil: Date, successorID: String?, predecessorID: String?) {
            self.activityID = activityID
            self.renewUntil = renewUntil
            self.successorID = successorID
            self.predecessorID = predecessorID
        }
        public static var wireFields: [String: String] {
            ["successorID": "The activity started to follow it, once its renewal came due; null before.",
             "predecessorID": "The activity it follows (it was started as a renewal); null for the first."]
        }
    }

    /// A topic opened as an audience, with its channels.
    public struct TopicView: Codable, Sendable, WireDocumented {
        public var topic: String
        public var storagePolicy: Int64
        public var closeAfterIdle: Int64
        public var createdAt: Date
        public var endedAt: Date?
        public var lastPushAt: Date?
        public var channels: [TopicChannelView]
        public var channelFollowers: Int64
        public var tokenFollowers: Int64
        public init(topic: String, storagePolicy: Int64, closeAfterIdle: Int64, createdAt: Date, endedAt: Date?, lastPushAt: Date?, channels: [TopicChannelView],
                    channelFollowers: Int64, tokenFollowers: Int64) {
            self.topic = topic
            self.storagePolicy = storagePolicy
            self.closeAfterIdle = closeAfterIdle
            self.createdAt = createdAt
            self.endedAt = endedAt
            self.lastPushAt = lastPushAt
            self.channels = channels
            self.channelFollowers = channelFollowers
            self.tokenFollowers = tokenFollowers
        }
        public static var wireFields: [String: String] {
            ["closeAfterIdle": "Seconds without a broadcast after which a channel with no live follower is closed.",
             "endedAt": "When the backend ended it: its channels close once the end went out; null while open.",
             "channels": "Its broadcast channels, one per APNs environment at most, made when a follower first asked.",
             "channelFollowers": "Live followers on its channels.", "tokenFollowers": "Live followers reached by token."]
        }
    }

    public struct TopicChannelView: Codable, Sendable {
        public var channelID: String
        public var environment: PushEnvironment
        public var createdAt: Date
        public var lastUsedAt: Date
        public init(channelID: String, environment: PushEnvironment, createdAt: Date, lastUsedAt: Date) {
            self.channelID = channelID
            self.environment = environment
            self.createdAt = createdAt
            self.lastUsedAt = lastUsedAt
        }
    }

    /// `POST /v1/topics/{topic}/channel`: the channel the app starts or subscribes its activity with.
    public struct FollowChannel: Codable, Sendable, WireDocumented {
        public var topic: String
        public var channelID: String
        public var environment: PushEnvironment
        public init(topic: String, channelID: String, environment: PushEnvironment) {
            self.topic = topic
            self.channelID = channelID
            self.environment = environment
        }
        public static var wireFields: [String: String] {
            ["channelID": "Start the activity with pushType .channel(channelID) (iOS 18 and later) and register it with this channelID and the topic."]
        }
    }

    /// Push-to-start accepted: the activities it made, each `starting` until the device registers it.
    public struct StartAccepted: Codable, Sendable, WireSparse {
        public var accepted: Int64
        public var activities: [StartedActivity]
        public var warnings: [Finding]?
        public init(accepted: Int64, activities: [StartedActivity], warnings: [Finding]?) {
            self.accepted = accepted
            self.activities = activities
            self.warnings = warnings
        }
    }

    public struct StartedActivity: Codable, Sendable, WireDocumented {
        public var activityID: String
        public var installationID: String
        public var channelID: String?
        public init(activityID: String, installationID: String, channelID: String? = nil) {
            self.activityID = activityID
            self.installationID = installationID
            self.channelID = channelID
        }
        public static var wireFields: [String: String] {
            ["channelID": "The topic's broadcast channel the activity starts on (input-push-channel, iOS 18 and later); null: it starts with input-push-token and hands back its update token."]
        }
    }

    /// A broadcast channel of the app's.
    public struct Channel: Codable, Sendable {
        public var id: String
        public var storagePolicy: Int64
        public var environment: PushEnvironment?
        public init(id: String, storagePolicy: Int64, environment: PushEnvironment?) {
            self.id = id
            self.storagePolicy = storagePolicy
            self.environment = environment
        }
    }

    public struct ChannelList: Codable, Sendable {
        public var channels: [Channel]
        public init(channels: [Channel]) { self.channels = channels }
    }

    /// How the app's delivery stands.
    public struct AppStatus: Codable, Sendable {
        public var bundleID: String
        public var delivery: AppDelivery
        public init(bundleID: String, delivery: AppDelivery) {
            self.bundleID = bundleID
            self.delivery = delivery
        }
    }

    public struct AppDelivery: Codable, Sendable, WireDocumented {
        public enum State: String, WireEnum { case running, backingOff, paused }
        public var state: State
        public var reason: String?
        public var since: Date?
        public var retryAt: Date?
        public var retrying: Retrying?
        public init(state: State, reason: String? = nil, since: Date? = nil, retryAt: Date? = nil, retrying: Retrying? = nil) {
            self.state = state
            self.reason = reason
            self.since = since
            self.retryAt = retryAt
            self.retrying = retrying
        }
        public static var wireFields: [String: String] {
            ["retryAt": "The next probe of APNs; null when paused by an operator (until resumed).",
             "retrying": "Pushes APNs refused with an answer Isle retries (a kept BadDeviceToken, a 429, a 5xx), as this instance sends them; null when none (docs/server.md, \"When a push is retried, and when it fails\")."]
        }
    }

    /// The app's pushes being retried after an APNs refusal.
    public struct Retrying: Codable, Sendable, WireDocumented {
        public var pushes: Int64
        public var since: Date
        public var jobIDs: [Int64]
        public var lastAnswer: String
        public var reason: String
        public init(pushes: Int64, since: Date, jobIDs: [Int64], lastAnswer: String, reason: String) {
            self.pushes = pushes
            self.since = since
            self.jobIDs = jobIDs
            self.lastAnswer = lastAnswer
            self.reason = reason
        }
        public static var wireFields: [String: String] {
            ["pushes": "How many.", "since": "When the oldest was first refused.", "jobIDs": "The first 20, oldest first (GET /v1/jobs/{job}).",
             "lastAnswer": "APNs' answer to the oldest, e.g. 400 BadDeviceToken.", "reason": "What Isle makes of it and what to do."]
        }
    }

    public struct Health: Codable, Sendable {
        public var status: String
        public init() { status = "ok" }
    }

    /// `GET /ready`.
    public struct Readiness: Codable, Sendable, WireDocumented, WireSparse {
        public enum Status: String, WireEnum { case ready, degraded }
        public var status: Status
        public var apps: [AppStatus]?
        public init(status: Status, apps: [AppStatus]?) {
            self.status = status
            self.apps = apps
        }
        public static var wireFields: [String: String] { ["apps": "The apps paused, backing off or with pushes being retried, only for a console key (what it may see)."] }
    }

    // MARK: Events

    /// An event (docs/events.md), as webhooks and `GET /v1/events` carry it.
    public struct Event: Codable, Sendable, Hashable, WireDocumented {
        public var id: String
        public var type: EventType
        public var app: String
        public var activityID: String?
        public var externalKey: String?
        public var installationID: String?
        public var userID: String?
        public var at: Date
        public var data: EventData
        public init(id: String, type: EventType, app: String, activityID: String?, externalKey: String?, installationID: String?, userID: String?, at: Date, data: EventData) {
            self.id = id
            self.type = type
            self.app = app
            self.activityID = activityID
            self.externalKey = externalKey
            self.installationID = installationID
            self.userID = userID
            self.at = at
            self.data = data
        }
        public static var wireFields: [String: String] {
            ["id": "evt_<n>: the same at every delivery of the event; de-duplicate by it.", "activityID": "The activity the event is about, if any.",
             "externalKey": "The activity's externalKey when the event happened.", "installationID": "The installation the event concerns, when it happened.",
             "userID": "The user bound to that installation when the event happened.", "at": "When the fact happened (a failed push: when it failed for good).",
             "data": "The type's fields (docs/events.md); a field a type does not have is left out."]
        }
    }

    /// An event's fields beyond its subject: which are there depends on its type (docs/events.md).
    public struct EventData: Codable, Sendable, Hashable, WireDocumented, WireSparse {
        public var jobID: Int64?
        public var kind: String?
        public var attempts: Int64?
        public var channelID: String?
        public var apnsID: String?
        public var apnsUniqueID: String?
        public var priority: Int64?
        public var downgraded: Bool?
        public var reason: String?
        public var status: Int64?
        public var apnsReason: String?
        public var token: String?
        public var attributesType: String?
        public var installationID: String?
        public var source: String?
        public var cause: String?
        public var probeAt: Date?
        public var keyID: String?
        public var webhookID: String?
        public var url: String?
        public var failingSince: Date?
        public var retryAt: Date?
        public init() {}
        public static var wireFields: [String: String] {
            ["jobID": "push.*: the job", "kind": "push.*: update, end, start, broadcast, widgets, controls", "attempts": "push.*: the requests APNs answered for it",
             "status": "push.failed, push.retrying: APNs' last HTTP status", "apnsReason": "push.failed, push.retrying, token.retired: APNs' last reason", "reason": "push.failed: why it failed; push.retrying: why it is retried; app.paused, webhook.disabled: why",
             "retryAt": "push.retrying: when Isle tries again",
             "token": "token.retired: update, pushToStart, widget or controls", "source": "activity.*, app.resumed, webhook.disabled: who (device, operator, api, console, failures, …)",
             "cause": "app.paused: configuration, apnsUnavailable or operator", "probeAt": "app.paused: when Isle tries APNs again"]
        }
    }

    public struct EventPage: Codable, Sendable, WireDocumented {
        public var events: [Event]
        public var next: String
        public init(events: [Event], next: String) {
            self.events = events
            self.next = next
        }
        public static var wireFields: [String: String] { ["next": "The cursor for the next call (after=…)."] }
    }

    // MARK: Webhooks

    public struct Webhook: Codable, Sendable, WireDocumented, WireSparse {
        public enum Status: String, WireEnum { case ok, failing, stopped, disabled }
        public var id: String
        public var url: String
        public var secret: String?
        public var createdAt: Date
        public var status: Status
        public var keyID: String?
        public var stoppedBecause: String?
        public var cursor: String
        public var delivered: Int64
        public var waiting: Int64
        public var waitingMore: Bool
        public var lastSuccessAt: Date?
        public var failure: WebhookFailure?
        public var eventTypes: WirePatch<[EventType]>
        public var enabled: Bool
        public var disabledAt: Date?
        public var disabledReason: String?
        public var previousSecretValidUntil: Date?
        public init(id: String, url: String, createdAt: Date, status: Status, cursor: String, delivered: Int64, waiting: Int64, waitingMore: Bool, eventTypes: [EventType]?, enabled: Bool) {
            self.id = id
            self.url = url
            self.createdAt = createdAt
            self.status = status
            self.cursor = cursor
            self.delivered = delivered
            self.waiting = waiting
            self.waitingMore = waitingMore
            self.eventTypes = eventTypes.map { .set($0) } ?? .clear
            self.enabled = enabled
        }
        public static var wireFields: [String: String] {
            ["secret": "Only in the answer to its creation and to a rotation: the signing secret (docs/events.md).",
             "status": "stopped: the API key that made it was revoked, and nothing is sent to it; disabled: by the API, the console, or after failing too long (isle serve --webhook-disable-after).",
             "keyID": "The API key that made it (absent: made in the console); revoking that key stops the webhook.", "stoppedBecause": "Why a stopped webhook is stopped.",
             "cursor": "The last event the endpoint acknowledged.", "waiting": "Events waiting (at most 1000; waitingMore when there are more).",
             "eventTypes": "The types it receives; null: every type.", "previousSecretValidUntil": "While a rotation's overlap lasts: until when the old secret signs too."]
        }
    }

    public struct WebhookFailure: Codable, Sendable, WireDocumented, WireSparse {
        public var since: Date
        public var attempts: Int64
        public var status: Int64?
        public var error: String?
        public var nextAttemptAt: Date?
        public init(since: Date, attempts: Int64) {
            self.since = since
            self.attempts = attempts
        }
        public static var wireFields: [String: String] { ["status": "The endpoint's last answer; 0 when it could not be reached."] }
    }

    public struct WebhookList: Codable, Sendable {
        public var webhooks: [Webhook]
        public init(webhooks: [Webhook]) { self.webhooks = webhooks }
    }

    public struct WebhookDeletion: Codable, Sendable {
        public var id: String
        public var deleted: Bool
        public init(id: String) {
            self.id = id
            deleted = true
        }
    }

    public struct WebhookAttempt: Codable, Sendable, WireSparse {
        public enum Kind: String, WireEnum { case delivery, redelivery }
        public var at: Date
        public var kind: Kind
        public var status: Int64
        public var latencyMS: Double
        public var events: Int64
        public var firstEventID: String?
        public var lastEventID: String?
        public var error: String?
        public init(at: Date, kind: Kind, status: Int64, latencyMS: Double, events: Int64) {
            self.at = at
            self.kind = kind
            self.status = status
            self.latencyMS = latencyMS
            self.events = events
        }
    }

    public struct WebhookAttemptList: Codable, Sendable {
        public var attempts: [WebhookAttempt]
        public init(attempts: [WebhookAttempt]) { self.attempts = attempts }
    }

    public struct WebhookRedeliveryResult: Codable, Sendable, WireSparse {
        public var eventID: String
        public var status: Int64
        public var latencyMS: Double
        public var delivered: Bool
        public var error: String?
        public init(eventID: String, status: Int64, latencyMS: Double, delivered: Bool, error: String?) {
            self.eventID = eventID
            self.status = status
            self.latencyMS = latencyMS
            self.delivered = delivered
            self.error = error
        }
    }

    // MARK: Jobs

    public struct Job: Codable, Sendable, WireSparse {
        public enum State: String, WireEnum { case scheduled, due, waiting, waitingForRetry, inFlight }
        public var id: Int64
        public var kind: String
        public var state: State
        public var dueAt: Date
        public var attempts: Int64
        public var createdAt: Date
        public var activityID: String?
        public var channelID: String?
        public var installationID: String?
        public var lastError: String?
        public init(id: Int64, kind: String, state: State, dueAt: Date, attempts: Int64, createdAt: Date) {
            self.id = id
            self.kind = kind
            self.state = state
            self.dueAt = dueAt
            self.attempts = attempts
            self.createdAt = createdAt
        }
    }

    public struct JobList: Codable, Sendable {
        public var jobs: [Job]
        public init(jobs: [Job]) { self.jobs = jobs }
    }

    public struct JobCancellation: Codable, Sendable {
        public var id: Int64
        public var state: String
        public var cancelled: Bool
        public init(id: Int64) {
            self.id = id
            state = "dropped"
            cancelled = true
        }
    }

    public struct JobRetry: Codable, Sendable {
        public var id: Int64
        public var retried: Bool
        public init(id: Int64) {
            self.id = id
            retried = true
        }
    }

    // MARK: Errors

    /// Every refusal: `error.code` is stable and machine-readable (invalidField, notFound,
    /// rateLimited, …); `message` says what was expected; `field` names the request field, query
    /// parameter or header at fault, when one is.
    public struct ErrorEnvelope: Codable, Sendable, WireDocumented {
        public var error: ErrorBody
        public init(error: ErrorBody) { self.error = error }
        public static var wireDescription: String? {
            "Every refusal: error.code is stable and machine-readable (invalidField, notFound, rateLimited, …); message says what was expected; field names the request field, query parameter or header at fault, when one is."
        }
    }

    public struct ErrorBody: Codable, Sendable, WireDocumented, WireSparse {
        public var code: String
        public var message: String
        public var field: String?
        public var findings: [Finding]?
        public init(code: String, message: String, field: String? = nil, findings: [Finding]? = nil) {
            self.code = code
            self.message = message
            self.field = field
            self.findings = findings
        }
        public static var wireFields: [String: String] { ["findings": "Each finding, when a strict request (Isle-Strict: true) was refused for the validator's warnings (validationWarnings)."] }
    }
}
