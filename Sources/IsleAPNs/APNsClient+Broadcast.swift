import Foundation
public import IsleCore

/// A channel's message storage policy, fixed at creation (docs/protocol.md §7.2).
public enum MessageStoragePolicy: Int, Sendable, Hashable, Codable, CaseIterable {
    /// No message stored: higher publishing budget; broadcasts must use `apns-expiration: 0`.
    case noMessageStored = 0
    /// The most recent message is stored for up to 8 hours.
    case mostRecentMessageStored = 1
}

/// A broadcast channel as APNs describes it.
public struct BroadcastChannel: Sendable, Hashable {
    public var id: String
    public var storagePolicy: MessageStoragePolicy
    public init(id: String, storagePolicy: MessageStoragePolicy) {
        self.id = id
        self.storagePolicy = storagePolicy
    }
}

/// A push to every Live Activity subscribed to a channel (iOS 18+).
public struct BroadcastPush: Sendable {
    public var bundleID: String
    public var channelID: String
    public var payload: [UInt8]
    public var priority: PushPriority
    /// Required by APNs. Must be `.immediately` on a No-Message-Stored channel.
    public var expiration: APNsExpiration
    /// The channel's policy, when known, so Isle can check the expiration rule before sending.
    public var storagePolicy: MessageStoragePolicy?
    public var requestID: APNsID?
    public var schema: ActivitySchema?

    public init(bundleID: String, channelID: String, payload: LiveActivityPayload, priority: PushPriority = .low, expiration: APNsExpiration? = nil, storagePolicy: MessageStoragePolicy? = nil, requestID: APNsID? = nil, schema: ActivitySchema? = nil) {
        self.init(bundleID: bundleID, channelID: channelID, payload: payload.encoded, priority: priority, expiration: expiration, storagePolicy: storagePolicy, requestID: requestID, schema: schema)
    }

    /// `expiration` defaults to `.immediately` (valid for both policies).
    public init(bundleID: String, channelID: String, payload: [UInt8], priority: PushPriority = .low, expiration: APNsExpiration? = nil, storagePolicy: MessageStoragePolicy? = nil, requestID: APNsID? = nil, schema: ActivitySchema? = nil) {
        self.bundleID = bundleID
        self.channelID = channelID
        self.payload = payload
        self.priority = priority
        self.expiration = expiration ?? .immediately
        self.storagePolicy = storagePolicy
        self.requestID = requestID
        self.schema = schema
    }
}

extension APNsClient {
    static func checkChannelID(_ id: String) throws(APNsError) {
        if id.isEmpty { throw .invalid("the channel id is empty (MissingChannelId)") }
        let base64 = id.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "+" || $0 == "/" || $0 == "=") }
        if !base64 || Data(base64Encoded: id) == nil {
            throw .invalid("the channel id \"\(id)\" is not base64 (BadChannelId)")
        }
    }

    func managementURL(_ bundleID: String, _ path: String) -> String {
        "\(configuration.endpoints.channelManagement)/1/apps/\(bundleID)/\(path)"
    }

    func check(_ push: BroadcastPush) throws(APNsError) {
        try Self.checkBundleID(push.bundleID)
        try Self.checkChannelID(push.channelID)
        if push.storagePolicy == .noMessageStored, push.expiration != .immediately {
            throw .invalid("a No-Message-Stored channel needs apns-expiration 0; APNs rejects any other value (BadExpirationDate)")
        }
        if configuration.validatesPayloads {
            let report = PayloadValidator(options: .init(pushType: .liveactivity, broadcast: true, priority: push.priority, schema: push.schema, now: clock.now)).validate(bytes: push.payload)
            if let first = report.errors.first {
                throw .invalid("refusing to send an invalid broadcast payload: \(first.path): \(first.message) \(first.fix)", validation: report)
            }
        }
    }

    /// The request ``broadcast(_:)`` would make.
    public func request(for push: BroadcastPush) throws(APNsError) -> APNsTransportRequest {
        try check(push)
        return makeRequest(push, authorization: tokens.currentToken().authorization)
    }

    func makeRequest(_ push: BroadcastPush, authorization: String) -> APNsTransportRequest {
        var headers: [(name: String, value: String)] = [
            ("authorization", authorization),
            ("apns-channel-id", push.channelID),
            ("apns-push-type", PushType.liveactivity.rawValue),
            ("apns-priority", String(push.priority.rawValue)),
            ("apns-expiration", push.expiration.headerValue),
        ]
        if let requestID = push.requestID { headers.append(("apns-request-id", requestID.text)) }
        headers.append(("content-type", "application/json"))
        return APNsTransportRequest(method: "POST", url: "\(configuration.endpoints.broadcast)/4/broadcasts/apps/\(push.bundleID)", headers: headers, body: push.payload)
    }

    /// Sends a broadcast to a channel.
    @discardableResult
    public func broadcast(_ push: BroadcastPush) async throws(APNsError) -> APNsResponse {
        try check(push)
        var push = push
        if push.requestID == nil { push.requestID = .random() }
        let p = push
        return try await perform(kind: "broadcast") { authorization in self.makeRequest(p, authorization: authorization) }
    }

    /// Creates a channel; APNs answers 201 with its id in `apns-channel-id`.
    public func createChannel(bundleID: String, storagePolicy: MessageStoragePolicy, requestID: APNsID = .random()) async throws(APNsError) -> BroadcastChannel {
        try Self.checkBundleID(bundleID)
        let body: JSONValue = ["message-storage-policy": .int(storagePolicy.rawValue), "push-type": "LiveActivity"]
        let response = try await perform(kind: "channel creation") { authorization in
            APNsTransportRequest(method: "POST", url: self.managementURL(bundleID, "channels"), headers: [
                ("authorization", authorization), ("apns-request-id", requestID.text), ("content-type", "application/json"),
            ], body: body.jsonBytes)
        }
        guard let id = response.channelID, !id.isEmpty else {
            throw APNsError(code: .rejected, message: "APNs created a channel but sent no apns-channel-id header", response: response, validation: nil, transport: nil)
        }
        return BroadcastChannel(id: id, storagePolicy: storagePolicy)
    }

    /// Reads a channel's configuration.
    public func readChannel(bundleID: String, channelID: String, requestID: APNsID = .random()) async throws(APNsError) -> BroadcastChannel {
        try Self.checkBundleID(bundleID)
        try Self.checkChannelID(channelID)
        let (response, body) = try await performReturningBody(kind: "channel read") { authorization in
            APNsTransportRequest(method: "GET", url: self.managementURL(bundleID, "channels"), headers: [
                ("authorization", authorization), ("apns-channel-id", channelID), ("apns-request-id", requestID.text),
            ], body: [])
        }
        guard let raw = body?["message-storage-policy"]?.numberValue?.int64Value, let policy = MessageStoragePolicy(rawValue: Int(raw)) else {
            throw APNsError(code: .rejected, message: "APNs answered the channel read without a valid message-storage-policy", response: response, validation: nil, transport: nil)
        }
        return BroadcastChannel(id: channelID, storagePolicy: policy)
    }

    /// Deletes a channel (irreversible; stored messages may still be delivered).
    public func deleteChannel(bundleID: String, channelID: String, requestID: APNsID = .random()) async throws(APNsError) {
        try Self.checkBundleID(bundleID)
        try Self.checkChannelID(channelID)
        _ = try await perform(kind: "channel deletion") { authorization in
            APNsTransportRequest(method: "DELETE", url: self.managementURL(bundleID, "channels"), headers: [
                ("authorization", authorization), ("apns-channel-id", channelID), ("apns-request-id", requestID.text),
            ], body: [])
        }
    }

    /// Lists the ids of all channels of an app in this environment.
    public func listChannels(bundleID: String, requestID: APNsID = .random()) async throws(APNsError) -> [String] {
        try Self.checkBundleID(bundleID)
        let (response, body) = try await performReturningBody(kind: "channel list") { authorization in
            APNsTransportRequest(method: "GET", url: self.managementURL(bundleID, "all-channels"), headers: [
                ("authorization", authorization), ("apns-request-id", requestID.text),
            ], body: [])
        }
        // Apple's page also says the body may be empty: treat that as no channels.
        guard let body else { return [] }
        guard let ids = body["channels"]?.arrayValue else {
            throw APNsError(code: .rejected, message: "APNs answered the channel list without a channels array", response: response, validation: nil, transport: nil)
        }
        return ids.compactMap(\.stringValue)
    }

    /// Like ``perform(kind:_:)`` but also returns the parsed JSON body of a success.
    func performReturningBody(kind: String, _ build: (String) -> APNsTransportRequest) async throws(APNsError) -> (APNsResponse, JSONValue?) {
        let response = try await perform(kind: kind, build)
        return (response, response.body.isEmpty ? nil : try? JSONParser.parse(response.body))
    }
}
