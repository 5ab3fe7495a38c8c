import AsyncHTTPClient
public import Foundation
import IsleCore
import NIOCore
import Synchronization

/// Timeline providers registered by Swift code (the SDK's and tests' analogue of a widget extension).
final class ProviderRegistry: Sendable {
    typealias Provider = @Sendable (_ now: Date) async throws -> WidgetTimeline
    let providers = Mutex<[String: Provider]>([:])
}

extension SimulatorWorld {
    public enum ReloadReason: String, Sendable {
        case push, app, policy
        /// The widget was just added: its first timeline (free, like the app's own reloads in the foreground).
        case added
    }

    /// Registers a Swift timeline provider for widgets configured with `.provider(name)`.
    public func registerTimelineProvider(_ name: String, _ provider: @escaping @Sendable (_ now: Date) async throws -> WidgetTimeline) {
        timelineProviders.providers.withLock { $0[name] = provider }
    }

    /// Reloads the app's widgets (all, or those of the given kinds), within the reload budget
    /// (docs/protocol.md, Simulated device · WidgetKit): free while the app is in the foreground
    /// and asks itself; otherwise 70 per widget per 24 h, over which the reload is deferred.
    @discardableResult
    public func reloadWidgets(deviceID: String, bundleID: String, kinds: [String]?, reason: ReloadReason, apnsID: String? = nil) async -> PushOutcome {
        defer { announce(device: deviceID) }
        let now = clock.now
        // 1. Decide, under the lock, which widgets reload now.
        let plan: [(Int, SimulatedWidget.Configuration.Source)]? = state.withLock { s in
            guard var app = s.devices[deviceID]?.apps[bundleID] else { return nil }
            var work: [(Int, SimulatedWidget.Configuration.Source)] = []
            for i in app.widgets.indices where kinds == nil || kinds!.contains(app.widgets[i].configuration.kind) {
                var w = app.widgets[i]
                w.reloadLog.removeAll { now.timeIntervalSince($0) >= 86400 }
                let free = (reason == .app && app.isForeground) || (reason == .added && w.lastReload == nil)
                if !free, w.reloadLog.count >= (w.dailyBudget ?? configuration.widgetDailyReloadBudget) {
                    w.pendingReload = w.reloadLog[0].addingTimeInterval(86400)
                } else {
                    if !free { w.reloadLog.append(now) }
                    w.pendingReload = nil
                    work.append((i, w.configuration.source))
                }
                app.widgets[i] = w
            }
            s.devices[deviceID]!.apps[bundleID] = app
            return work
        }
        guard let plan else { return PushOutcome(.notDelivered, "No app \(bundleID) on \(deviceID).") }
        let total = state.withLock { s in s.devices[deviceID]?.apps[bundleID]?.widgets.filter { kinds == nil || kinds!.contains($0.configuration.kind) }.count ?? 0 }
        if total == 0 {
            return logWidget(deviceID, apnsID, PushOutcome(.noWidgets, "No widgets of \(bundleID) are configured\(kinds.map { " with kind \($0.joined(separator: ", "))" } ?? ""); nothing to reload."))
        }
        // 2. Fetch timelines outside the lock.
        var results: [(Int, Result<WidgetTimeline, SimulatorError>)] = []
        for (index, source) in plan {
            results.append((index, await fetchTimeline(source, now: now)))
        }
        // 3. Store them.
        state.withLock { s in
            guard var app = s.devices[deviceID]?.apps[bundleID] else { return }
            for (i, r) in results where i < app.widgets.count {
                switch r {
                case .success(let t):
                    app.widgets[i].timeline = t
                    app.widgets[i].lastError = nil
                case .failure(let e):
                    app.widgets[i].lastError = e.message
                }
                app.widgets[i].reloadCount += 1
                app.widgets[i].lastReload = now
            }
            s.devices[deviceID]!.apps[bundleID] = app
        }
        let deferred = total - plan.count
        let failures = results.filter { if case .failure = $0.1 { true } else { false } }.count
        if plan.isEmpty {
            let budgets = state.withLock { s in Set(s.devices[deviceID]?.apps[bundleID]?.widgets.map { $0.dailyBudget ?? configuration.widgetDailyReloadBudget } ?? []) }.sorted()
            return logWidget(deviceID, apnsID, PushOutcome(.widgetReloadDeferred, "Deferred: the widgets of \(bundleID) used their \(budgets.map(String.init).joined(separator: "/")) reloads of the last 24 h (WidgetKit: typically 40 to 70 a day for a widget viewed often, fewer otherwise); the reload waits for budget."))
        }
        var sentence = "Reloaded \(plan.count) widget timeline\(plan.count == 1 ? "" : "s") of \(bundleID) (\(reason.rawValue))"
        if deferred > 0 { sentence += "; \(deferred) deferred by the budget" }
        if failures > 0 { sentence += "; \(failures) failed to load" }
        // Allowed, but flagged: entries closer than the minimum spacing (docs/protocol.md, WidgetKit).
        for case (_, .success(let t)) in results {
            if let i = t.entries.indices.dropFirst().first(where: { t.entries[$0].date.timeIntervalSince(t.entries[$0 - 1].date) < configuration.widgetMinimumEntrySpacing }) {
                let gap = Int(saturating: t.entries[i].date.timeIntervalSince(t.entries[i - 1].date))
                sentence += ". Flagged: timeline entries \(i - 1) and \(i) are \(gap) s apart; WidgetKit is not meant to show entries closer than \(Int(configuration.widgetMinimumEntrySpacing / 60)) minutes"
                break
            }
        }
        return logWidget(deviceID, apnsID, PushOutcome(.widgetsReloaded, sentence + "."))
    }

    private func logWidget(_ deviceID: String, _ apnsID: String?, _ o: PushOutcome) -> PushOutcome {
        let now = clock.now
        state.withLock { s in
            s.devices[deviceID]?.events.append(DeviceEvent(time: now, source: apnsID == nil ? .app : .push, apnsID: apnsID, outcome: o, message: o.sentence))
        }
        return o
    }

    /// Fetches timelines without following redirects: the URL was checked to be on this machine,
    /// and a redirect could point anywhere (a 3xx is reported as the answer it is). Lives as long as
    /// the process, as `HTTPClient.shared` does.
    static let timelineClient = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(redirectConfiguration: .disallow))

    func fetchTimeline(_ source: SimulatedWidget.Configuration.Source, now: Date) async -> Result<WidgetTimeline, SimulatorError> {
        switch source {
        case .fixed(let t):
            return .success(t)
        case .provider(let name):
            guard let p = timelineProviders.providers.withLock({ $0[name] }) else { return .failure(SimulatorError(.invalidArgument, "no timeline provider named \(name)")) }
            do { return .success(try await p(now)) } catch { return .failure(SimulatorError(.invalidArgument, "the provider failed: \(error)")) }
        case .url(let url):
            do {
                var request = HTTPClientRequest(url: url)
                request.method = .GET
                let response = try await Self.timelineClient.execute(request, timeout: .seconds(10))
                let body = try await response.body.collect(upTo: 1 << 20)
                guard response.status.code == 200 else { return .failure(SimulatorError(.invalidArgument, "\(url) answered \(response.status.code)")) }
                return .success(try WidgetTimeline(json: try JSONParser.parse(Array(buffer: body))))
            } catch {
                return .failure(SimulatorError(.invalidArgument, "loading \(url) failed: \(error)"))
            }
        }
    }

    /// Runs the reloads that timeline policies and the budget have made due by now.
    public func runDueWidgetReloads() async {
        let now = clock.now
        let due: [(String, String, String, ReloadReason)] = state.withLock { s in
            var out: [(String, String, String, ReloadReason)] = []
            for deviceID in s.deviceOrder {
                for app in s.devices[deviceID]!.apps.values {
                    for w in app.widgets {
                        if w.lastReload == nil, w.addedAt.map({ $0 <= now }) ?? false {
                            out.append((deviceID, app.bundleID, w.configuration.kind, .added))
                            continue
                        }
                        let policyDue = w.timeline?.nextReload.map { $0 <= now && (w.lastReload ?? .distantPast) < $0 } ?? false
                        let budgetDue = w.pendingReload.map { $0 <= now } ?? false
                        if policyDue || budgetDue { out.append((deviceID, app.bundleID, w.configuration.kind, .policy)) }
                    }
                }
            }
            return out
        }
        for (deviceID, bundleID, kind, reason) in due {
            await reloadWidgets(deviceID: deviceID, bundleID: bundleID, kinds: [kind], reason: reason)
        }
    }
}
