/// What a sender must do after APNs answers with an error.
public enum APNsRemedy: String, Sendable, Codable, CaseIterable {
    /// Transient: retry later with backoff (5xx, `TooManyRequests`, `IdleTimeout`).
    case retryLater
    /// The provider token is stale or rejected: mint a new JWT (respecting the 20-minute rule).
    case newProviderToken
    /// The device token is dead or wrong: stop using it; never retry with it.
    case dropToken
    /// The request itself is wrong (header, path, payload): fix it; retrying unchanged fails again.
    case fixRequest
    /// This connection is bound to another key/team or misbehaving: open a new connection.
    case openNewConnection
    /// The account or app is not set up for this (capability, key permissions): fix the configuration.
    case fixConfiguration
}

/// An APNs error reason string (docs/protocol.md §3.4 and §7.4), with what it means and what to do.
///
/// Reasons APNs adds later are kept verbatim (``isKnown`` is false) and classified by status.
public struct APNsReason: Sendable, Hashable, Codable, RawRepresentable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }

    public init(from decoder: any Decoder) throws { rawValue = try decoder.singleValueContainer().decode(String.self) }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }

    public var description: String { rawValue }

    /// Entry in the device or broadcast table, if this reason is one Apple documents.
    public var info: Info? { Self.table[rawValue] }
    public var isKnown: Bool { info != nil }

    public struct Info: Sendable, Hashable {
        /// The HTTP status APNs sends with this reason.
        public let status: Int
        public let meaning: String
        public let remedy: APNsRemedy
        /// Where the reason is documented: device pushes, broadcast/channel requests, or both.
        public let scope: Scope
        /// The reason is about the sender's set-up — its key, team, topic, certificate or
        /// capability — not about this push or its token: every push of the app would get it.
        public let concernsEveryPush: Bool
    }

    public enum Scope: String, Sendable, Hashable { case device, broadcast, both }

    /// Every push of the app would get this answer (``Info/concernsEveryPush``): a sender stops
    /// sending for the app until its set-up is fixed, rather than failing push after push.
    public var concernsEveryPush: Bool { info?.concernsEveryPush ?? false }

    /// What to do about this reason with this status. Unknown reasons are judged by status:
    /// 5xx and 429 retry later, 410 drops the token, 403 needs a new provider token, other 4xx need a fix.
    public func remedy(status: Int) -> APNsRemedy {
        if let info { return info.remedy }
        return Self.remedy(forStatus: status)
    }

    public static func remedy(forStatus status: Int) -> APNsRemedy {
        switch status {
        case 410: .dropToken
        case 429, 500...599: .retryLater
        case 403: .newProviderToken
        default: .fixRequest
        }
    }

    /// A sentence for people: what happened and what to do.
    public func explanation(status: Int) -> String {
        let meaning = info?.meaning ?? "APNs answered \(status) with a reason Isle does not know (\(rawValue))"
        return "\(meaning). \(Self.advice(remedy(status: status)))"
    }

    public static func advice(_ remedy: APNsRemedy) -> String {
        switch remedy {
        case .retryLater: "Retry later with exponential backoff."
        case .newProviderToken: "Generate a new provider token (JWT) and retry, no sooner than 20 minutes after the previous one."
        case .dropToken: "Stop sending to this token; wait for the app to send a new one."
        case .fixRequest: "Fix the request; sending it again unchanged will fail again."
        case .openNewConnection: "Open a new connection for this key or team."
        case .fixConfiguration: "Fix the app's or key's configuration in the Apple Developer account."
        }
    }

    // MARK: The vocabulary

    private static func r(_ s: String) -> APNsReason { APNsReason(rawValue: s) }

    // Device pushes (docs/protocol.md §3.4)
    public static let badCollapseId = r("BadCollapseId")
    public static let badDeviceToken = r("BadDeviceToken")
    public static let badExpirationDate = r("BadExpirationDate")
    public static let badMessageId = r("BadMessageId")
    public static let badPriority = r("BadPriority")
    public static let badTopic = r("BadTopic")
    public static let deviceTokenNotForTopic = r("DeviceTokenNotForTopic")
    public static let duplicateHeaders = r("DuplicateHeaders")
    public static let idleTimeout = r("IdleTimeout")
    public static let invalidPushType = r("InvalidPushType")
    public static let missingDeviceToken = r("MissingDeviceToken")
    public static let missingTopic = r("MissingTopic")
    public static let payloadEmpty = r("PayloadEmpty")
    public static let topicDisallowed = r("TopicDisallowed")
    public static let badCertificate = r("BadCertificate")
    public static let badCertificateEnvironment = r("BadCertificateEnvironment")
    public static let expiredProviderToken = r("ExpiredProviderToken")
    public static let forbidden = r("Forbidden")
    public static let invalidProviderToken = r("InvalidProviderToken")
    public static let missingProviderToken = r("MissingProviderToken")
    public static let unrelatedKeyIdInToken = r("UnrelatedKeyIdInToken")
    public static let badEnvironmentKeyIdInToken = r("BadEnvironmentKeyIdInToken")
    public static let badPath = r("BadPath")
    public static let methodNotAllowed = r("MethodNotAllowed")
    public static let expiredToken = r("ExpiredToken")
    public static let unregistered = r("Unregistered")
    public static let payloadTooLarge = r("PayloadTooLarge")
    public static let tooManyProviderTokenUpdates = r("TooManyProviderTokenUpdates")
    public static let tooManyRequests = r("TooManyRequests")
    public static let internalServerError = r("InternalServerError")
    public static let serviceUnavailable = r("ServiceUnavailable")
    public static let shutdown = r("Shutdown")

    // Broadcast and channel requests (docs/protocol.md §7.4)
    public static let featureNotEnabled = r("FeatureNotEnabled")
    public static let missingChannelId = r("MissingChannelId")
    public static let badChannelId = r("BadChannelId")
    public static let channelNotRegistered = r("ChannelNotRegistered")
    public static let badRequestParams = r("BadRequestParams")
    public static let badRequestPayload = r("BadRequestPayload")
    public static let missingPushType = r("MissingPushType")
    public static let cannotCreateChannelConfig = r("CannotCreateChannelConfig")
    public static let topicMismatch = r("TopicMismatch")
    /// Apple's broadcast error table spells it with a space (a doc typo); accept both.
    public static let serviceUnavailableWithSpace = r("Service Unavailable")

    /// Every documented reason with its status, meaning and remedy.
    public static let table: [String: Info] = {
        var t: [String: Info] = [:]
        // Besides the reasons whose remedy is fixing the configuration, these concern every push
        // of an app: its topic (Isle derives it from the bundle id) and its provider token. An
        // ExpiredProviderToken that reaches a sender's decision was already retried with a fresh
        // token where the 20-minute rule allows one (IsleAPNs' ProviderTokenProvider): a token this
        // server signed minutes ago, called older than an hour, means its clock is behind.
        let everyPush: Set<APNsReason> = [.badTopic, .topicDisallowed, .missingProviderToken, .unrelatedKeyIdInToken, .expiredProviderToken]
        func add(_ reason: APNsReason, _ status: Int, _ remedy: APNsRemedy, _ scope: Scope, _ meaning: String) {
            t[reason.rawValue] = Info(status: status, meaning: meaning, remedy: remedy, scope: scope,
                                      concernsEveryPush: remedy == .fixConfiguration || everyPush.contains(reason))
        }
        add(.badCollapseId, 400, .fixRequest, .device, "The apns-collapse-id header is longer than 64 bytes")
        add(.badDeviceToken, 400, .dropToken, .device, "The device token is invalid, or belongs to the other environment (sandbox vs production)")
        add(.badExpirationDate, 400, .fixRequest, .both, "The apns-expiration value is invalid (for a broadcast to a No-Message-Stored channel it must be 0)")
        add(.badMessageId, 400, .fixRequest, .both, "The apns-id or apns-request-id is not a canonical lowercase UUID")
        add(.badPriority, 400, .fixRequest, .both, "The apns-priority value is invalid for this push type")
        add(.badTopic, 400, .fixRequest, .device, "The apns-topic value is invalid")
        add(.deviceTokenNotForTopic, 400, .dropToken, .device, "The device token does not match the topic (for Live Activities the topic must end in .push-type.liveactivity)")
        add(.duplicateHeaders, 400, .fixRequest, .device, "A header was repeated")
        add(.idleTimeout, 400, .retryLater, .device, "The connection was idle too long")
        add(.invalidPushType, 400, .fixRequest, .both, "The apns-push-type value is invalid")
        add(.missingDeviceToken, 400, .fixRequest, .device, "The request path has no device token")
        add(.missingTopic, 400, .fixRequest, .device, "The apns-topic header is missing and is required")
        add(.payloadEmpty, 400, .fixRequest, .both, "The payload is empty")
        add(.topicDisallowed, 400, .fixRequest, .both, "Pushing to this topic is not allowed (a broadcast or channel path must use the bare bundle id)")
        add(.badCertificate, 403, .fixConfiguration, .both, "The client certificate is invalid")
        add(.badCertificateEnvironment, 403, .fixConfiguration, .both, "The client certificate is for the wrong environment")
        add(.expiredProviderToken, 403, .newProviderToken, .both, "The provider token is stale: its iat is more than one hour old")
        add(.forbidden, 403, .fixConfiguration, .device, "The action is not allowed")
        add(.invalidProviderToken, 403, .fixConfiguration, .both, "The provider token is invalid or its signature cannot be verified with the key id and team id")
        add(.missingProviderToken, 403, .fixRequest, .both, "No provider token was sent in the authorization header")
        add(.unrelatedKeyIdInToken, 403, .openNewConnection, .device, "The key id is unrelated to the key used on this connection's first push")
        add(.badEnvironmentKeyIdInToken, 403, .fixConfiguration, .device, "The key id does not match the environment")
        add(.badPath, 404, .fixRequest, .both, "The request path is invalid")
        add(.methodNotAllowed, 405, .fixRequest, .both, "The method is not allowed for this path")
        add(.expiredToken, 410, .dropToken, .device, "The device token has expired (seen when a Live Activity's token ends)")
        add(.unregistered, 410, .dropToken, .device, "The device token is no longer active for the topic")
        add(.payloadTooLarge, 413, .fixRequest, .both, "The payload is larger than APNs allows (4096 bytes, 5120 for broadcast and VoIP)")
        add(.tooManyProviderTokenUpdates, 429, .openNewConnection, .both, "The provider token was changed more than once in 20 minutes on this connection")
        add(.tooManyRequests, 429, .retryLater, .both, "Too many requests were sent to the same device token or channel")
        add(.internalServerError, 500, .retryLater, .both, "APNs had an internal error")
        add(.serviceUnavailable, 503, .retryLater, .both, "APNs is unavailable")
        add(.serviceUnavailableWithSpace, 503, .retryLater, .broadcast, "APNs is unavailable")
        add(.shutdown, 503, .retryLater, .both, "The APNs server is shutting down")
        add(.featureNotEnabled, 400, .fixConfiguration, .broadcast, "The Broadcast capability is not enabled for this app")
        add(.missingChannelId, 400, .fixRequest, .broadcast, "The apns-channel-id header is missing")
        add(.badChannelId, 400, .fixRequest, .broadcast, "The channel id is badly encoded or too long")
        add(.channelNotRegistered, 400, .fixRequest, .broadcast, "The channel does not exist in this environment")
        add(.badRequestParams, 400, .fixRequest, .broadcast, "The request body has an unrecognized attribute")
        add(.badRequestPayload, 400, .fixRequest, .broadcast, "The request body is not valid JSON")
        add(.missingPushType, 400, .fixRequest, .broadcast, "The push type is missing")
        add(.cannotCreateChannelConfig, 400, .fixConfiguration, .broadcast, "The app has reached its limit of 10,000 channels in this environment; delete finished channels")
        add(.topicMismatch, 403, .fixConfiguration, .broadcast, "The bundle ids the provider token allows do not include the bundle id in the path")
        return t
    }()

    public static var allKnown: [APNsReason] { table.keys.sorted().map(APNsReason.init(rawValue:)) }
}
