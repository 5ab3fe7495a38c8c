public import Foundation
public import IsleCore
public import Logging

/// `apns-expiration`: when APNs stops trying to deliver (docs/protocol.md §2).
public enum APNsExpiration: Sendable, Hashable {
    /// `0`: attempt once, do not store.
    case immediately
    /// Store and retry until this date (sent as Unix seconds).
    case at(Date)

    var headerValue: String {
        switch self {
        case .immediately: "0"
        case .at(let date): String(Int64(date.timeIntervalSince1970.rounded(.down)))
        }
    }
}

/// A push to one device or activity token.
public struct APNsPush: Sendable {
    public var deviceToken: DeviceToken
    /// The bare bundle id; Isle appends the push type's topic suffix.
    public var bundleID: String
    public var pushType: PushType
    /// The exact payload bytes.
    public var payload: [UInt8]
    public var priority: PushPriority
    public var expiration: APNsExpiration?
    public var collapseID: String?
    /// Sent as `apns-id`; a random one is generated when nil.
    public var apnsID: APNsID?
    /// The registered schema for a Live Activity's attributes type, to validate against.
    public var schema: ActivitySchema?

    public init(deviceToken: DeviceToken, bundleID: String, pushType: PushType, payload: [UInt8], priority: PushPriority, expiration: APNsExpiration? = nil, collapseID: String? = nil, apnsID: APNsID? = nil, schema: ActivitySchema? = nil) {
        self.deviceToken = deviceToken
        self.bundleID = bundleID
        self.pushType = pushType
        self.payload = payload
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID
        self.schema = schema
    }

    /// A `liveactivity` push. Priority defaults to 5, which does not spend the activity's budget.
    public static func liveActivity(_ payload: LiveActivityPayload, token: DeviceToken, bundleID: String, priority: PushPriority = .low, expiration: APNsExpiration? = nil, apnsID: APNsID? = nil, schema: ActivitySchema? = nil) -> APNsPush {
        APNsPush(deviceToken: token, bundleID: bundleID, pushType: .liveactivity, payload: payload.encoded, priority: priority, expiration: expiration, apnsID: apnsID, schema: schema)
    }

    /// A `controls` push that makes the app's Control Center controls reload (iOS 18; WidgetKit's
    /// `ControlPushHandler`): `{"aps": {"content-changed": true}}` to the control push token.
    public static func controlsReload(token: DeviceToken, bundleID: String, priority: PushPriority = .high, expiration: APNsExpiration? = nil, apnsID: APNsID? = nil) -> APNsPush {
        APNsPush(deviceToken: token, bundleID: bundleID, pushType: .controls, payload: WidgetPayload().encoded, priority: priority, expiration: expiration, apnsID: apnsID)
    }

    /// A `widgets` push that makes WidgetKit reload the app's timelines.
    public static func widgetsReload(token: DeviceToken, bundleID: String, priority: PushPriority = .high, expiration: APNsExpiration? = nil, apnsID: APNsID? = nil) -> APNsPush {
        APNsPush(deviceToken: token, bundleID: bundleID, pushType: .widgets, payload: WidgetPayload().encoded, priority: priority, expiration: expiration, apnsID: apnsID)
    }

    public var topic: String { pushType.topic(bundleID: bundleID) }
}

/// APNs' answer to a request.
public struct APNsResponse: Sendable, Hashable {
    public var status: Int
    /// `apns-id` (device pushes).
    public var apnsID: APNsID?
    /// `apns-unique-id`: sandbox device pushes and broadcasts.
    public var apnsUniqueID: String?
    /// `apns-request-id` (broadcast and channel requests).
    public var requestID: APNsID?
    /// `apns-channel-id` (channel creation).
    public var channelID: String?
    public var reason: APNsReason?
    /// For 410: when APNs learned the token was no longer valid (sent in milliseconds).
    public var invalidSince: Date?
    /// How long the request took.
    public var latency: Duration
    /// `retry-after` (seconds), when the server asks the sender to wait before trying again.
    public var retryAfter: TimeInterval?
    /// The raw response body (empty on success for device pushes).
    public var body: [UInt8] = []
    /// What the device did with an accepted push, when the server is Isle's simulator (its
    /// `isle-sim-outcome` header, e.g. "throttled: the app's priority-10 budget is spent…"); Apple's
    /// APNs never says. At most 300 characters.
    public var deviceNote: String?

    public var isSuccess: Bool { (200..<300).contains(status) }
    public var remedy: APNsRemedy? { isSuccess ? nil : (reason ?? APNsReason(rawValue: "")).remedy(status: status) }

    /// "200 OK", or "410 Unregistered: The device token is no longer active … Stop sending …".
    public var summary: String {
        if isSuccess { return "\(status) OK" }
        guard let reason else { return "\(status) (no reason given). \(APNsReason.advice(APNsReason.remedy(forStatus: status)))" }
        return "\(status) \(reason.rawValue): \(reason.explanation(status: status))"
    }
}

/// Everything that can go wrong sending to APNs. The description never contains a device
/// token, JWT or key.
public struct APNsError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        /// APNs answered with an error status; see ``response``.
        case rejected
        /// Isle refused to send: the request would be rejected or silently dropped.
        case invalidRequest
        /// The transport failed (connect, TLS, timeout, connection lost).
        case transport
    }

    public let code: Code
    public let message: String
    public let response: APNsResponse?
    public let validation: ValidationReport?
    public let transport: APNsTransportError?

    public var description: String { message }

    /// What the caller should do.
    public var remedy: APNsRemedy {
        switch code {
        case .rejected: response?.remedy ?? .retryLater
        case .invalidRequest: .fixRequest
        case .transport: transport?.kind == .tlsFailed ? .fixConfiguration : .retryLater
        }
    }

    static func invalid(_ message: String, validation: ValidationReport? = nil) -> APNsError {
        APNsError(code: .invalidRequest, message: message, response: nil, validation: validation, transport: nil)
    }
}

/// Talks to APNs with a shared provider token over HTTP/2.
///
/// One client per set of credentials and environment; share it. Use
/// ``withClient(configuration:clock:logger:_:)`` or call ``shutdown()`` when done.
public final class APNsClient: Sendable {
    public struct Configuration: Sendable {
        public var environment: APNsEnvironment
        public var credentials: APNsCredentials
        /// Overrides the environment's hosts (e.g. a different broadcast host).
        public var endpoints: APNsEndpoints
        /// Per-request deadline.
        public var requestTimeout: Duration
        public var connectTimeout: Duration
        /// Check every payload with ``PayloadValidator`` and refuse to send one with errors.
        public var validatesPayloads: Bool
        /// Which HTTP/2 client carries the requests.
        public var transport: APNsTransportKind

        public init(environment: APNsEnvironment, credentials: APNsCredentials, endpoints: APNsEndpoints? = nil, requestTimeout: Duration = .seconds(30), connectTimeout: Duration = .seconds(10), validatesPayloads: Bool = true, transport: APNsTransportKind = .default) {
            self.environment = environment
            self.credentials = credentials
            self.endpoints = endpoints ?? environment.endpoints
            self.requestTimeout = requestTimeout
            self.connectTimeout = connectTimeout
            self.validatesPayloads = validatesPayloads
            self.transport = transport
        }
    }

    public let configuration: Configuration
    public let tokens: ProviderTokenProvider
    let transport: any APNsTransport
    let clock: any WallClock
    let logger: Logger

    public init(configuration: Configuration, transport: any APNsTransport, clock: any WallClock = SystemWallClock(), logger: Logger) {
        self.configuration = configuration
        self.transport = transport
        self.clock = clock
        self.logger = logger
        tokens = ProviderTokenProvider(credentials: configuration.credentials, clock: clock)
    }

    /// A client on the configured transport, trusting the custom environment's roots when given.
    public convenience init(configuration: Configuration, clock: any WallClock = SystemWallClock(), logger: Logger) throws(APNsTransportError) {
        let transport: any APNsTransport
        switch configuration.transport {
        case .http2:
            transport = try NIOHTTP2Transport(configuration: .init(trustRootsPEM: configuration.environment.trustRootsPEM, connectTimeout: configuration.connectTimeout), logger: logger)
        case .asyncHTTPClient:
            transport = try AsyncHTTPClientTransport(trustRootsPEM: configuration.environment.trustRootsPEM, connectTimeout: configuration.connectTimeout)
        }
        self.init(configuration: configuration, transport: transport, clock: clock, logger: logger)
    }

    /// Runs `body` with a client and always shuts it down.
    public static func withClient<R: Sendable>(configuration: Configuration, clock: any WallClock = SystemWallClock(), logger: Logger, _ body: (APNsClient) async throws -> R) async throws -> R {
        let client = try APNsClient(configuration: configuration, clock: clock, logger: logger)
        do {
            let result = try await body(client)
            try await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    public func shutdown() async throws { try await transport.shutdown() }

    // MARK: Device pushes

    /// The request that ``send(_:)`` would make, after the same checks. Its `authorization`
    /// header carries a real JWT.
    public func request(for push: APNsPush) throws(APNsError) -> APNsTransportRequest {
        try check(push)
        let token = tokens.currentToken()
        return makeRequest(push, authorization: token.authorization)
    }

    func makeRequest(_ push: APNsPush, authorization: String) -> APNsTransportRequest {
        var headers: [(name: String, value: String)] = [
            ("authorization", authorization),
            ("apns-push-type", push.pushType.rawValue),
            ("apns-topic", push.topic),
            ("apns-priority", String(push.priority.rawValue)),
        ]
        if let expiration = push.expiration { headers.append(("apns-expiration", expiration.headerValue)) }
        if let collapseID = push.collapseID { headers.append(("apns-collapse-id", collapseID)) }
        headers.append(("apns-id", (push.apnsID ?? .random()).text))
        headers.append(("content-type", "application/json"))
        return APNsTransportRequest(method: "POST", url: "\(configuration.endpoints.device)/3/device/\(push.deviceToken.hex)", headers: headers, body: push.payload)
    }

    /// Validates what APNs and the device would reject, before anything is sent.
    func check(_ push: APNsPush) throws(APNsError) {
        try Self.checkBundleID(push.bundleID)
        if let collapseID = push.collapseID, collapseID.utf8.count > 64 {
            throw .invalid("apns-collapse-id is \(collapseID.utf8.count) bytes; APNs allows at most 64 (BadCollapseId)")
        }
        if push.pushType == .background, push.priority == .high {
            throw .invalid("background pushes must use priority 5; APNs rejects priority 10 (BadPriority)")
        }
        if push.pushType == .liveactivity, push.priority == .powerConsiderate {
            throw .invalid("liveactivity pushes use priority 5 or 10, not 1")
        }
        if configuration.validatesPayloads {
            let validator = PayloadValidator(options: .init(pushType: push.pushType, priority: push.priority, schema: push.schema, now: clock.now))
            let report = validator.validate(bytes: push.payload)
            if let first = report.errors.first {
                let more = report.errors.count > 1 ? " (and \(report.errors.count - 1) more)" : ""
                throw .invalid("refusing to send an invalid \(push.pushType.rawValue) payload: \(first.path): \(first.message) \(first.fix)\(more)", validation: report)
            }
        }
    }

    static func checkBundleID(_ bundleID: String) throws(APNsError) {
        if bundleID.isEmpty { throw .invalid("the bundle id is empty") }
        if bundleID.contains(".push-type.") || bundleID.hasSuffix(".voip") || bundleID.hasSuffix(".complication") {
            throw .invalid("give the bare bundle id (\"\(bundleID)\" has a topic suffix); Isle adds the suffix for the push type")
        }
        if bundleID.contains(where: { $0.isWhitespace || $0 == "/" }) {
            throw .invalid("the bundle id \"\(bundleID)\" contains whitespace or '/'")
        }
    }

    /// Sends a push. Returns the response on 2xx; throws ``APNsError`` with the response on an
    /// APNs error. A 403 `ExpiredProviderToken` is retried once with a fresh token when the
    /// 20-minute rule allows.
    @discardableResult
    public func send(_ push: APNsPush) async throws(APNsError) -> APNsResponse {
        try check(push)
        var push = push
        if push.apnsID == nil { push.apnsID = .random() }
        let pushToSend = push
        return try await perform(kind: "device push") { authorization in self.makeRequest(pushToSend, authorization: authorization) }
    }

    /// Executes a request built with the current `authorization` header; on `ExpiredProviderToken`, retries once
    /// with a new JWT if one may be minted.
    func perform(kind: String, _ build: (String) -> APNsTransportRequest) async throws(APNsError) -> APNsResponse {
        var token = tokens.currentToken()
        var retried = false
        while true {
            let response = try await execute(build(token.authorization), kind: kind)
            if response.isSuccess { return response }
            if response.reason == .expiredProviderToken, !retried, tokens.reportExpired(token) {
                retried = true
                token = tokens.currentToken()
                logger.info("APNs rejected the provider token as expired; retrying with a new one", metadata: ["apns.kid": "\(token.keyID)"])
                continue
            }
            throw APNsError(code: .rejected, message: "APNs rejected the \(kind): \(response.summary)", response: response, validation: nil, transport: nil)
        }
    }

    func execute(_ request: APNsTransportRequest, kind: String) async throws(APNsError) -> APNsResponse {
        let start = ContinuousClock.now
        let raw: APNsTransportResponse
        do {
            raw = try await transport.execute(request, timeout: configuration.requestTimeout)
        } catch {
            logger.debug("APNs request failed", metadata: ["apns.kind": "\(kind)", "error": "\(error)"])
            let advice = error.kind == .tlsFailed ? " " + TLSFailure.advice(for: configuration.environment) : ""
            throw APNsError(code: .transport, message: "could not reach APNs for the \(kind): \(error.reason).\(advice)", response: nil, validation: nil, transport: error)
        }
        let response = Self.parse(raw, latency: ContinuousClock.now - start)
        logger.debug("APNs answered", metadata: [
            "apns.kind": "\(kind)", "apns.status": "\(response.status)", "apns.id": "\(response.apnsID?.text ?? "-")",
            "apns.reason": "\(response.reason?.rawValue ?? "-")",
        ])
        return response
    }

    /// Parses status, ids, and the JSON error body (`reason`, and for 410 `timestamp` in ms).
    public static func parse(_ raw: APNsTransportResponse, latency: Duration = .zero) -> APNsResponse {
        var response = APNsResponse(
            status: raw.status,
            apnsID: raw.value("apns-id").flatMap { APNsID($0) },
            apnsUniqueID: raw.value("apns-unique-id"),
            requestID: raw.value("apns-request-id").flatMap { APNsID($0) },
            channelID: raw.value("apns-channel-id"),
            reason: nil, invalidSince: nil, latency: latency, body: raw.body
        )
        if !response.isSuccess, !raw.body.isEmpty, let body = try? JSONParser.parse(raw.body) {
            if let reason = body["reason"]?.stringValue { response.reason = APNsReason(rawValue: reason) }
            if let ms = body["timestamp"]?.numberValue?.doubleValue { response.invalidSince = Date(timeIntervalSince1970: ms / 1000) }
        }
        if let s = raw.value("retry-after").flatMap(Double.init), s.isFinite, s >= 0 { response.retryAfter = min(s, 86_400) }
        if let note = raw.value("isle-sim-outcome"), !note.isEmpty { response.deviceNote = String(note.prefix(300)) }
        return response
    }
}
