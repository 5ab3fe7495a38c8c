public import Foundation
public import IsleCore

/// What the fake APNs answers for a device push, and what the device did with it.
public struct DeliveryResult: Sendable, Hashable {
    public var status: Int
    public var reason: String?
    /// 410: when the token stopped being valid.
    public var invalidSince: Date?
    public var outcome: PushOutcome?
    public var deviceID: String?
}

extension SimulatorWorld {
    /// Routes a push that passed the fake APNs' request checks to the token's device.
    /// Token checks answer like APNs (isle-decisions.md, Simulated device · Tokens).
    public func deliver(token: String, pushType: String, topic: String, priority: Int, payload: JSONValue, apnsID: String) async -> DeliveryResult {
        defer { changes.notify() }
        let now = clock.now
        let (result, widgetWork) = state.withLock { s -> (DeliveryResult, (String, String)?) in
            guard let owner = s.tokens[token] else {
                return (DeliveryResult(status: 400, reason: "BadDeviceToken", outcome: nil), nil)
            }
            guard owner.environment == environment else {
                return (DeliveryResult(status: 400, reason: "BadDeviceToken", outcome: nil), nil)
            }
            let expectedTopic: String
            switch owner.kind {
            case .widgets: expectedTopic = owner.bundleID + ".push-type.widgets"
            default: expectedTopic = owner.bundleID + ".push-type.liveactivity"
            }
            guard topic == expectedTopic, (pushType == "widgets") == (owner.kind == .widgets) else {
                return (DeliveryResult(status: 400, reason: "DeviceTokenNotForTopic", outcome: nil), nil)
            }
            do { try advanceLocked(&s, deviceID: owner.deviceID, to: now) } catch { return (DeliveryResult(status: 400, reason: "BadDeviceToken"), nil) }
            switch owner.kind {
            case .widgets:
                return (DeliveryResult(status: 200, deviceID: owner.deviceID), (owner.deviceID, owner.bundleID))
            case .activity(let id):
                guard let i = s.devices[owner.deviceID]!.activities.firstIndex(where: { $0.id == id }) else {
                    // A rotated-away token: no longer valid for the topic.
                    return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: now), nil)
                }
                var a = s.devices[owner.deviceID]!.activities[i]
                if a.state == .dismissed {
                    return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: a.dismissedAt), nil)
                }
                let app = s.devices[owner.deviceID]!.apps[owner.bundleID]!
                // Moved out and back, not copied: the log grows in place.
                var events = s.devices[owner.deviceID]!.events
                s.devices[owner.deviceID]!.events = []
                let outcome = engine.receive(payload, priority: priority, apnsID: apnsID, activity: &a, app: app, now: now, events: &events)
                s.devices[owner.deviceID]!.activities[i] = a
                s.devices[owner.deviceID]!.events = events
                return (DeliveryResult(status: 200, outcome: outcome, deviceID: owner.deviceID), nil)
            case .pushToStart(let type):
                let outcome = startFromPush(&s, owner: owner, tokenType: type, payload: payload, apnsID: apnsID, now: now)
                return (DeliveryResult(status: 200, outcome: outcome, deviceID: owner.deviceID), nil)
            }
        }
        if let (deviceID, bundleID) = widgetWork {
            let outcome = await reloadWidgets(deviceID: deviceID, bundleID: bundleID, kinds: nil, reason: .push, apnsID: apnsID)
            var r = result
            r.outcome = outcome
            return r
        }
        return result
    }

    /// A push-to-start (apple-push.md §6; isle-decisions.md, Push-to-start).
    func startFromPush(_ s: inout State, owner: TokenOwner, tokenType: String, payload: JSONValue, apnsID: String, now: Date) -> PushOutcome {
        let deviceID = owner.deviceID
        func log(_ o: PushOutcome, _ activityID: String? = nil) -> PushOutcome {
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .push, activityID: activityID, apnsID: apnsID, outcome: o, message: o.sentence))
            return o
        }
        guard let aps = payload["aps"]?.objectValue, aps["event"]?.stringValue == "start" else {
            return log(PushOutcome(.notDelivered, "Ignored: a push-to-start token takes start events only."))
        }
        guard aps["alert"]?.objectValue != nil else {
            return log(PushOutcome(.startWithoutAlert, "Dropped: a start push without an alert starts nothing (APNs still answered 200)."))
        }
        let app = s.devices[deviceID]!.apps[owner.bundleID]!
        let type = aps["attributes-type"]?.stringValue ?? ""
        guard type == tokenType else {
            return log(PushOutcome(.unknownAttributesType, "Dropped: attributes-type \"\(type)\" does not match this token's type \"\(tokenType)\" (exact Swift name, case-sensitive).",
                                   field: "attributes-type", expected: tokenType, found: type))
        }
        if let problem = engine.checkTimestamp(aps, last: nil) { return log(problem) }
        let attributes = aps["attributes"] ?? .null
        let contentState = aps["content-state"] ?? .null
        if case .failure(let o) = checkStart(s, deviceID: deviceID, app: app, attributesType: type, attributes: attributes, contentState: contentState) { return log(o) }
        var channel: String?
        if let c = aps["input-push-channel"]?.stringValue {
            guard s.channels[owner.bundleID]?[c] != nil else {
                return log(PushOutcome(.channelNotFound, "Not started: input-push-channel \(c) is not a channel of \(owner.bundleID) in this environment."))
            }
            channel = c
        }
        var a = newActivity(&s, deviceID: deviceID, app: app, attributesType: type, attributes: attributes, contentState: contentState, now: now, by: .push)
        a.channelID = channel
        a.lastTimestamp = aps["timestamp"]?.numberValue?.exactInt64Value.map { Date(timeIntervalSince1970: Double($0)) }
        a.relevanceScore = aps["relevance-score"]?.numberValue?.doubleValue ?? 0
        a.staleDate = aps["stale-date"]?.numberValue?.exactInt64Value.map { Date(timeIntervalSince1970: Double($0)) }
        a.lastAlert = Localizer.resolve(aps["alert"]!.objectValue!, table: app.localization, at: now)
        if channel == nil {
            if configuration.withholdUpdateTokenUntilAllowed {
                a.withheldToken = Self.newToken(bytes: 80)
            } else {
                issueUpdateToken(&s, &a, deviceID: deviceID, environment: app.environment)
            }
        }
        s.devices[deviceID]!.activities.append(a)
        let tokenNote = a.updateToken != nil ? "; the app received its update token" : a.withheldToken != nil ? "; its update token waits until the person allows" : ""
        return log(PushOutcome(.started, "Started a \(type) activity\(channel.map { " subscribed to channel \($0)" } ?? "")\(tokenNote)."), a.id)
    }

    // MARK: Channels

    public enum ChannelResult: Sendable, Hashable {
        case created(String), found(Int), deleted, list([String]), failure(Int, String)
    }

    public func createChannel(bundleID: String, storagePolicy: Int, limit: Int = 10_000) -> ChannelResult {
        state.withLock { s in
            if s.channelsDisabled.contains(bundleID) { return .failure(400, "FeatureNotEnabled") }
            if (s.channels[bundleID]?.count ?? 0) >= limit { return .failure(400, "CannotCreateChannelConfig") }
            let id = Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
            s.channels[bundleID, default: [:]][id] = storagePolicy
            return .created(id)
        }
    }

    public func readChannel(bundleID: String, id: String) -> ChannelResult {
        state.withLock { s in
            if s.channelsDisabled.contains(bundleID) { return .failure(400, "FeatureNotEnabled") }
            guard let p = s.channels[bundleID]?[id] else { return .failure(400, "ChannelNotRegistered") }
            return .found(p)
        }
    }

    public func deleteChannel(bundleID: String, id: String) -> ChannelResult {
        state.withLock { s in
            if s.channelsDisabled.contains(bundleID) { return .failure(400, "FeatureNotEnabled") }
            guard s.channels[bundleID]?.removeValue(forKey: id) != nil else { return .failure(400, "ChannelNotRegistered") }
            return .deleted
        }
    }

    public func listChannels(bundleID: String) -> ChannelResult {
        state.withLock { s in
            if s.channelsDisabled.contains(bundleID) { return .failure(400, "FeatureNotEnabled") }
            return .list((s.channels[bundleID] ?? [:]).keys.sorted())
        }
    }

    /// Turns the Broadcast capability off (or on) for an app: its channel requests answer FeatureNotEnabled.
    public func setBroadcastCapability(bundleID: String, enabled: Bool) {
        state.withLock { s in
            if enabled { s.channelsDisabled.remove(bundleID) } else { s.channelsDisabled.insert(bundleID) }
        }
    }

    /// Fans a broadcast out to every activity subscribed to the channel. Returns nil if the
    /// channel does not exist, else (storage policy, outcomes).
    public func broadcast(bundleID: String, channelID: String, priority: Int, payload: JSONValue, requestID: String) -> (policy: Int, outcomes: [PushOutcome])? {
        defer { changes.notify() }
        let now = clock.now
        return state.withLock { s -> (Int, [PushOutcome])? in
            guard let policy = s.channels[bundleID]?[channelID] else { return nil }
            var outcomes: [PushOutcome] = []
            for deviceID in s.deviceOrder {
                guard let app = s.devices[deviceID]?.apps[bundleID], app.environment == environment else { continue }
                try? advanceLocked(&s, deviceID: deviceID, to: now)
                var d = s.devices[deviceID]!
                for i in d.activities.indices where d.activities[i].bundleID == bundleID && d.activities[i].channelID == channelID && d.activities[i].state != .dismissed {
                    outcomes.append(engine.receive(payload, priority: priority, apnsID: requestID, activity: &d.activities[i], app: app, now: now, events: &d.events))
                }
                s.devices[deviceID] = d
            }
            return (policy, outcomes)
        }
    }

    func channelExists(bundleID: String, id: String) -> Bool { state.withLock { $0.channels[bundleID]?[id] != nil } }
}
