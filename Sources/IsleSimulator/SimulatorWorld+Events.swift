public import Foundation

/// One device event as the control API's `GET /events` finds it: where it is (`device`, its place
/// in that device's log) and the event itself.
public struct FoundEvent: Sendable, Hashable, Codable {
    public var device: String
    /// Its number in that device's log (see ``DeviceEvent/seq``).
    public var seq: Int
    public var time: Date
    public var source: DeviceEvent.Source
    public var activityID: String?
    public var apnsID: String?
    /// The device token the push was sent to, when the event is a token push's.
    public var token: String?
    public var outcome: PushOutcome?
    public var message: String
}

/// Which events `GET /events` answers: every filter given must match.
public struct EventQuery: Sendable, Hashable {
    public var deviceID: String?
    /// The `apns-id` of a device push, or the `apns-request-id` of a broadcast.
    public var apnsID: String?
    /// A device token (hex, either case): the pushes sent to it, and for an activity's update token
    /// every event of that activity.
    public var token: String?
    public var activityID: String?
    public var outcomes: Set<PushOutcome.Code>?
    public var sources: Set<DeviceEvent.Source>?
    /// Only events after this cursor (from an earlier answer); nil: from the start of every log.
    public var after: EventCursor?
    public var limit: Int
    public init(deviceID: String? = nil, apnsID: String? = nil, token: String? = nil, activityID: String? = nil, outcomes: Set<PushOutcome.Code>? = nil,
                sources: Set<DeviceEvent.Source>? = nil, after: EventCursor? = nil, limit: Int = 1000) {
        self.deviceID = deviceID
        self.apnsID = apnsID?.lowercased()
        self.token = token?.lowercased()
        self.activityID = activityID
        self.outcomes = outcomes
        self.sources = sources
        self.after = after
        self.limit = limit
    }
}

/// Where a reader of the event logs has got to: the last event number seen on each device. Its
/// text (`device-1=4,device-2=0`) is opaque to clients: they pass back what they were given.
public struct EventCursor: Sendable, Hashable {
    public var next: [String: Int]
    public init(next: [String: Int] = [:]) { self.next = next }

    public init?(text: String) {
        var next: [String: Int] = [:]
        for part in text.split(separator: ",") {
            let pair = part.split(separator: "=")
            guard pair.count == 2, let n = Int(pair[1]), n >= 0, !pair[0].isEmpty else { return nil }
            next[String(pair[0])] = n
        }
        self.next = next
    }

    public var text: String { next.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",") }
}

extension SimulatorWorld {
    /// Events matching `query` after its cursor, oldest first within each device (devices in the
    /// order they were made), and the cursor to pass next time: past every event looked at, so a
    /// poller never sees one twice and never misses one.
    public func events(matching query: EventQuery) -> (events: [FoundEvent], cursor: EventCursor) {
        state.withLock { s in
            var found: [FoundEvent] = []
            var cursor = query.after ?? EventCursor()
            // The token's owner: an activity's update token also matches that activity's events.
            let tokenActivity: String? = query.token.flatMap { t in
                if case .activity(let id) = s.tokens[t]?.kind { return id }
                return nil
            }
            let tokenDevice = query.token.flatMap { s.tokens[$0]?.deviceID }
            let now = clock.now
            for deviceID in s.deviceOrder {
                guard s.devices[deviceID] != nil else { continue }
                // What happened as time passed (stale, the 8-hour end, a deferred update applied) is
                // logged when a device is brought up to now: do that first.
                if query.deviceID == nil || query.deviceID == deviceID { try? advanceLocked(&s, deviceID: deviceID, to: now) }
                // Number the events not numbered yet: whatever was logged since the last reading,
                // wherever the time order put it.
                var seq = s.eventSeqs[deviceID] ?? 0
                // Only a log that grew since it was last numbered is scanned for new events.
                if s.devices[deviceID]!.events.count > seq {
                    for i in s.devices[deviceID]!.events.indices where s.devices[deviceID]!.events[i].seq == nil {
                        seq += 1
                        s.devices[deviceID]!.events[i].seq = seq
                    }
                    s.eventSeqs[deviceID] = seq
                }
                let seen = cursor.next[deviceID] ?? 0
                // Nothing after the reader's place on this device: nothing to look at.
                if seq <= seen {
                    cursor.next[deviceID] = seen
                    continue
                }
                guard query.deviceID == nil || query.deviceID == deviceID else {
                    // Not asked about: the cursor keeps its place there.
                    cursor.next[deviceID] = seen
                    continue
                }
                var last = seen
                let fresh = s.devices[deviceID]!.events.filter { ($0.seq ?? 0) > seen }.sorted { $0.seq! < $1.seq! }
                for e in fresh {
                    guard found.count < query.limit else { break }
                    last = e.seq!
                    let token = e.apnsID.flatMap { s.pushTokens[$0] }
                    if let id = query.apnsID, e.apnsID?.lowercased() != id { continue }
                    if let a = query.activityID, e.activityID != a { continue }
                    if let codes = query.outcomes, !(e.outcome.map { codes.contains($0.code) } ?? false) { continue }
                    if let sources = query.sources, !sources.contains(e.source) { continue }
                    if let t = query.token {
                        let sentToIt = token == t
                        let itsActivity = tokenActivity != nil && tokenDevice == deviceID && e.activityID == tokenActivity
                        if !sentToIt && !itsActivity { continue }
                    }
                    found.append(FoundEvent(device: deviceID, seq: e.seq!, time: e.time, source: e.source, activityID: e.activityID, apnsID: e.apnsID, token: token,
                                            outcome: e.outcome, message: e.message))
                }
                cursor.next[deviceID] = last
            }
            return (found, cursor)
        }
    }

    /// ``events(matching:)``, waiting up to `timeout` (long poll) for a first match: answers as
    /// soon as one arrives, or empty with the cursor when the time is up.
    public func waitForEvents(matching query: EventQuery, timeout: Duration) async -> (events: [FoundEvent], cursor: EventCursor) {
        var q = query
        let feed = changes.subscribe()
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let answer = events(matching: q)
        guard answer.events.isEmpty, timeout > .zero else { return answer }
        q.after = answer.cursor
        let base = q
        return await withTaskGroup(of: (events: [FoundEvent], cursor: EventCursor)?.self) { group in
            group.addTask {
                var cursor = base.after
                for await _ in feed {
                    var next = base
                    next.after = cursor
                    let r = self.events(matching: next)
                    if !r.events.isEmpty { return r }
                    cursor = r.cursor
                    if ContinuousClock.now >= deadline { return r }
                }
                return nil
            }
            // Transitions that come with time alone are logged lazily, with no change to wake the
            // feed: look again every half second too.
            group.addTask {
                while ContinuousClock.now < deadline {
                    try? await Task.sleep(for: .milliseconds(500))
                    if Task.isCancelled { return nil }
                    let r = self.events(matching: base)
                    if !r.events.isEmpty { return r }
                }
                return nil
            }
            group.addTask {
                try? await Task.sleep(until: deadline)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? self.events(matching: base)
        }
    }

    /// Remembers which token a push went to, so events can be found by token (the newest
    /// `maximumRememberedPushes`; older pushes are still found by apns-id).
    func rememberPushToken(_ s: inout State, apnsID: String, token: String) {
        if s.pushTokens[apnsID] == nil { s.pushTokenOrder.append(apnsID) }
        s.pushTokens[apnsID] = token
        if s.pushTokenOrder.count > Self.maximumRememberedPushes * 2 {
            for old in s.pushTokenOrder.prefix(Self.maximumRememberedPushes) { s.pushTokens.removeValue(forKey: old) }
            s.pushTokenOrder.removeFirst(Self.maximumRememberedPushes)
        }
    }

    static let maximumRememberedPushes = 100_000
}
