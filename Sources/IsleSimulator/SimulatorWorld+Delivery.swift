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
    /// Token checks answer like APNs (docs/protocol.md, Simulated device · Tokens). An offline
    /// device gets nothing now: APNs stores the push until `apns-expiration` (absent: the default
    /// storage time; 0: not stored), one per app and activity, and delivers it when the device
    /// comes back (``setOnline(_:_:)``).
    public func deliver(token: String, pushType: String, topic: String, priority: Int, payload: JSONValue, apnsID: String,
                        expiration: Int64? = nil, collapseID: String? = nil) async -> DeliveryResult {
        // The token's device (and any whose token changed meanwhile) hear of it.
        var touched: String?
        defer { announce(touched.map { [$0] } ?? []) }
        let now = clock.now
        let (result, widgetWork) = state.withLock { s -> (DeliveryResult, (String, String)?) in
            rememberPushToken(&s, apnsID: apnsID, token: token)
            // A token whose moment to change has passed is already the old one.
            rotateDueTokensLocked(&s, now: now)
            touched = s.tokens[token]?.deviceID
            guard let owner = s.tokens[token], owner.environment == environment else {
                return (DeliveryResult(status: 400, reason: "BadDeviceToken", outcome: nil), nil)
            }
            // Hammering one token: APNs refuses before anything reaches the device.
            if configuration.perTokenLimit > 0 {
                var hits = s.tokenHits[token] ?? []
                hits.removeAll { now.timeIntervalSince($0) >= configuration.perTokenWindow }
                guard hits.count < configuration.perTokenLimit else {
                    s.tokenHits[token] = hits
                    return (DeliveryResult(status: 429, reason: "TooManyRequests", outcome: nil), nil)
                }
                hits.append(now)
                s.tokenHits[token] = hits
            }
            let expectedTopic: String
            switch owner.kind {
            case .widgets: expectedTopic = owner.bundleID + ".push-type.widgets"
            case .control: expectedTopic = owner.bundleID + ".push-type.controls"
            default: expectedTopic = owner.bundleID + ".push-type.liveactivity"
            }
            if case .retired(let since) = owner.kind {
                // A rotated-away token: no longer valid for the topic.
                return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: since), nil)
            }
            guard topic == expectedTopic, (pushType == "widgets") == (owner.kind == .widgets), (pushType == "controls") == owner.kind.isControl else {
                return (DeliveryResult(status: 400, reason: "DeviceTokenNotForTopic", outcome: nil), nil)
            }
            if case .activity(let id) = owner.kind, let i = indexLocked(s, activityID: id, deviceID: owner.deviceID),
               let answer = dismissedAnswer(&s, deviceID: owner.deviceID, index: i, apnsID: apnsID, now: now) {
                return (answer, nil)
            }
            // Reordering: APNs may hold this push a moment; a later one to the same token may pass it.
            let liveActivityToken: Bool = switch owner.kind { case .activity, .pushToStart: true; default: false }
            if liveActivityToken, configuration.reorderProbability > 0, configuration.reorderDelayMaximum > 0, s.devices[owner.deviceID]?.isOnline == true,
               Double.random(in: 0..<1, using: &s.random) < configuration.reorderProbability {
                let held = HeldPush(token: token, topic: topic, expiration: expiration, collapseID: collapseID, receivedAt: now, pushType: pushType, payload: payload,
                                    priority: priority, apnsID: apnsID, due: now)
                return (hold(&s, owner: owner, held, now: now), nil)
            }
            guard s.devices[owner.deviceID]?.isOnline ?? false else {
                let o = store(&s, StoredPush(token: token, channelID: nil, activityID: nil, pushType: pushType, topic: topic, priority: priority, payload: payload, apnsID: apnsID,
                                             collapseID: collapseID, receivedAt: now, expiresAt: storageEnd(expiration, from: now, limit: configuration.defaultStorageDuration)),
                              deviceID: owner.deviceID)
                return (DeliveryResult(status: 200, outcome: o, deviceID: owner.deviceID), nil)
            }
            var delivered = deliverLocked(&s, owner: owner, pushType: pushType, payload: payload, priority: priority, apnsID: apnsID, now: now)
            // WidgetKit acts on widget pushes opportunistically: accepted now, reloaded a seeded moment later.
            if let (deviceID, bundleID) = delivered.1, let due = scheduleWidgetPush(&s, deviceID: deviceID, bundleID: bundleID, apnsID: apnsID, now: now) {
                let o = PushOutcome(.widgetPushPending, "Accepted: WidgetKit handles widget pushes opportunistically and within the widgets' budget (Apple, \"Updating widgets with WidgetKit push notifications\"); it reloads at \(Clock.text(due)) (seeded, docs/simulator.md).")
                s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .push, apnsID: apnsID, outcome: o, message: o.sentence))
                delivered = (DeliveryResult(status: 200, outcome: o, deviceID: deviceID), nil)
            }
            noteLowPriorityDeferral(&s, delivered.0, deviceID: owner.deviceID, now: now)
            return delivered
        }
        // A push-to-start's activity gets its token after the start, like one the app requested.
        if state.withLock({ !$0.tokensDue.isEmpty }) { scheduleTick(after: configuration.pushTokenDelay) }
        if let (deviceID, bundleID) = widgetWork {
            let outcome = await reloadWidgets(deviceID: deviceID, bundleID: bundleID, kinds: nil, reason: .push, apnsID: apnsID)
            var r = result
            r.outcome = outcome
            return r
        }
        return result
    }

    /// A widget push WidgetKit acts on a seeded 1 s to ``SimulatorConfiguration/widgetPushDelayMaximum``
    /// from now (the ticker reloads then); nil when the delay is off and it reloads at once.
    func scheduleWidgetPush(_ s: inout State, deviceID: String, bundleID: String, apnsID: String, now: Date) -> Date? {
        let longest = configuration.widgetPushDelayMaximum
        guard longest > 0 else { return nil }
        let due = now.addingTimeInterval(Double.random(in: min(1, longest)...longest, using: &s.random))
        s.widgetPushesDue.append((due, deviceID, bundleID, apnsID))
        return due
    }

    /// A priority-5 push the device deferred: the ticker looks at the device from the shortest wait
    /// on (it then finds when the rest fall due).
    func noteLowPriorityDeferral(_ s: inout State, _ result: DeliveryResult, deviceID: String, now: Date) {
        guard result.outcome?.code == .deferredLowPriority else { return }
        let earliest = now.addingTimeInterval(configuration.lowPriorityDelay)
        s.lowPriorityDue[deviceID] = min(s.lowPriorityDue[deviceID] ?? earliest, earliest)
    }

    /// APNs holds a push a seeded moment before it reaches the device (Apple: "APNs may reorder
    /// notifications you send to the same device token"): the ticker delivers it when due.
    func hold(_ s: inout State, owner: TokenOwner, _ push: HeldPush, now: Date) -> DeliveryResult {
        let apnsID = push.apnsID
        let longest = configuration.reorderDelayMaximum
        let due = now.addingTimeInterval(Double.random(in: min(0.1, longest)...longest, using: &s.random))
        var push = push
        push.due = due
        s.heldPushes.append(push)
        let o = PushOutcome(.heldByAPNs, "Accepted; APNs holds it until \(Clock.text(due)) before it reaches the device, so a later push to this token may arrive first (Apple: APNs may reorder notifications to the same device token; seeded, docs/simulator.md). The device's timestamp rule sorts them out.")
        s.devices[owner.deviceID]!.events.append(DeviceEvent(time: now, source: .push, activityID: { if case .activity(let id) = owner.kind { id } else { nil } }(), apnsID: apnsID, outcome: o, message: o.sentence))
        return DeliveryResult(status: 200, outcome: o, deviceID: owner.deviceID)
    }

    /// Held pushes and widget pushes whose moment has come reach their devices.
    func deliverDueHeldPushes() async {
        let now = clock.now
        let (delivered, widgetWork) = state.withLock { s -> (Set<String>, [(String, String, String)]) in
            var work: [(String, String, String)] = []
            var delivered: Set<String> = []
            if s.heldPushes.contains(where: { $0.due <= now }) {
                let due = s.heldPushes.filter { $0.due <= now }.sorted { $0.due < $1.due }
                s.heldPushes.removeAll { $0.due <= now }
                for p in due {
                    // The token may have changed or gone meanwhile: APNs already answered 200, the device sees nothing.
                    guard let owner = s.tokens[p.token], s.devices[owner.deviceID] != nil else { continue }
                    delivered.insert(owner.deviceID)
                    if case .retired = owner.kind { continue }
                    guard s.devices[owner.deviceID]!.isOnline else {
                        // Offline by now: APNs stores it as it would have on arrival.
                        _ = store(&s, StoredPush(token: p.token, channelID: nil, activityID: nil, pushType: p.pushType, topic: p.topic, priority: p.priority, payload: p.payload,
                                                 apnsID: p.apnsID, collapseID: p.collapseID, receivedAt: p.receivedAt,
                                                 expiresAt: storageEnd(p.expiration, from: p.receivedAt, limit: configuration.defaultStorageDuration)),
                                  deviceID: owner.deviceID)
                        continue
                    }
                    let delivered = deliverLocked(&s, owner: owner, pushType: p.pushType, payload: p.payload, priority: p.priority, apnsID: p.apnsID, now: now)
                    noteLowPriorityDeferral(&s, delivered.0, deviceID: owner.deviceID, now: now)
                }
            }
            // A widget push whose moment came while its device is offline waits until it is back.
            let ready = { (w: (due: Date, deviceID: String, bundleID: String, apnsID: String)) in w.due <= now && s.devices[w.deviceID]?.isOnline != false }
            if s.widgetPushesDue.contains(where: ready) {
                work = s.widgetPushesDue.filter(ready).sorted { $0.due < $1.due }.map { ($0.deviceID, $0.bundleID, $0.apnsID) }
                s.widgetPushesDue.removeAll(where: ready)
            }
            return (delivered, work)
        }
        for (deviceID, bundleID, apnsID) in widgetWork { await reloadWidgets(deviceID: deviceID, bundleID: bundleID, kinds: nil, reason: .push, apnsID: apnsID) }
        if !delivered.isEmpty { announce(delivered) }
    }

    /// A push reaching an online device (now, or later from APNs' storage).
    func deliverLocked(_ s: inout State, owner: TokenOwner, pushType: String, payload: JSONValue, priority: Int, apnsID: String, now: Date) -> (DeliveryResult, (String, String)?) {
        guard s.devices[owner.deviceID] != nil else { return (DeliveryResult(status: 400, reason: "BadDeviceToken"), nil) }
        // A push to one activity brings only that activity up to now; any other push, the device.
        if case .activity(let id) = owner.kind, let i = indexLocked(s, activityID: id, deviceID: owner.deviceID) {
            advanceActivityLocked(&s, deviceID: owner.deviceID, index: i, to: now)
        } else {
            do { try advanceLocked(&s, deviceID: owner.deviceID, to: now) } catch { return (DeliveryResult(status: 400, reason: "BadDeviceToken"), nil) }
        }
        switch owner.kind {
        case .widgets:
            // WidgetKit reloads for the documented body only (docs/protocol.md §9.1).
            guard payload["aps"]?["content-changed"] == .bool(true) else {
                let o = PushOutcome(.notDelivered, "Ignored: a widgets push reloads timelines only with {\"aps\":{\"content-changed\":true}}; this one has \(payload["aps"]?.briefDescription ?? "no aps").",
                                    field: "aps.content-changed", expected: "true", found: payload["aps"]?["content-changed"]?.briefDescription ?? "nothing")
                s.devices[owner.deviceID]!.events.append(DeviceEvent(time: now, source: .push, apnsID: apnsID, outcome: o, message: o.sentence))
                return (DeliveryResult(status: 200, outcome: o, deviceID: owner.deviceID), nil)
            }
            return (DeliveryResult(status: 200, deviceID: owner.deviceID), (owner.deviceID, owner.bundleID))
        case .control(let kind):
            // WidgetKit reloads the token's control for the documented body only (Apple's
            // "Updating controls locally and remotely": {"aps":{"content-changed":true}}).
            guard payload["aps"]?["content-changed"] == .bool(true) else {
                let o = PushOutcome(.notDelivered, "Ignored: a controls push reloads controls only with {\"aps\":{\"content-changed\":true}}; this one has \(payload["aps"]?.briefDescription ?? "no aps").",
                                    field: "aps.content-changed", expected: "true", found: payload["aps"]?["content-changed"]?.briefDescription ?? "nothing")
                s.devices[owner.deviceID]!.events.append(DeviceEvent(time: now, source: .push, apnsID: apnsID, outcome: o, message: o.sentence))
                return (DeliveryResult(status: 200, outcome: o, deviceID: owner.deviceID), nil)
            }
            guard var app = s.devices[owner.deviceID]!.apps[owner.bundleID] else { return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: now), nil) }
            app.controlReloads += 1
            app.controlReloadsByKind[kind, default: 0] += 1
            app.lastControlReload = now
            s.devices[owner.deviceID]!.apps[owner.bundleID] = app
            let o = PushOutcome(.controlsReloaded, "Reloaded \(owner.bundleID)'s control \(kind): a controls push reloads the single control its token belongs to.")
            s.devices[owner.deviceID]!.events.append(DeviceEvent(time: now, source: .push, apnsID: apnsID, outcome: o, message: o.sentence))
            return (DeliveryResult(status: 200, outcome: o, deviceID: owner.deviceID), nil)
        case .activity(let id):
            guard let i = indexLocked(s, activityID: id, deviceID: owner.deviceID) else {
                return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: now), nil)
            }
            if let answer = dismissedAnswer(&s, deviceID: owner.deviceID, index: i, apnsID: apnsID, now: now) { return (answer, nil) }
            var a = s.devices[owner.deviceID]!.activities[i]
            guard let app = s.devices[owner.deviceID]!.apps[owner.bundleID] else { return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: now), nil) }
            // Moved out and back, not copied: the log grows in place.
            var events = s.devices[owner.deviceID]!.events
            s.devices[owner.deviceID]!.events = []
            let before = a
            var appBudget = s.devices[owner.deviceID]!.apps[owner.bundleID]!.budgetLog
            s.devices[owner.deviceID]!.apps[owner.bundleID]!.budgetLog = []
            let budgetBefore = appBudget
            var outcome = engine.receive(payload, priority: priority, apnsID: apnsID, activity: &a, app: app, appBudget: &appBudget, now: now, events: &events, random: &s.random)
            s.devices[owner.deviceID]!.apps[owner.bundleID]!.budgetLog = appBudget
            if let refused = crossCheck(a, outcome, bundleID: owner.bundleID) {
                // The app's own decoder would refuse what the schema let through: the device keeps
                // what it showed, and the log says why.
                a = before
                s.devices[owner.deviceID]!.apps[owner.bundleID]!.budgetLog = budgetBefore
                outcome = refused
                if let last = events.lastIndex(where: { $0.apnsID == apnsID && $0.activityID == a.id }) {
                    events[last].outcome = refused
                    events[last].message = refused.sentence
                }
            }
            s.devices[owner.deviceID]!.activities[i] = a
            s.devices[owner.deviceID]!.events = events
            return (DeliveryResult(status: 200, outcome: outcome, deviceID: owner.deviceID), nil)
        case .pushToStart(let type):
            let outcome = startFromPush(&s, owner: owner, tokenType: type, payload: payload, apnsID: apnsID, now: now)
            return (DeliveryResult(status: 200, outcome: outcome, deviceID: owner.deviceID), nil)
        case .retired(let since):
            return (DeliveryResult(status: 410, reason: "Unregistered", invalidSince: since), nil)
        }
    }

    /// The independent decode: when the app (``SimulatedActivityKit``) registered its
    /// `ContentState` type, content the schema applied must also decode with `JSONDecoder`;
    /// answers the refusal when it does not (nil: it does, or no type is registered).
    func crossCheck(_ a: SimulatedActivity, _ outcome: PushOutcome, bundleID: String) -> PushOutcome? {
        guard outcome.code == .applied || outcome.code == .ended || outcome.code == .flagged, let decode = contentDecoders.withLock({ $0[bundleID + "\n" + a.attributesType] }),
              let problem = decode(a.contentState) else { return nil }
        return PushOutcome(.decodingFailed, "Dropped: the content schema accepts this content-state, but the app's ContentState type does not decode it with JSONDecoder (\(problem)); the schema and the app disagree, and the device keeps what it showed.",
                           field: "content-state", expected: "what the app's ContentState decodes", found: problem)
    }

    /// The app a topic addresses: `com.example.pizza.push-type.liveactivity` → `com.example.pizza`.
    static func bundleID(ofTopic topic: String) -> String {
        guard let r = topic.range(of: ".push-type.") else { return topic }
        return String(topic[..<r.lowerBound])
    }

    /// When APNs stops trying: `apns-expiration` (0: not stored; absent: `limit` from now).
    func storageEnd(_ expiration: Int64?, from now: Date, limit: TimeInterval) -> Date {
        guard let expiration else { return now.addingTimeInterval(limit) }
        if expiration == 0 { return now }
        return min(Date(timeIntervalSince1970: Double(expiration)), now.addingTimeInterval(limit))
    }

    /// Keeps `push` for an offline device, replacing the one stored for the same app: APNs stores
    /// one notification per app for an offline device, the newest (Apple, "Sending notification
    /// requests to APNs", Quality of Service, Store-and-Forward; docs/simulator.md). Two activities
    /// of one app updated while the phone is offline: only the last push reaches it.
    func store(_ s: inout State, _ push: StoredPush, deviceID: String) -> PushOutcome {
        let key = { (p: StoredPush) in p.token != nil ? "a:\(Self.bundleID(ofTopic: p.topic))" : "c:\(p.channelID ?? ""):\(p.activityID ?? "")" }
        let mine = key(push)
        let now = push.receivedAt
        guard push.expiresAt > now else {
            let o = PushOutcome(.expiredWhileOffline, "Not delivered: the device is offline and apns-expiration 0 tells APNs not to store the push.")
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, activityID: push.activityID, apnsID: push.apnsID, outcome: o, message: o.sentence))
            return o
        }
        var replaced: StoredPush?
        // "In most cases, the latest notification is stored": in a seeded few, APNs keeps the earlier one.
        if configuration.storedPushNotNewestProbability > 0, push.token != nil,
           let earlier = s.devices[deviceID]!.storedPushes.first(where: { key($0) == mine && $0.expiresAt > now }),
           Double.random(in: 0..<1, using: &s.random) < configuration.storedPushNotNewestProbability {
            let o = PushOutcome(.expiredWhileOffline, "Not stored: the device is offline and APNs kept the push it already held for this app (received \(Clock.text(earlier.receivedAt))) instead of this newer one — Apple: \"in most cases\" the latest is stored (seeded, docs/simulator.md).")
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, activityID: push.activityID, apnsID: push.apnsID, outcome: o, message: o.sentence))
            return o
        }
        s.devices[deviceID]!.storedPushes.removeAll { p in
            guard key(p) == mine else { return false }
            replaced = p
            return true
        }
        s.devices[deviceID]!.storedPushes.append(push)
        let why = replaced.map { r in
            r.collapseID != nil && r.collapseID == push.collapseID ? "; it replaces the stored push with the same apns-collapse-id \(r.collapseID!)" : "; it replaces the one stored before for this app\(r.token != push.token ? ", sent to another of its tokens" : "") (APNs keeps one per app)"
        } ?? ""
        return PushOutcome(.storedWhileOffline, "Stored by APNs: the device is offline; delivered when it comes back, until \(Clock.text(push.expiresAt))\(why).")
    }

    /// Takes a device off the network or brings it back. Back online, it receives what APNs kept
    /// for it (not expired), oldest first; what expired meanwhile is logged as missed.
    public func setOnline(_ deviceID: String, _ online: Bool) async throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        let widgetWork = try state.withLock { (s) throws(SimulatorError) -> [(String, String, String)] in
            guard s.devices[deviceID] != nil else { throw SimulatorError(.notFound, "no device \(deviceID)") }
            guard s.devices[deviceID]!.isOnline != online else { return [] }
            s.devices[deviceID]!.isOnline = online
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, message: online ? "The device is back online." : "The device went offline: APNs stores what it may until it is back."))
            guard online else { return [] }
            let stored = s.devices[deviceID]!.storedPushes.sorted { $0.receivedAt < $1.receivedAt }
            s.devices[deviceID]!.storedPushes = []
            var work: [(String, String, String)] = []
            for p in stored {
                guard p.expiresAt > now else {
                    let o = PushOutcome(.expiredWhileOffline, "Missed: APNs discarded a push stored at \(Clock.text(p.receivedAt)) when its expiration passed (\(Clock.text(p.expiresAt))) before the device came back.")
                    s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, activityID: p.activityID, apnsID: p.apnsID, outcome: o, message: o.sentence))
                    continue
                }
                if let token = p.token {
                    guard let owner = s.tokens[token], owner.deviceID == deviceID else { continue }
                    let (_, widgets) = deliverLocked(&s, owner: owner, pushType: p.pushType, payload: p.payload, priority: p.priority, apnsID: p.apnsID, now: now)
                    // Opportunistic here too: WidgetKit acts on it a seeded moment after it arrives.
                    if let (d, b) = widgets, scheduleWidgetPush(&s, deviceID: d, bundleID: b, apnsID: p.apnsID, now: now) == nil { work.append((d, b, p.apnsID)) }
                } else if let channel = p.channelID, let activityID = p.activityID {
                    // A channel deleted meanwhile took its stored message with it.
                    guard s.channels[Self.bundleID(ofTopic: p.topic)]?[channel] != nil else {
                        let o = PushOutcome(.expiredWhileOffline, "Missed: channel \(channel) was deleted while the device was offline; its stored message went with it.")
                        s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, activityID: activityID, apnsID: p.apnsID, outcome: o, message: o.sentence))
                        continue
                    }
                    try? advanceLocked(&s, deviceID: deviceID, to: now)
                    guard let i = s.devices[deviceID]!.activities.firstIndex(where: { $0.id == activityID && $0.channelID == channel }),
                          let app = s.devices[deviceID]!.apps[s.devices[deviceID]!.activities[i].bundleID] else { continue }
                    var d = s.devices[deviceID]!
                    _ = engine.receive(p.payload, priority: p.priority, apnsID: p.apnsID, activity: &d.activities[i], app: app, appBudget: &d.apps[app.bundleID]!.budgetLog, now: now,
                                       events: &d.events, random: &s.random)
                    s.devices[deviceID] = d
                }
            }
            return work
        }
        if state.withLock({ !$0.tokensDue.isEmpty }) { scheduleTick(after: configuration.pushTokenDelay) }
        for (d, b, apnsID) in widgetWork { await reloadWidgets(deviceID: d, bundleID: b, kinds: nil, reason: .push, apnsID: apnsID) }
    }

    /// What APNs answers for a dismissed activity's token: 200 (nothing shown) until the moment it
    /// stops accepting it — drawn once from the seed, up to ``SimulatorConfiguration/tokenInvalidationDelayMaximum``
    /// after the dismissal — and 410 `Unregistered` from then on. Nil: the activity is not dismissed.
    func dismissedAnswer(_ s: inout State, deviceID: String, index i: Int, apnsID: String, now: Date) -> DeliveryResult? {
        guard s.devices[deviceID]!.activities[i].state == .dismissed else { return nil }
        let dismissedAt = s.devices[deviceID]!.activities[i].dismissedAt ?? now
        let invalidAt: Date
        if let t = s.devices[deviceID]!.activities[i].tokenInvalidAt {
            invalidAt = t
        } else {
            let delay = configuration.tokenInvalidationDelayMaximum > 0 ? Double.random(in: 0...configuration.tokenInvalidationDelayMaximum, using: &s.random) : 0
            invalidAt = dismissedAt.addingTimeInterval(delay)
            s.devices[deviceID]!.activities[i].tokenInvalidAt = invalidAt
        }
        guard now < invalidAt else { return DeliveryResult(status: 410, reason: "Unregistered", invalidSince: dismissedAt) }
        let o = PushOutcome(.notDelivered, "Dropped: the activity was dismissed at \(Clock.text(dismissedAt)); APNs still accepts its token for a while (it answers 410 from \(Clock.text(invalidAt))). Stop on the app's dismissal report, not only on a 410.")
        s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .push, activityID: s.devices[deviceID]!.activities[i].id, apnsID: apnsID, outcome: o, message: o.sentence))
        return DeliveryResult(status: 200, outcome: o, deviceID: deviceID)
    }

    /// A push-to-start (docs/protocol.md §6; docs/protocol.md, Push-to-start).
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
        guard let app = s.devices[deviceID]!.apps[owner.bundleID] else { return log(PushOutcome(.notDelivered, "Dropped: \(owner.bundleID) is no longer installed.")) }
        let type = aps["attributes-type"]?.stringValue ?? ""
        guard type == tokenType else {
            return log(PushOutcome(.unknownAttributesType, "Dropped: attributes-type \"\(type)\" does not match this token's type \"\(tokenType)\" (exact Swift name, case-sensitive).",
                                   field: "attributes-type", expected: tokenType, found: type))
        }
        let device = s.devices[deviceID]!
        if let problem = engine.checkTimestamp(aps, last: nil) { return log(problem) }
        let wantsToken = aps["input-push-token"]?.numberValue?.exactInt64Value == 1
        if !device.runs(atLeast: 18), aps["input-push-channel"] != nil {
            return log(PushOutcome(.unsupportedOnThisVersion, "Not started: input-push-channel needs iOS 18; this device runs \(device.osVersion) (docs/protocol.md §6: \"the Live Activity will not start\")."))
        }
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
        // The system lets only so many push-to-starts through in a short time (docs/simulator.md).
        if configuration.pushToStartLimit > 0 {
            let key = deviceID + "\u{1}" + owner.bundleID
            let recent = (s.pushStarts[key] ?? []).filter { now.timeIntervalSince($0) < configuration.pushToStartWindow }
            guard recent.count < configuration.pushToStartLimit else {
                s.pushStarts[key] = recent
                return log(PushOutcome(.pushToStartThrottled, "Not started: \(owner.bundleID) already started \(recent.count) activities by push on this device in the last \(Int(saturating: configuration.pushToStartWindow / 60)) minutes; the system lets about \(configuration.pushToStartLimit) through in a short time (APNs answered 200). Start fewer, or update the running activity instead."))
            }
            s.pushStarts[key] = recent + [now]
        }
        var a = newActivity(&s, deviceID: deviceID, app: app, attributesType: type, attributes: attributes, contentState: contentState, now: now, by: .push)
        a.channelID = channel
        a.lastTimestamp = ActivityEngine.apsDate(aps["timestamp"])
        a.relevanceScore = aps["relevance-score"]?.numberValue?.doubleValue ?? 0
        a.staleDate = ActivityEngine.apsDate(aps["stale-date"])
        a.lastAlert = Localizer.resolve(aps["alert"]!.objectValue!, table: app.localization, at: now)
        // iOS 18 and later issue an update token only when the push asks with "input-push-token": 1
        // (Isle's reading of docs/protocol.md §6, where Apple is ambiguous; docs/protocol.md, Isle's decisions); before 18
        // a push-started activity always gets one.
        var tokenNote: String
        if channel != nil {
            tokenNote = ""
        } else if device.runs(atLeast: 18), !wantsToken {
            tokenNote = "; it has no update token: the push did not ask with \"input-push-token\": 1 (iOS 18+), so the server can update it only by channel or a new start"
        } else if configuration.withholdUpdateTokenUntilAllowed {
            a.withheldToken = Self.newToken(bytes: 80)
            tokenNote = "; its update token waits until the person allows"
        } else if app.isForceQuit, configuration.forceQuitWithholdsToken {
            a.tokenWaitsForLaunch = true
            tokenNote = "; the app was force-quit, so iOS does not launch it to hand over the update token: it comes only when the person opens the app"
        } else if app.isTerminated, configuration.terminatedWithholdsToken {
            a.tokenWaitsForLaunch = true
            tokenNote = "; the app is not running, and (as developers report) its update token comes only when the app is opened"
        } else {
            a.tokenDueAt = now.addingTimeInterval(configuration.pushTokenDelay)
            s.tokensDue.insert(deviceID)
            tokenNote = "; its update token follows on pushTokenUpdates"
        }
        var startCode = PushOutcome.Code.started
        if let ts = aps["timestamp"]?.numberValue?.doubleValue, ts > 1e11 {
            startCode = .flagged
            tokenNote += ". Flagged: timestamp \(aps["timestamp"]!.briefDescription) looks like milliseconds: every later update in seconds will be ignored as older"
        }
        s.activityIndex[a.id] = s.devices[deviceID]!.activities.count
        s.devices[deviceID]!.activities.append(a)
        return log(PushOutcome(startCode, "Started a \(type) activity\(channel.map { " subscribed to channel \($0)" } ?? "")\(tokenNote)."), a.id)
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

    /// Turns the Broadcast capability off (or on) for an app: its channel requests answer
    /// FeatureNotEnabled. Off deletes every channel of the app, for good — Apple: disabling the
    /// capability deletes the app's channels, and they cannot be restored (docs/simulator.md);
    /// on again, the app starts with none. Answers how many channels were deleted.
    @discardableResult
    public func setBroadcastCapability(bundleID: String, enabled: Bool) -> Int {
        defer { announceAll() }
        return state.withLock { s in
            if enabled {
                s.channelsDisabled.remove(bundleID)
                return 0
            }
            s.channelsDisabled.insert(bundleID)
            let deleted = s.channels.removeValue(forKey: bundleID) ?? [:]
            // What APNs stored on those channels for offline devices goes with them.
            for id in s.deviceOrder where s.devices[id]?.storedPushes.contains(where: { $0.channelID.map { deleted[$0] != nil } ?? false }) == true {
                s.devices[id]!.storedPushes.removeAll { $0.channelID.map { deleted[$0] != nil } ?? false }
            }
            return deleted.count
        }
    }

    /// Fans a broadcast out to every activity subscribed to the channel. Returns nil if the
    /// channel does not exist, else (storage policy, outcomes).
    /// An offline subscriber gets, when it is back, the channel's most recent message if the
    /// channel stores one (policy 1: up to 8 h, or `apns-expiration` if sooner); policy 0 stores none.
    /// `expiration`: the request's `apns-expiration` (0: attempt once, not stored — Apple); nil: as
    /// long as the channel keeps messages.
    public func broadcast(bundleID: String, channelID: String, priority: Int, payload: JSONValue, requestID: String, expiration: Int64? = nil) -> (policy: Int, outcomes: [PushOutcome])? {
        defer { announceAll() }
        let now = clock.now
        return state.withLock { s -> (Int, [PushOutcome])? in
            guard let policy = s.channels[bundleID]?[channelID] else { return nil }
            var outcomes: [PushOutcome] = []
            for deviceID in s.deviceOrder {
                guard let app = s.devices[deviceID]?.apps[bundleID], app.environment == environment else { continue }
                try? advanceLocked(&s, deviceID: deviceID, to: now)
                var d = s.devices[deviceID]!
                let subscribed = d.activities.indices.filter { d.activities[$0].bundleID == bundleID && d.activities[$0].channelID == channelID && d.activities[$0].state != .dismissed }
                guard d.isOnline else {
                    for i in subscribed {
                        let id = d.activities[i].id
                        guard policy == 1 else {
                            let o = PushOutcome(.expiredWhileOffline, "Missed: the device is offline and the channel stores no messages (storage policy 0).")
                            d.events.append(DeviceEvent(time: now, source: .system, activityID: id, apnsID: requestID, outcome: o, message: o.sentence))
                            outcomes.append(o)
                            continue
                        }
                        let push = StoredPush(token: nil, channelID: channelID, activityID: id, pushType: "liveactivity", topic: bundleID, priority: priority, payload: payload,
                                              apnsID: requestID, collapseID: nil, receivedAt: now,
                                              expiresAt: storageEnd(expiration, from: now, limit: configuration.channelStorageDuration))
                        s.devices[deviceID] = d
                        outcomes.append(store(&s, push, deviceID: deviceID))
                        d = s.devices[deviceID]!
                    }
                    s.devices[deviceID] = d
                    continue
                }
                for i in subscribed {
                    outcomes.append(engine.receive(payload, priority: priority, apnsID: requestID, activity: &d.activities[i], app: app, appBudget: &d.apps[bundleID]!.budgetLog, now: now,
                                                   events: &d.events, random: &s.random))
                }
                s.devices[deviceID] = d
            }
            return (policy, outcomes)
        }
    }

    func channelExists(bundleID: String, id: String) -> Bool { state.withLock { $0.channels[bundleID]?[id] != nil } }
}
