public import Foundation
import IsleCore

extension SimulatorWorld {
    // MARK: What happens later on its own

    /// Runs what has come due by now: push tokens ActivityKit hands out after `request` (or a
    /// push-to-start), and widget reloads asked for by timeline policies or deferred by the budget.
    /// ``IsleSim`` calls it a few times a second in real time; ``advanceClock(by:)`` calls it on a
    /// manual clock; a request schedules one for its token.
    public func tick() async {
        handOutDueTokens()
        rotateDueTokens()
        await deliverDueHeldPushes()
        applyDueLowPriority()
        await runDueWidgetReloads()
    }

    /// Tokens whose time has come go to their activities, each with an event (the app sees them on
    /// `pushTokenUpdates`).
    func handOutDueTokens() {
        let now = clock.now
        let issued = state.withLock { s -> Set<String> in
            var n: Set<String> = []
            for deviceID in s.tokensDue.sorted() {
                guard s.devices[deviceID] != nil else { continue }
                var waiting = false
                for bundleID in s.devices[deviceID]!.apps.keys.sorted() {
                    guard var app = s.devices[deviceID]!.apps[bundleID], let due = app.tokensDueAt else { continue }
                    guard due <= now else {
                        waiting = true
                        continue
                    }
                    issueInstallTokens(&s, &app, deviceID: deviceID)
                    s.devices[deviceID]!.apps[bundleID] = app
                    n.insert(deviceID)
                    if !app.pushToStartTokens.isEmpty || app.widgetPushToken != nil {
                        s.devices[deviceID]!.events.append(DeviceEvent(time: due, source: .system, activityID: nil,
                                                                       message: "\(bundleID) got its \([app.pushToStartTokens.isEmpty ? nil : "push-to-start token (pushToStartTokenUpdates)", app.widgetPushToken == nil ? nil : "widget push token"].compactMap { $0 }.joined(separator: " and "))."))
                    }
                }
                for i in s.devices[deviceID]!.activities.indices {
                    var a = s.devices[deviceID]!.activities[i]
                    guard let due = a.tokenDueAt else { continue }
                    guard due <= now else {
                        waiting = true
                        continue
                    }
                    a.tokenDueAt = nil
                    guard a.state != .dismissed, let app = s.devices[deviceID]!.apps[a.bundleID] else { continue }
                    issueUpdateToken(&s, &a, deviceID: deviceID, environment: app.environment)
                    s.devices[deviceID]!.activities[i] = a
                    s.devices[deviceID]!.events.append(DeviceEvent(time: due, source: .system, activityID: a.id, message: "ActivityKit handed the activity its push token (pushTokenUpdates)."))
                    n.insert(deviceID)
                }
                if !waiting { s.tokensDue.remove(deviceID) }
            }
            return n
        }
        if !issued.isEmpty { announce(issued) }
    }

    /// Tokens whose seeded moment to change has come (see ``SimulatorConfiguration/activityTokenRotation``).
    func rotateDueTokens() {
        let now = clock.now
        if state.withLock({ s in rotateDueTokensLocked(&s, now: now) }) { announce([]) }
    }

    /// Priority-5 pushes whose wait is over are applied (and watchers told), on the devices that
    /// hold some; each such device then records when its next one falls due.
    func applyDueLowPriority() {
        let now = clock.now
        let applied = state.withLock { s -> [String] in
            let due = s.lowPriorityDue.filter { $0.value <= now }.map(\.key)
            for deviceID in due {
                try? advanceLocked(&s, deviceID: deviceID, to: now)
                s.lowPriorityDue[deviceID] = s.devices[deviceID]?.activities.lazy.flatMap { $0.lowPriorityQueue.lazy.map(\.applyAt) }.min()
            }
            return due
        }
        if !applied.isEmpty { announce(applied) }
    }

    /// A tick after `delay` seconds: on a manual clock only when the delay is 0 (later ones wait for
    /// ``advanceClock(by:)``); never inside the caller's call, so a token is never there synchronously.
    func scheduleTick(after delay: TimeInterval) {
        if clock is ManualWallClock, delay > 0 { return }
        if delay <= 0 {
            // One pending tick serves every request made before it runs.
            guard state.withLock({ s in
                defer { s.tickPending = true }
                return !s.tickPending
            }) else { return }
            Task {
                state.withLock { $0.tickPending = false }
                await self.tick()
            }
            return
        }
        Task {
            try? await Task.sleep(for: .milliseconds(Int(saturating: delay * 1000)))
            await self.tick()
        }
    }

    /// Waits until the activity has its push token, as app code awaits `pushTokenUpdates`.
    /// Fails at once for an activity that will get none (no push type, a channel, withheld until
    /// allowed, started without `input-push-token`), and after `timeout` otherwise.
    public func waitForPushToken(activityID: String, on deviceID: String, timeout: Duration = .seconds(10)) async throws(SimulatorError) -> String {
        try await waitForToken(timeout: timeout, what: "activity \(activityID) got no push token") { () throws(SimulatorError) -> String? in
            let d = try device(deviceID)
            guard let a = d.activities.first(where: { $0.id == activityID }) else { throw SimulatorError(.notFound, "no activity \(activityID) on \(deviceID)") }
            if let token = a.updateToken { return token }
            guard a.tokenDueAt != nil else {
                let why = a.withheldToken != nil ? "withheld until the person allows" : a.tokenWaitsForLaunch ? "its app was force-quit or not running: the token comes when the app is opened" : "it was not started for token updates"
                throw SimulatorError(.conflict, "activity \(activityID) gets no push token (\(why))")
            }
            return nil
        }
    }

    /// Waits until the app has its push-to-start token for `attributesType`, as app code awaits
    /// `pushToStartTokenUpdates` (iOS 17.2+; the token comes a moment after install).
    public func waitForPushToStartToken(bundleID: String, attributesType: String, on deviceID: String, timeout: Duration = .seconds(10)) async throws(SimulatorError) -> String {
        try await waitForAppToken(bundleID: bundleID, on: deviceID, timeout: timeout, what: "push-to-start token for \(attributesType)") { $0.pushToStartTokens[attributesType] }
    }

    /// Waits until the app has its widget push token (iOS 26+, with widgets).
    public func waitForWidgetPushToken(bundleID: String, on deviceID: String, timeout: Duration = .seconds(10)) async throws(SimulatorError) -> String {
        try await waitForAppToken(bundleID: bundleID, on: deviceID, timeout: timeout, what: "widget push token") { $0.widgetPushToken }
    }

    func waitForAppToken(bundleID: String, on deviceID: String, timeout: Duration, what: String, _ read: @escaping (SimulatedApp) -> String?) async throws(SimulatorError) -> String {
        try await waitForToken(timeout: timeout, what: "\(bundleID) got no \(what)") { () throws(SimulatorError) -> String? in
            let a = try app(bundleID, on: deviceID)
            if let token = read(a) { return token }
            guard a.tokensDueAt != nil else { throw SimulatorError(.conflict, "\(bundleID) on \(deviceID) gets no \(what) (not on this iOS, or no such type or widget)") }
            return nil
        }
    }

    /// Reads `check` now and after every change of the world until it answers a token (or throws),
    /// failing after `timeout` with `what`.
    func waitForToken(timeout: Duration, what: String, _ check: () throws(SimulatorError) -> String?) async throws(SimulatorError) -> String {
        let feed = changes.subscribe()
        let deadline = ContinuousClock.now + timeout
        var iterator = feed.makeAsyncIterator()
        while true {
            if let token = try check() { return token }
            if ContinuousClock.now >= deadline {
                throw SimulatorError(.conflict, "\(what) within \(timeout)\(clock is ManualWallClock ? "; on a manual clock, advance it past the token delay" : "")")
            }
            // Wakes on the next change, or at the deadline.
            let waker = Task {
                try? await Task.sleep(until: deadline)
                self.changes.notify(devices: [])
            }
            _ = await iterator.next()
            waker.cancel()
        }
    }

    /// Advances a manual clock and runs what became due (tokens, widget policy reloads). Activity
    /// transitions are applied lazily whenever a device is read or receives a push.
    public func advanceClock(by seconds: TimeInterval) async throws(SimulatorError) {
        defer { announceAll() }
        guard let manual = clock as? ManualWallClock else { throw SimulatorError(.conflict, "the simulator runs in real time; its clock cannot be advanced") }
        guard seconds >= 0 else { throw SimulatorError(.invalidArgument, "seconds must be ≥ 0", field: "seconds") }
        manual.advance(by: seconds)
        await tick()
    }

    /// Runs ``tick()`` every `interval` until cancelled (real time only; ``IsleSim`` runs it).
    public func runTicker(every interval: Duration = .milliseconds(200)) async {
        guard !(clock is ManualWallClock) else { return }
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            await tick()
        }
    }
}
