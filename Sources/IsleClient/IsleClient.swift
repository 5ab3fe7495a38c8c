public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// The app side of Isle: hands the server every activity's push token (and each rotation), the
/// push-to-start tokens, the widget push token, the person's Live Activity settings, and what the
/// person did (dismissed, ended) — and keeps doing it across a flaky network, the app's suspension
/// and relaunches (docs/client.md).
///
/// ```swift
/// let isle = try IsleClient(serverURL: url, deviceKey: "isle_device_…") { request in
///     try await backend.registrationTicket(for: request.externalKey)    // your backend signs it
/// }
/// Task { await isle.run() }
/// await isle.track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber }
/// ```
///
/// Every report goes into a persisted outbox first and is sent in order per activity, each with
/// its own `Idempotency-Key`, retried with backoff until the server has it; a newer token report
/// replaces one not yet sent.
public actor IsleClient {
    public struct Configuration: Sendable {
        public var serverURL: URL
        public var deviceKey: String
        /// Backoff after a failed send: doubles from `firstRetry` up to `maximumRetry` (or the
        /// server's `Retry-After`).
        public var firstRetry: TimeInterval = 1
        public var maximumRetry: TimeInterval = 60
        public var requestTimeout: TimeInterval = 30
        /// The APNs environment of this build's tokens, reported with the installation and every
        /// activity. Read from the build (``Environment/ofRunningBuild(bundle:)``) unless given;
        /// nil leaves it to the server's default.
        public var environment: Environment?
        /// Fetches your backend's registration ticket for an activity's external key, when its
        /// registration is about to be sent (and again if the server finds it expired). Nil, or a
        /// nil answer: the activity is registered without a ticket (docs/security.md).
        public var ticket: (@Sendable (TicketRequest) async throws -> String?)?
        /// Called after every request the client makes (a debug log, a test's eyes). Never given
        /// the installation secret or a whole token.
        public var log: (@Sendable (LogEntry) -> Void)?
        /// Foreground entries and background time: UIKit's on iOS, none elsewhere.
        public var lifecycle: (any AppLifecycle)?
        /// Reports due within this many seconds keep a background task open (after that, the
        /// next launch or wake sends them).
        public var backgroundWindow: TimeInterval = 10
        /// The installation (and every live activity's registration) is sent again when the server
        /// last took it this long ago, even if nothing changed: a server that pruned it, or was
        /// restored from an older backup, has it back within a day of use (docs/client.md).
        public var installationRefresh: TimeInterval = 24 * 3600
        /// One live activity per `externalKey` (and attributes type) on this device: when a new
        /// one appears with the key of one already tracked (the app started a second for the same
        /// order, or the backend push-started one), the older is ended at once, on the phone and on
        /// the server, so the person sees one and the backend's by-key pushes reach that one.
        /// Off: both stay, and by-key pushes reach both (docs/client.md, "One activity per key").
        public var collapseActivitiesPerKey: Bool = true
        /// Reports the app cannot finish in its background time go to the system to send
        /// (``URLSessionBackgroundTransport`` on Apple platforms); nil: the next launch sends them.
        public var backgroundTransport: (any BackgroundTransport)?
        /// The clock for the refresh above; a test's own.
        public var now: @Sendable () -> Date = { Date() }
        /// What the system offers, reported with the installation (the server starts an activity
        /// on a topic's broadcast channel only where the system has them): the running system's.
        public var capabilities: Capabilities = .current

        /// App only: IsleClient runs in the app, which owns the outbox; an app extension (a widget's)
        /// never sends, it leaves its token in ``WidgetTokenMailbox`` (docs/client.md, "Widget push token").
        @available(iOSApplicationExtension, unavailable)
        @available(macCatalystApplicationExtension, unavailable)
        @available(visionOSApplicationExtension, unavailable)
        public init(serverURL: URL, deviceKey: String, environment: Environment? = Environment.ofRunningBuild(),
                    ticket: (@Sendable (TicketRequest) async throws -> String?)? = nil, log: (@Sendable (LogEntry) -> Void)? = nil,
                    lifecycle: (any AppLifecycle)? = IsleClient.systemLifecycle()) {
            self.serverURL = serverURL
            self.deviceKey = deviceKey
            self.environment = environment
            self.ticket = ticket
            self.log = log
            self.lifecycle = lifecycle
        }
    }

    /// One request the client made, and how it ended.
    public struct LogEntry: Sendable, Hashable, CustomStringConvertible {
        /// What the report was: `installation`, `register`, `token`, `dismissed`, `ended`, `delete`, `ticket`.
        public var report: String
        public var method: String
        public var path: String
        /// The server's status; nil when no answer came (network, server away).
        public var status: Int?
        /// `sent`, `retrying`, `refused`, `new installation`, `installation unknown` (registered
        /// again), `activity unknown` (registered again, or nothing left to report), `handed to the system`.
        public var outcome: String
        public var description: String { "\(report): \(method) \(path) → \(status.map(String.init) ?? "no answer") (\(outcome))" }
    }

    public let configuration: Configuration
    let storage: any IsleClientStorage
    let session: URLSession
    var state: ClientState
    var flushing = false
    /// After ``stop()`` nothing is added, sent or saved.
    var stopped = false
    var running = false
    /// The run loop's wait: resumed by a new report, a due retry or ``stop()``.
    var waiter: CheckedContinuation<Void, Never>?
    var wakePending = false
    /// Tasks observing one activity, by ActivityKit's id: one tracking per activity.
    var trackedActivities: [String: [Task<Void, Never>]] = [:]
    /// The handles of tracked activities, to end an older one of the same key.
    var trackedHandles: [String: any LiveActivityHandle] = [:]
    /// Activities the app untracked: not followed again through their attributes type.
    var untracked: Set<String> = []
    /// Re-reads of each tracked attributes type (and the widget token), run at every foreground entry.
    var trackedKits: [String: KitTracking] = [:]
    var widgetSource: (any WidgetPushTokenSource)?
    /// The lifecycle's foreground entries, subscribed at `init` and consumed by ``run()``.
    let foregroundEntries: AsyncStream<Void>?
    var lifecycleTask: Task<Void, Never>?
    /// The background transport's answers, applied as they come.
    var answersTask: Task<Void, Never>?
    var background: BackgroundTaskID?
    var backgroundBusy = false
    var backgroundRecheck = false
    /// The system ended our background time: no new request until the app is in the foreground.
    var backgroundExpired = false
    var statusWatchers: [String: [UUID: AsyncStream<RegistrationStatus>.Continuation]] = [:]

    struct KitTracking {
        var tasks: [Task<Void, Never>]
        var refresh: @Sendable () async -> Void
    }

    /// The shared client of an app: its state in the Keychain on Apple platforms (a file in the
    /// caches directory elsewhere), the environment read from the build, UIKit's lifecycle on iOS.
    /// A trailing closure is the ticket provider (`ticket` comes before `log` for that reason).
    @available(iOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    public init(serverURL: URL, deviceKey: String, environment: Environment? = Environment.ofRunningBuild(), storage: (any IsleClientStorage)? = nil,
                ticket: (@Sendable (TicketRequest) async throws -> String?)? = nil, log: (@Sendable (LogEntry) -> Void)? = nil) throws {
        try self.init(configuration: Configuration(serverURL: serverURL, deviceKey: deviceKey, environment: environment, ticket: ticket, log: log),
                      storage: storage ?? Self.defaultStorage())
    }

    /// Where the state lives when the app does not choose: the Keychain on Apple platforms,
    /// `isle-client.json` in the user's caches directory elsewhere.
    public static func defaultStorage() -> any IsleClientStorage {
        #if canImport(Security) && (os(iOS) || os(macOS) || os(watchOS) || os(tvOS) || os(visionOS))
        return KeychainStorage()
        #else
        let directory = FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask).first ?? URL(fileURLWithPath: NSTemporaryDirectory())
        return FileStorage(path: directory.appendingPathComponent("isle-client.json").path)
        #endif
    }

    /// The system's app lifecycle: UIKit's on iOS and Mac Catalyst, none elsewhere. App only, as
    /// ``UIKitLifecycle`` is.
    @available(iOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    public static func systemLifecycle() -> (any AppLifecycle)? {
        #if canImport(UIKit) && (os(iOS) || os(visionOS))
        return UIKitLifecycle()
        #else
        return nil
        #endif
    }

    /// Loads what an earlier launch kept (a new installation id the first time).
    public init(configuration: Configuration, storage: any IsleClientStorage, session: URLSession = .shared) throws {
        self.configuration = configuration
        self.storage = storage
        self.session = session
        foregroundEntries = configuration.lifecycle?.foregroundEntries()
        if let data = try storage.load() {
            state = try JSONDecoder().decode(ClientState.self, from: data)
        } else {
            state = ClientState(installationID: UUID().uuidString.lowercased())
        }
    }

    public var installationID: String { state.installationID }
    /// Whether the server has this installation (it answered its secret).
    public var isInstallationRegistered: Bool { state.secret != nil }
    /// Reports waiting to be sent.
    public var pendingReports: Int { state.outbox.count }
    /// Reports the server refused for good, with its reason.
    public var refusedReports: [String] { state.refused }
    /// The server's id for an activity, once its registration went through.
    public func serverID(of activityID: String) -> String? { state.serverIDs[activityID] }
    /// Whether the SDK is following this activity (``track(activity:topics:externalKey:ticket:)``).
    public func isTracking(activityID: String) -> Bool { trackedActivities[activityID] != nil }

    // MARK: Registration status

    /// Where the activity's registration stands now.
    public func registrationStatus(of activityID: String) -> RegistrationStatus {
        if let id = state.serverIDs[activityID] { return .registered(serverID: id) }
        if let refusal = state.refusals[activityID] { return .refused(refusal) }
        if state.registered.contains(activityID) { return .pending }
        return .unknown
    }

    /// The registration's status now, then each change (ends when the client stops).
    public func registrationUpdates(of activityID: String) -> AsyncStream<RegistrationStatus> {
        let (stream, continuation) = AsyncStream.makeStream(of: RegistrationStatus.self, bufferingPolicy: .bufferingNewest(8))
        continuation.yield(registrationStatus(of: activityID))
        if stopped {
            continuation.finish()
            return stream
        }
        let key = UUID()
        statusWatchers[activityID, default: [:]][key] = continuation
        continuation.onTermination = { [weak self] _ in Task { await self?.unwatch(activityID, key) } }
        return stream
    }

    func unwatch(_ activityID: String, _ key: UUID) {
        statusWatchers[activityID]?[key] = nil
        if statusWatchers[activityID]?.isEmpty == true { statusWatchers[activityID] = nil }
    }

    /// Waits until the activity is registered or refused: `if case .refused(let why) = await
    /// isle.registration(of: activity.id) { … }`. An activity whose token has not come yet (or that
    /// ActivityKit has not listed yet) is waited for; cancel the waiting task, or ``stop()`` the
    /// client, to give up (the status at that moment is answered).
    public func registration(of activityID: String) async -> RegistrationStatus {
        for await status in registrationUpdates(of: activityID) {
            switch status {
            case .pending, .unknown: continue
            default: return status
            }
        }
        return registrationStatus(of: activityID)
    }

    func publishStatus(_ activityID: String) {
        guard let watchers = statusWatchers[activityID] else { return }
        let status = registrationStatus(of: activityID)
        for c in watchers.values { c.yield(status) }
    }

    // MARK: What the app reports

    /// The installation: push-to-start tokens (by attributes type), the widget push token, the
    /// control push token (iOS 18: the token your `ControlPushHandler` gets in
    /// `pushTokensDidChange(controls:)`, `ControlInfo.pushInfo?.token`), the person's settings.
    /// Only what is given changes.
    public func reportInstallation(pushToStartToken: (type: String, token: Data)? = nil, widgetToken: Data? = nil, controlsToken: Data? = nil,
                                   liveActivitiesEnabled: Bool? = nil, frequentPushesEnabled: Bool? = nil) async {
        noteInstallation(pushToStartToken: pushToStartToken, widgetToken: widgetToken, controlsToken: controlsToken, liveActivitiesEnabled: liveActivitiesEnabled,
                         frequentPushesEnabled: frequentPushesEnabled)
        await holdBackgroundTime()
    }

    func noteInstallation(pushToStartToken: (type: String, token: Data)? = nil, widgetToken: Data? = nil, controlsToken: Data? = nil, liveActivitiesEnabled: Bool? = nil,
                          frequentPushesEnabled: Bool? = nil) {
        let before = (state.pushToStartTokens, state.widgetToken, state.liveActivitiesEnabled, state.frequentPushesEnabled, state.environment, state.controlsToken)
        if let (type, token) = pushToStartToken { state.pushToStartTokens[type] = token.hex }
        if let widgetToken { state.widgetToken = widgetToken.hex }
        if let controlsToken { state.controlsToken = controlsToken.hex }
        if let liveActivitiesEnabled { state.liveActivitiesEnabled = liveActivitiesEnabled }
        if let frequentPushesEnabled { state.frequentPushesEnabled = frequentPushesEnabled }
        state.environment = configuration.environment?.rawValue
        // Every launch reports what it reads; the server hears only what changed (or everything,
        // until the installation is registered).
        let unchanged = before.0 == state.pushToStartTokens && before.1 == state.widgetToken && before.2 == state.liveActivitiesEnabled
            && before.3 == state.frequentPushesEnabled && before.4 == state.environment && before.5 == state.controlsToken
        let due = state.installationSentAt.map { configuration.now().timeIntervalSince($0) >= configuration.installationRefresh } ?? true
        if unchanged, state.secret != nil, !due { return }
        // A day (by default) since the server last took it: send it again, and every live
        // activity's registration after it (the server may have lost them; it answers the ones it has).
        if due, state.secret != nil { state.resyncPending = true }
        add(.installation, lane: ClientState.installationLane)
    }

    /// The topics this installation follows for starts (a favourite team, a line): the backend's
    /// `POST /v1/topics/{topic}/start` starts an activity on every installation following the
    /// topic, on the topic's broadcast channel on iOS 18 and later (docs/client.md, "Following a
    /// topic"). Replaces the list the server has; at most 32.
    public func followForStarts(topics: [String]) async {
        let unique = topics.reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }
        guard state.startTopics != unique else { return }
        state.startTopics = unique
        add(.installation, lane: ClientState.installationLane)
        await holdBackgroundTime()
    }

    /// The backend's user ticket for this installation (a registration ticket with a `user` claim,
    /// docs/security.md): the server binds the installation to that user, so the backend can
    /// push-to-start to the user's devices. Sent with the installation until the server took it.
    public func reportUser(ticket: String) async {
        state.userTicket = ticket
        add(.installation, lane: ClientState.installationLane)
        await holdBackgroundTime()
    }

    /// An activity's push token: the first registers the activity, later ones are rotations.
    ///
    /// `externalKey` binds the activity to your backend's key (an order id) only with a ticket:
    /// `ticket` here, or what ``Configuration/ticket`` fetches when the registration is sent
    /// (docs/security.md) — the device key is public, so the server never takes a key on the app's
    /// word. Without a ticket, a key only links an activity your backend started by push-to-start
    /// on this installation; any other activity is registered by its id alone
    /// (``serverID(of:)``: hand it to your backend).
    public func reportToken(activityID: String, attributesType: String, token: Data, externalKey: String?, ticket: String? = nil, topics: [String] = []) async {
        noteToken(activityID: activityID, attributesType: attributesType, token: token, externalKey: externalKey, ticket: ticket, topics: topics)
        await holdBackgroundTime()
    }

    func noteToken(activityID: String, attributesType: String, token: Data, externalKey: String?, ticket: String?, topics: [String]) {
        guard state.lastTokens[activityID] != token.hex, state.refusals[activityID] == nil else { return }
        state.lastTokens[activityID] = token.hex
        if state.registered.insert(activityID).inserted {
            state.types[activityID] = attributesType
            state.registrations[activityID] = ClientState.Registration(attributesType: attributesType, externalKey: externalKey, topics: topics, channelID: nil)
            if let ticket { state.tickets[activityID] = ticket }
            add(.register(local: activityID, attributesType: attributesType, token: token.hex, externalKey: externalKey, topics: topics), lane: ClientState.lane(activityID))
            publishStatus(activityID)
        } else {
            add(.token(local: activityID, token: token.hex), lane: ClientState.lane(activityID))
        }
    }

    /// An activity on a broadcast channel (iOS 18, `pushType: .channel(id)`): it never has a
    /// token, so it is registered with its channel for the server's record (the backend's
    /// broadcasts reach it through the channel, and its end and dismissal are still reported).
    public func reportChannelActivity(activityID: String, attributesType: String, channelID: String, externalKey: String?, ticket: String? = nil, topics: [String] = []) async {
        noteChannelActivity(activityID: activityID, attributesType: attributesType, channelID: channelID, externalKey: externalKey, ticket: ticket, topics: topics)
        await holdBackgroundTime()
    }

    func noteChannelActivity(activityID: String, attributesType: String, channelID: String, externalKey: String?, ticket: String?, topics: [String]) {
        guard state.refusals[activityID] == nil, state.registered.insert(activityID).inserted else { return }
        state.types[activityID] = attributesType
        state.registrations[activityID] = ClientState.Registration(attributesType: attributesType, externalKey: externalKey, topics: topics, channelID: channelID)
        if let ticket { state.tickets[activityID] = ticket }
        add(.registerChannel(local: activityID, attributesType: attributesType, channelID: channelID, externalKey: externalKey, topics: topics), lane: ClientState.lane(activityID))
        publishStatus(activityID)
    }

    /// The person dismissed the activity (`dismissed`), or it ended (`ended`).
    public func reportState(activityID: String, _ s: LiveActivityState) async {
        noteState(activityID: activityID, s)
        await holdBackgroundTime()
    }

    func noteState(activityID: String, _ s: LiveActivityState) {
        guard s == .dismissed || s == .ended, state.registered.contains(activityID) else { return }
        let report = s == .dismissed ? "dismissed" : "ended"
        // Once dismissed, nothing more; an end is not reported again after a relaunch.
        guard state.reportedStates[activityID] != "dismissed", state.reportedStates[activityID] != report else { return }
        state.reportedStates[activityID] = report
        if s == .dismissed { state.types[activityID] = nil }
        add(.state(local: activityID, report: report), lane: ClientState.lane(activityID))
    }

    func add(_ kind: Report.Kind, lane: String) {
        guard !stopped else { return }
        state.add(Report(key: UUID().uuidString.lowercased(), lane: lane, kind: kind))
        persist()
        wake()
    }

    func persist() {
        guard !stopped else { return }
        // A failed save loses nothing in memory; the next change saves again.
        if let data = try? JSONEncoder().encode(state) { try? storage.save(data) }
    }

    // MARK: Observing ActivityKit

    /// Keeps the server in step with one attributes type: the activities that exist now, their
    /// current tokens and states first (nothing that happened while the app was not running is
    /// missed), then every token, state and activity as it comes; the push-to-start token and the
    /// settings too, all read again each time the app comes to the foreground. Tracking a type
    /// that is already tracked changes nothing.
    ///
    /// `externalKey` names an activity for the backend: a push-started one is matched by it; any
    /// other is bound to it only with a ticket (`ticket`, or ``Configuration/ticket``).
    /// `channelID` names the broadcast channel of an activity started with one.
    public func track<Kit: LiveActivityKit>(_ kit: Kit, topics: @escaping @Sendable (Kit.Handle) -> [String] = { _ in [] },
                                            externalKey: @escaping @Sendable (Kit.Handle) -> String?,
                                            ticket: @escaping @Sendable (Kit.Handle) -> String? = { _ in nil },
                                            channelID: @escaping @Sendable (Kit.Handle) -> String? = { _ in nil }) async {
        guard !stopped, trackedKits[kit.attributesType] == nil else { return }
        let observer = ActivityObserver(topics: topics, externalKey: externalKey, ticket: ticket, channelID: channelID)
        trackedKits[kit.attributesType] = KitTracking(tasks: [], refresh: { [weak self] in await self?.resync(kit, observer) })
        resync(kit, observer)
        var tasks: [Task<Void, Never>] = []
        tasks.append(Task { [weak self] in
            for await a in kit.activityUpdates { await self?.observe(a, observer) }
        })
        tasks.append(Task { [weak self] in
            for await token in kit.pushToStartTokenUpdates { await self?.reportInstallation(pushToStartToken: (kit.attributesType, token)) }
        })
        tasks.append(Task { [weak self] in
            for await on in kit.activityEnablementUpdates { await self?.reportInstallation(liveActivitiesEnabled: on) }
        })
        tasks.append(Task { [weak self] in
            for await on in kit.frequentPushEnablementUpdates { await self?.reportInstallation(frequentPushesEnabled: on) }
        })
        trackedKits[kit.attributesType]?.tasks = tasks
        await holdBackgroundTime()
    }

    /// Tracks a kit whose handles carry their own names.
    func track<Kit: LiveActivityKit>(selfNamed kit: Kit) async where Kit.Handle: SelfNamedHandle {
        await track(kit, topics: { $0.topics }, externalKey: { $0.externalKey }, ticket: { $0.ticket })
    }

    /// Reads everything of one attributes type as it is now and reports what changed: at
    /// tracking, and each time the app comes to the foreground.
    func resync<Kit: LiveActivityKit>(_ kit: Kit, _ observer: ActivityObserver<Kit.Handle>) {
        guard !stopped, trackedKits[kit.attributesType] != nil else { return }
        let type = kit.attributesType
        noteInstallation(liveActivitiesEnabled: kit.areActivitiesEnabled, frequentPushesEnabled: kit.frequentPushesEnabled)
        if let token = kit.pushToStartToken { noteInstallation(pushToStartToken: (type, token)) }
        var seen = Set<String>()
        for a in kit.activities {
            seen.insert(a.id)
            observe(a, observer)
        }
        // Registered earlier, and no longer listed: the person or the system dismissed it while
        // the app was not running (ActivityKit lists no dismissed activity).
        for (local, t) in state.types where t == type && !seen.contains(local) {
            noteState(activityID: local, .dismissed)
        }
    }

    /// Keeps the server in step with one activity (its token, rotations, dismissal, end), for an
    /// app that tracks activities one by one rather than a whole attributes type. Reads its token
    /// and state at once (an activity that ended while the app was closed is reported); tracking
    /// an activity twice is one tracking.
    public func track<H: LiveActivityHandle>(activity: H, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        untracked.remove(activity.id)
        observe(activity, ActivityObserver(topics: { _ in topics }, externalKey: { _ in externalKey }, ticket: { _ in ticket }, channelID: { _ in nil }))
        await holdBackgroundTime()
    }

    /// One activity started on a broadcast channel (iOS 18): registered with its channel.
    public func track<H: LiveActivityHandle>(activity: H, channelID: String, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        untracked.remove(activity.id)
        observe(activity, ActivityObserver(topics: { _ in topics }, externalKey: { _ in externalKey }, ticket: { _ in ticket }, channelID: { _ in channelID }))
        await holdBackgroundTime()
    }

    /// Stops following one activity (nothing is reported for it afterwards; the server keeps its record).
    public func untrack(activityID: String) {
        untracked.insert(activityID)
        for t in trackedActivities.removeValue(forKey: activityID) ?? [] { t.cancel() }
        trackedHandles[activityID] = nil
    }

    /// Stops following an attributes type: its activities, push-to-start token and settings.
    public func untrack(attributesType: String) {
        for t in trackedKits.removeValue(forKey: attributesType)?.tasks ?? [] { t.cancel() }
        for (local, type) in state.types where type == attributesType { untrack(activityID: local) }
    }

    /// The widget push token (iOS 26): read now and at each foreground entry; ``WidgetKitPushTokens``
    /// on iOS.
    public func trackWidgetPushToken(_ source: any WidgetPushTokenSource) async {
        widgetSource = source
        if let token = await source.currentToken() { noteInstallation(widgetToken: token) }
        await holdBackgroundTime()
    }

    struct ActivityObserver<H: LiveActivityHandle>: Sendable {
        var topics: @Sendable (H) -> [String]
        var externalKey: @Sendable (H) -> String?
        var ticket: @Sendable (H) -> String?
        var channelID: @Sendable (H) -> String?
    }

    func observe<H: LiveActivityHandle>(_ a: H, _ o: ActivityObserver<H>) {
        guard !stopped, !untracked.contains(a.id) else { return }
        if trackedActivities[a.id] != nil {
            // Already followed: only catch up on what its streams may have missed.
            catchUp(a, o)
            return
        }
        let seenBefore = state.registrations[a.id] != nil
        trackedActivities[a.id] = []
        trackedHandles[a.id] = a
        catchUp(a, o)
        if !seenBefore, configuration.collapseActivitiesPerKey, let key = o.externalKey(a), a.activityState.isLive {
            collapse(olderThan: a.id, key: key, attributesType: a.attributesType)
        }
        trackedActivities[a.id] = [
            Task { [weak self] in
                for await token in a.pushTokenUpdates {
                    await self?.reportToken(activityID: a.id, attributesType: a.attributesType, token: token, externalKey: o.externalKey(a), ticket: o.ticket(a), topics: o.topics(a))
                }
            },
            Task { [weak self] in
                for await s in a.activityStateUpdates { await self?.reportState(activityID: a.id, s) }
            },
        ]
    }

    /// Ends every other live tracked activity of the key (the newest one stays): on the server (its
    /// by-key pushes then reach the newest alone) and on the phone, dismissed at once.
    func collapse(olderThan id: String, key: String, attributesType: String) {
        for (other, handle) in trackedHandles where other != id {
            guard let r = state.registrations[other], r.externalKey == key, r.attributesType == attributesType,
                  state.reportedStates[other] == nil, handle.activityState.isLive else { continue }
            configuration.log?(LogEntry(report: "ended", method: "-", path: other, status: nil, outcome: "collapsed: \(id) has the same key"))
            noteState(activityID: other, .ended)
            Task { await handle.end(dismissImmediately: true) }
        }
    }

    /// The activity's token (or channel) and state as they are now.
    func catchUp<H: LiveActivityHandle>(_ a: H, _ o: ActivityObserver<H>) {
        if let channel = o.channelID(a) {
            noteChannelActivity(activityID: a.id, attributesType: a.attributesType, channelID: channel, externalKey: o.externalKey(a), ticket: o.ticket(a), topics: o.topics(a))
        } else if let token = a.pushToken {
            noteToken(activityID: a.id, attributesType: a.attributesType, token: token, externalKey: o.externalKey(a), ticket: o.ticket(a), topics: o.topics(a))
        }
        noteState(activityID: a.id, a.activityState)
    }

    /// Reads every tracked attributes type, activity and the widget token again and reports what
    /// changed. Called when the app comes to the foreground (automatically with a ``Configuration/lifecycle``);
    /// ActivityKit's update sequences do not always deliver while the app is suspended.
    public func refresh() async {
        backgroundExpired = false
        noteInstallation()
        for kit in trackedKits.values { await kit.refresh() }
        if let widgetSource, let token = await widgetSource.currentToken() { noteInstallation(widgetToken: token) }
        await holdBackgroundTime()
    }

    // MARK: Ending

    /// Stops observing and sending.
    public func stop() {
        stopped = true
        for t in trackedActivities.values.flatMap({ $0 }) { t.cancel() }
        for t in trackedKits.values.flatMap(\.tasks) { t.cancel() }
        trackedActivities.removeAll()
        trackedKits.removeAll()
        lifecycleTask?.cancel()
        answersTask?.cancel()
        for watchers in statusWatchers.values { for c in watchers.values { c.finish() } }
        statusWatchers.removeAll()
        wake()
        if let id = background, let lifecycle = configuration.lifecycle {
            background = nil
            Task { await lifecycle.endBackgroundTask(id) }
        }
    }

    /// Deletes this installation from the server (sign-out, or the person asked to be
    /// forgotten): its tokens and user go, its activities are ended there. Then the SDK forgets
    /// everything it kept and stops following activities; the next report registers a new
    /// installation. Throws, changing nothing, when the server could not be told.
    public func deleteInstallation() async throws(DeletionError) {
        if let secret = state.secret {
            let path = "/v1/installations/\(state.installationID)"
            guard let url = URL(string: configuration.serverURL.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + path) else {
                throw DeletionError(reason: "the server URL cannot take \(path)")
            }
            var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
            request.httpMethod = "DELETE"
            request.setValue("Bearer \(configuration.deviceKey)", forHTTPHeaderField: "Authorization")
            request.setValue(secret, forHTTPHeaderField: "Isle-Installation-Secret")
            let status: Int
            do {
                let (_, response) = try await transfer(request)
                status = (response as? HTTPURLResponse)?.statusCode ?? 0
            } catch {
                log("delete", "DELETE", path, nil, "retrying")
                throw DeletionError(reason: "no answer from the server (\(type(of: error)))")
            }
            // 403/404: the server no longer knows this installation under this secret; nothing left to delete.
            guard (200..<300).contains(status) || status == 403 || status == 404 else {
                log("delete", "DELETE", path, status, "retrying")
                throw DeletionError(reason: "the server answered \(status)")
            }
            log("delete", "DELETE", path, status, "sent")
        }
        for t in trackedActivities.values.flatMap({ $0 }) { t.cancel() }
        for t in trackedKits.values.flatMap(\.tasks) { t.cancel() }
        trackedActivities.removeAll()
        trackedKits.removeAll()
        let watched = Array(statusWatchers.keys)
        state = ClientState(installationID: UUID().uuidString.lowercased())
        persist()
        for id in watched { publishStatus(id) }
        await holdBackgroundTime()
    }

    func log(_ report: String, _ method: String, _ path: String, _ status: Int?, _ outcome: String) {
        configuration.log?(LogEntry(report: report, method: method, path: path, status: status, outcome: outcome))
    }
}
