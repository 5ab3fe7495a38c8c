public import Foundation
public import IsleCore
import Synchronization

/// A simulated iPhone.
public struct SimulatedDevice: Sendable, Hashable, Codable {
    public var id: String
    public var name: String
    /// The iOS version ("26.0", "17.2", …): push-to-start needs 17.2, channels and `input-push-*`
    /// 18, widget pushes 26 (docs/protocol.md §6, §7, §9.1).
    public var osVersion: String
    public var model: String
    /// Without one, an alerting update shows the Lock Screen presentation as a banner (§10.7).
    public var hasDynamicIsland: Bool
    /// An offline device receives nothing; APNs stores what it may (``StoredPush``).
    public var isOnline: Bool
    /// Where else the person sees the iPhone's Live Activities (Apple, "Creating custom views for
    /// Live Activities"): a paired Apple Watch's Smart Stack (iOS 18+), CarPlay while connected
    /// (iOS 26+), a paired Mac's menu bar (iOS 26+). None on an iPad.
    public var pairedWatch = false
    public var carPlayConnected = false
    public var pairedMac = false
    /// The device is locked: a transient activity cannot outlive locking.
    public var isLocked = false

    /// "iPad" for an iPad model, else "iPhone".
    public var family: String { model.hasPrefix("iPad") ? "iPad" : "iPhone" }

    /// Why a device of `model` cannot have these surroundings: an iPad pairs with no Apple Watch and
    /// drives no CarPlay (those show an iPhone's Live Activities). Nil: it can.
    public static func surroundingsProblem(model: String, pairedWatch: Bool?, carPlay: Bool?) -> SimulatorError? {
        guard model.hasPrefix("iPad"), pairedWatch == true || carPlay == true else { return nil }
        return SimulatorError(.invalidArgument, "an iPad pairs with no Apple Watch and drives no CarPlay; those show an iPhone's Live Activities", field: pairedWatch == true ? "pairedWatch" : "carPlay")
    }
    public var apps: [String: SimulatedApp]
    /// Activities in the order they started.
    public var activities: [SimulatedActivity]
    public var events: [DeviceEvent]
    /// What APNs holds for the device while it is offline.
    public var storedPushes: [StoredPush]

    /// Whether the device runs at least `major.minor`.
    public func runs(atLeast major: Int, _ minor: Int = 0) -> Bool {
        let parts = osVersion.split(separator: ".").map { Int($0) ?? 0 }
        let (ma, mi) = (parts.first ?? 0, parts.count > 1 ? parts[1] : 0)
        return ma > major || (ma == major && mi >= minor)
    }

    /// Models without a Dynamic Island (the rest, iPhone 14 Pro and later, have one).
    public static let modelsWithoutDynamicIsland: Set<String> = [
        "iPhone SE (2nd generation)", "iPhone SE (3rd generation)", "iPhone 11", "iPhone 11 Pro", "iPhone 12", "iPhone 12 mini", "iPhone 12 Pro",
        "iPhone 13", "iPhone 13 mini", "iPhone 13 Pro", "iPhone 14", "iPhone 14 Plus", "iPhone 16e",
    ]
}

/// A push APNs keeps for an offline device (docs/protocol.md §2 `apns-expiration`, §7.2 storage
/// policy, §11): one per app and activity (per token; per channel and activity for broadcasts),
/// the newest replacing the older one.
public struct StoredPush: Sendable, Hashable, Codable {
    /// The device token it was sent to, or nil for a broadcast.
    public var token: String?
    public var channelID: String?
    public var activityID: String?
    public var pushType: String
    public var topic: String
    public var priority: Int
    public var payload: JSONValue
    public var apnsID: String
    public var collapseID: String?
    public var receivedAt: Date
    public var expiresAt: Date
}

/// A push APNs holds a moment before it reaches an online device (reordering).
struct HeldPush: Sendable, Hashable {
    var token: String
    var topic: String
    var expiration: Int64?
    var collapseID: String?
    var receivedAt: Date
    var pushType: String
    var payload: JSONValue
    var priority: Int
    var apnsID: String
    var due: Date
}

/// Who a token belongs to.
struct TokenOwner: Sendable, Hashable {
    /// `retired`: rotated away or otherwise no longer valid, since that time (answers 410).
    /// `control(kind)`: the push token of one of the app's controls.
    enum Kind: Sendable, Hashable {
        case activity(String), pushToStart(String), widgets, control(String), retired(Date)
        var isControl: Bool { if case .control = self { true } else { false } }
    }
    var deviceID: String
    var bundleID: String
    var kind: Kind
    var environment: SimulatedEnvironment
}

/// What the Lock Screen and Dynamic Island show, and the other places the same activities appear.
public struct ScreenState: Sendable, Hashable, Codable {
    /// A Live Activity shown beyond the device's own screen (Apple, "Creating custom views for Live
    /// Activities"): the same activity, re-rendered there after every push.
    public struct Presentation: Sendable, Hashable, Codable {
        public enum Surface: String, Sendable, Hashable, Codable { case watchSmartStack, carPlay, macMenuBar }
        public var surface: Surface
        public var activityID: String
        /// `small` (the app declares `.small` in `supplementalActivityFamilies`), else `compact`;
        /// on the Mac the Dynamic Island's own `compact`, `minimal` or `expanded`.
        public var layout: String
        public var contentState: JSONValue
        /// An alerting update shows there too (on the Watch as an alert with its title and body).
        public var alert: ShownAlert?
    }
    public struct Item: Sendable, Hashable, Codable {
        public var activityID: String
        public var bundleID: String
        public var attributesType: String
        public var state: SimulatedActivityState
        public var isStale: Bool
        public var relevanceScore: Double
        public var attributes: JSONValue
        public var contentState: JSONValue
        public var staleDate: Date?
        public var lastAlert: ShownAlert?
    }
    public enum IslandMode: String, Sendable, Hashable, Codable { case none, compact, minimal, expanded }
    public var time: Date
    public var lockScreen: [Item]
    public var dynamicIsland: IslandMode
    /// Activity ids shown in the Dynamic Island: one for compact/expanded; attached then detached for minimal.
    public var islandActivities: [String]
    /// On a device without a Dynamic Island, an alerting update shows as a banner for a moment.
    public var banner: Banner?
    public var widgets: [WidgetView]
    /// "iPhone" or "iPad".
    public var family: String = "iPhone"
    /// The Watch's Smart Stack, CarPlay and the Mac's menu bar, where paired and supported.
    public var presentations: [Presentation] = []
    /// Ongoing transient activities (iOS 18): never on the Lock Screen, shown in the expanded island.
    public var transientActivities: [Item] = []

    public struct Banner: Sendable, Hashable, Codable {
        public var activityID: String
        public var alert: ShownAlert
    }
}

public struct SimulatorError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable, Codable {
        case notFound, invalidArgument, conflict
        // ActivityAuthorizationError cases (docs/protocol.md §10.5)
        case denied, targetMaximumExceeded, globalMaximumExceeded, attributesTooLarge, unsupported, visibility
    }
    public var code: Code
    public var message: String
    public var field: String?
    public init(_ code: Code, _ message: String, field: String? = nil) {
        self.code = code
        self.message = message
        self.field = field
    }
    public var description: String { message }
}

/// All simulated devices, their tokens and the channels of the fake APNs, behind one lock.
public final class SimulatorWorld: Sendable {
    public let clock: any WallClock
    public let configuration: SimulatorConfiguration
    /// The environment the fake APNs serves; tokens of the other one answer BadDeviceToken.
    public let environment: SimulatedEnvironment
    let state: Mutex<State>
    let timelineProviders = ProviderRegistry()
    /// The apps' own `ContentState` decoders (``SimulatedActivityKit``), by bundle id and attributes type.
    let contentDecoders = Mutex<[String: @Sendable (JSONValue) -> String?]>([:])
    /// Notified after every change; the ActivityKit-shaped API follows it.
    public let changes = ChangeFeed()
    var engine: ActivityEngine { ActivityEngine(configuration: configuration) }

    struct State {
        var devices: [String: SimulatedDevice] = [:]
        /// Each activity's place in its device's list (activities are only ever appended), so a
        /// push finds its activity without a scan.
        var activityIndex: [String: Int] = [:]
        /// Recent pushes per device token (for APNs' 429 `TooManyRequests`).
        var tokenHits: [String: [Date]] = [:]
        var deviceOrder: [String] = []
        var tokens: [String: TokenOwner] = [:]
        /// bundle id → channel id → storage policy
        var channels: [String: [String: Int]] = [:]
        var channelsDisabled: Set<String> = []
        var nextID = 0
        /// Draws the model's random choices (priority-5 delays), seeded.
        var random: SeededRandom
        /// When each app started activities by push on each device ("device\u{1}bundle id"), within
        /// the push-to-start window (``SimulatorConfiguration/pushToStartLimit``).
        var pushStarts: [String: [Date]] = [:]
        /// Devices with activities waiting for their push token.
        var tokensDue: Set<String> = []
        /// Devices holding priority-5 pushes to apply later, with the earliest time one may be
        /// due: the ticker applies them then, so a page watching the phone sees them land.
        var lowPriorityDue: [String: Date] = [:]
        /// A tick is scheduled to run at once (see `scheduleTick(after:)`).
        var tickPending = false
        /// The device token of each recent push, by apns-id (events are found by token with it).
        var pushTokens: [String: String] = [:]
        /// When tokens change by themselves (``SimulatorConfiguration/activityTokenRotation``), and the soonest.
        var tokenRotations: [String: Date] = [:]
        var nextRotation: Date?
        /// Devices whose tokens changed by themselves in a read (rotations apply lazily, whenever
        /// any device is read): their followers are told at the next announcement.
        var rotatedUnannounced: Set<String> = []

        mutating func takeRotated() -> Set<String> {
            guard !rotatedUnannounced.isEmpty else { return [] }
            defer { rotatedUnannounced = [] }
            return rotatedUnannounced
        }
        /// Pushes APNs holds a moment before they reach the device (reordering), and widget pushes
        /// WidgetKit has yet to act on.
        var heldPushes: [HeldPush] = []
        var widgetPushesDue: [(due: Date, deviceID: String, bundleID: String, apnsID: String)] = []
        /// The last event number given on each device (``DeviceEvent/seq``).
        var eventSeqs: [String: Int] = [:]
        var pushTokenOrder: [String] = []
    }

    public init(configuration: SimulatorConfiguration = .init(), environment: SimulatedEnvironment = .sandbox, clock: any WallClock) {
        self.configuration = configuration
        self.environment = environment
        self.clock = clock
        state = Mutex(State(random: SeededRandom(seed: configuration.seed)))
    }

    // MARK: Devices and apps

    /// Registers the app's own decoder of an attributes type's content state: it answers nil when
    /// the content decodes, else why not. Content the schema accepts but this refuses is dropped
    /// with `decodingFailed` (the simulator's independent check on the shared schema code).
    public func registerContentDecoder(bundleID: String, attributesType: String, _ decode: @escaping @Sendable (JSONValue) -> String?) {
        contentDecoders.withLock { $0[bundleID + "\n" + attributesType] = decode }
    }

    @discardableResult
    public func createDevice(name: String) -> String {
        // The defaults always pass the checks.
        (try? createDevice(name: name, osVersion: "26.0", model: "iPhone 16 Pro")) ?? ""
    }

    /// A device of a given iOS version and model (`hasDynamicIsland` overrides what the model implies).
    @discardableResult
    public func createDevice(name: String, osVersion: String, model: String, hasDynamicIsland: Bool? = nil) throws(SimulatorError) -> String {
        let parts = osVersion.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...3).contains(parts.count), parts.allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isNumber) }), let major = Int(parts[0]), (16...99).contains(major) else {
            throw SimulatorError(.invalidArgument, "osVersion must be an iOS version such as 26.0 or 17.2 (Live Activities need 16.1 or later)", field: "osVersion")
        }
        guard !model.isEmpty else { throw SimulatorError(.invalidArgument, "model must name an iPhone or an iPad, such as iPhone 16 Pro or iPad Pro (M4)", field: "model") }
        // No iPad has a Dynamic Island: its Live Activities are on the Lock Screen only.
        if model.hasPrefix("iPad"), hasDynamicIsland == true {
            throw SimulatorError(.invalidArgument, "an iPad has no Dynamic Island; leave hasDynamicIsland out", field: "hasDynamicIsland")
        }
        let island = model.hasPrefix("iPad") ? false : hasDynamicIsland ?? !SimulatedDevice.modelsWithoutDynamicIsland.contains(model)
        return state.withLock { s in
            s.nextID += 1
            let id = "device-\(s.nextID)"
            s.devices[id] = SimulatedDevice(id: id, name: name.isEmpty ? id : name, osVersion: osVersion, model: model, hasDynamicIsland: island, isOnline: true,
                                            apps: [:], activities: [], events: [], storedPushes: [])
            s.deviceOrder.append(id)
            return id
        }
    }

    public var deviceIDs: [String] { state.withLock { $0.deviceOrder } }

    /// Pairs or unpairs an Apple Watch or a Mac, connects or disconnects CarPlay, locks or unlocks
    /// the device (locking ends its transient activities). Nil leaves a setting as it is.
    public func setSurroundings(deviceID: String, pairedWatch: Bool? = nil, carPlay: Bool? = nil, pairedMac: Bool? = nil, locked: Bool? = nil) throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        try state.withLock { (s) throws(SimulatorError) in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            var d = s.devices[deviceID]!
            if let problem = SimulatedDevice.surroundingsProblem(model: d.model, pairedWatch: pairedWatch, carPlay: carPlay) { throw problem }
            if let w = pairedWatch { d.pairedWatch = w }
            if let c = carPlay { d.carPlayConnected = c }
            if let m = pairedMac { d.pairedMac = m }
            var ended: [String] = []
            if let l = locked, l != d.isLocked {
                d.isLocked = l
                if l {
                    for i in d.activities.indices where d.activities[i].style == .transient && d.activities[i].state.isOngoing {
                        engine.dismiss(&d.activities[i], at: now)
                        ended.append(d.activities[i].id)
                    }
                }
                d.events.append(DeviceEvent(time: now, source: .user, message: l ? "The person locked the device\(ended.isEmpty ? "" : "; its transient activities ended (\(ended.joined(separator: ", ")))")." : "The person unlocked the device."))
            }
            s.devices[deviceID] = d
        }
    }

    /// The person adds or removes the app's controls: each added control gets a push token of its
    /// own, each removed one's token answers 410 from now; WidgetKit tells the app
    /// (`pushTokensDidChange(controls:)`, Apple, "Updating controls locally and remotely").
    public func setControls(bundleID: String, on deviceID: String, kinds: [String]) throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        try mutateApp(bundleID, on: deviceID) { (s, app) throws(SimulatorError) in
            guard kinds.allSatisfy({ !$0.isEmpty }), Set(kinds).count == kinds.count else {
                throw SimulatorError(.invalidArgument, "kinds must be distinct, non-empty control kinds", field: "kinds")
            }
            for (kind, token) in app.controlPushTokens where !kinds.contains(kind) {
                retire(&s, token, at: now)
                app.controlPushTokens.removeValue(forKey: kind)
            }
            app.controls = kinds
            issueControlTokens(&s, &app, deviceID: deviceID)
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user,
                message: "The person changed \(bundleID)'s controls to \(kinds.isEmpty ? "none" : kinds.joined(separator: ", ")); WidgetKit told the app their push tokens (pushTokensDidChange)."))
        }
    }

    public struct AppInstall: Sendable {
        public var bundleID: String
        public var environment: SimulatedEnvironment
        public var schemas: [ActivitySchema]
        public var declaresFrequentUpdates: Bool
        public var localization: [String: String]
        public var widgets: [SimulatedWidget.Configuration]
        /// The kinds of its Control Center controls that reload by push (iOS 18 `ControlPushHandler`).
        public var controls: [String]
        /// Whether the person has the app open (only a foreground app may call `Activity.request`).
        public var foreground: Bool
        /// Its Live Activity widget's `supplementalActivityFamilies` (`small`, `medium`).
        public var supplementalActivityFamilies: [String] = []
        public init(bundleID: String, environment: SimulatedEnvironment = .sandbox, schemas: [ActivitySchema] = [], declaresFrequentUpdates: Bool = false,
                    localization: [String: String] = [:], widgets: [SimulatedWidget.Configuration] = [], controls: [String] = [], foreground: Bool = true) {
            self.controls = controls
            self.bundleID = bundleID
            self.environment = environment
            self.schemas = schemas
            self.declaresFrequentUpdates = declaresFrequentUpdates
            self.localization = localization
            self.widgets = widgets
            self.foreground = foreground
        }
    }

    /// Installs an app: push-to-start tokens are issued for each attributes type (iOS 17.2+),
    /// and a widget push token when it has widgets (iOS 26+).
    @discardableResult
    public func install(_ install: AppInstall, on deviceID: String) throws(SimulatorError) -> SimulatedApp {
        defer { announce(device: deviceID) }
        guard !install.bundleID.isEmpty, !install.bundleID.contains("/"), !install.bundleID.contains(".push-type.") else {
            throw SimulatorError(.invalidArgument, "bundleID must be a bare bundle id such as com.example.pizza", field: "bundleID")
        }
        let installed = try state.withLock { (s) throws(SimulatorError) -> SimulatedApp in
            guard s.devices[deviceID] != nil else { throw SimulatorError(.notFound, "no device \(deviceID)") }
            if s.devices[deviceID]!.apps[install.bundleID] != nil { throw SimulatorError(.conflict, "\(install.bundleID) is already installed on \(deviceID)", field: "bundleID") }
            var app = SimulatedApp(
                bundleID: install.bundleID, environment: install.environment,
                schemas: Dictionary(install.schemas.map { ($0.attributesType, $0) }, uniquingKeysWith: { _, b in b }),
                declaresFrequentUpdates: install.declaresFrequentUpdates, liveActivitiesEnabled: true, frequentUpdatesEnabled: install.declaresFrequentUpdates,
                localization: install.localization, pushToStartTokens: [:], widgetPushToken: nil,
                widgets: install.widgets.map { SimulatedWidget(configuration: $0, addedAt: clock.now) }, isForeground: install.foreground)
            app.controls = install.controls
            app.supplementalActivityFamilies = install.supplementalActivityFamilies
            // Each widget's daily budget: WidgetKit's "40 to 70" for a widget viewed often (seeded).
            let budgets = min(configuration.widgetDailyReloadBudgetMinimum, configuration.widgetDailyReloadBudget)...configuration.widgetDailyReloadBudget
            for i in app.widgets.indices { app.widgets[i].dailyBudget = budgets.count > 1 ? Int.random(in: budgets, using: &s.random) : budgets.lowerBound }
            if configuration.tokensAtInstall {
                issueInstallTokens(&s, &app, deviceID: deviceID)
            } else {
                // Like ActivityKit and WidgetKit: a moment after install, on the update sequences.
                app.tokensDueAt = clock.now.addingTimeInterval(configuration.pushTokenDelay)
                s.tokensDue.insert(deviceID)
            }
            s.devices[deviceID]!.apps[install.bundleID] = app
            return app
        }
        if installed.tokensDueAt != nil { scheduleTick(after: configuration.pushTokenDelay) }
        return installed
    }

    /// The person deletes the app: its Live Activities disappear (their tokens then answer like a
    /// dismissed activity's — accepted a while, then 410), its push-to-start and widget tokens
    /// answer 410 `Unregistered` at once, and its widgets go.
    public func uninstall(bundleID: String, on deviceID: String) throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        try state.withLock { (s) throws(SimulatorError) in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            guard let app = s.devices[deviceID]!.apps.removeValue(forKey: bundleID) else { throw SimulatorError(.notFound, "\(bundleID) is not installed on \(deviceID)") }
            for token in Array(app.pushToStartTokens.values) + Array(app.controlPushTokens.values) + [app.widgetPushToken].compactMap({ $0 }) { retire(&s, token, at: now) }
            for i in s.devices[deviceID]!.activities.indices where s.devices[deviceID]!.activities[i].bundleID == bundleID && s.devices[deviceID]!.activities[i].state != .dismissed {
                engine.dismiss(&s.devices[deviceID]!.activities[i], at: now)
            }
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, activityID: nil, message: "The person deleted \(bundleID): its Live Activities and widgets are gone."))
        }
    }

    public func device(_ id: String) throws(SimulatorError) -> SimulatedDevice {
        let now = clock.now
        let (device, rotated) = try state.withLock { (s) throws(SimulatorError) -> (SimulatedDevice, Set<String>) in
            try advanceLocked(&s, deviceID: id, to: now)
            return (s.devices[id]!, s.takeRotated())
        }
        if !rotated.isEmpty { changes.notify(devices: rotated) }
        return device
    }

    /// Tells the followers of these devices, and of any device whose tokens changed by themselves
    /// meanwhile, that something changed.
    func announce(_ devices: some Collection<String>) {
        let rotated = state.withLock { $0.takeRotated() }
        changes.notify(devices: rotated.isEmpty ? Array(devices) : Array(devices) + rotated)
    }

    func announce(device: String) { announce(CollectionOfOne(device)) }

    /// A change that may touch every device.
    func announceAll() {
        state.withLock { _ = $0.takeRotated() }
        changes.notify()
    }

    public func app(_ bundleID: String, on deviceID: String) throws(SimulatorError) -> SimulatedApp {
        let d = try device(deviceID)
        guard let app = d.apps[bundleID] else { throw SimulatorError(.notFound, "\(bundleID) is not installed on \(deviceID)") }
        return app
    }

    /// Rotates a push-to-start token; the old one stops working at once (410 Unregistered).
    @discardableResult
    public func rotatePushToStartToken(bundleID: String, attributesType: String, on deviceID: String) throws(SimulatorError) -> String {
        defer { announce(device: deviceID) }
        let now = clock.now
        return try mutateApp(bundleID, on: deviceID) { (s, app) throws(SimulatorError) -> String in
            guard let old = app.pushToStartTokens[attributesType] else { throw SimulatorError(.notFound, "\(bundleID) has no attributes type \(attributesType)", field: "attributesType") }
            retire(&s, old, at: now)
            let token = Self.newToken(bytes: 40)
            app.pushToStartTokens[attributesType] = token
            s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: bundleID, kind: .pushToStart(attributesType), environment: app.environment)
            return token
        }
    }

    /// WidgetKit issues a new widget push token (iOS 26); the old one answers 410 from then on.
    @discardableResult
    public func rotateWidgetPushToken(bundleID: String, on deviceID: String) throws(SimulatorError) -> String {
        defer { announce(device: deviceID) }
        let now = clock.now
        return try mutateApp(bundleID, on: deviceID) { (s, app) throws(SimulatorError) -> String in
            guard let old = app.widgetPushToken else { throw SimulatorError(.conflict, "\(bundleID) has no widget push token (no widgets, or iOS before 26)") }
            retire(&s, old, at: now)
            let token = Self.newToken(bytes: 32)
            app.widgetPushToken = token
            s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: bundleID, kind: .widgets, environment: app.environment)
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, message: "WidgetKit issued a new widget push token for \(bundleID); the old one is no longer valid."))
            return token
        }
    }

    /// The user changes Settings. Turning frequent updates off or on ends every ongoing activity
    /// of the app (docs/protocol.md, Isle's decisions); turning Live Activities off ends them too.
    /// `foreground: true` opens the app (also after a force-quit: its withheld tokens then come);
    /// `forceQuit: true` is the person swiping it away in the app switcher.
    public func updateSettings(bundleID: String, on deviceID: String, liveActivitiesEnabled: Bool? = nil, frequentUpdatesEnabled: Bool? = nil, foreground: Bool? = nil,
                               forceQuit: Bool? = nil, terminated: Bool? = nil) throws(SimulatorError) {
        defer {
            announce(device: deviceID)
            if foreground == true, state.withLock({ !$0.tokensDue.isEmpty }) { scheduleTick(after: configuration.pushTokenDelay) }
        }
        let now = clock.now
        try state.withLock { (s) throws(SimulatorError) in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            guard var app = s.devices[deviceID]?.apps[bundleID] else { throw SimulatorError(.notFound, "\(bundleID) is not installed on \(deviceID)") }
            var endReason: String?
            if let f = frequentUpdatesEnabled, f != app.frequentUpdatesEnabled {
                if !app.declaresFrequentUpdates, f { throw SimulatorError(.invalidArgument, "\(bundleID) does not declare NSSupportsLiveActivitiesFrequentUpdates", field: "frequentUpdatesEnabled") }
                app.frequentUpdatesEnabled = f
                endReason = "The user turned More Frequent Updates \(f ? "on" : "off"): the system ended the app's Live Activities."
            }
            if let e = liveActivitiesEnabled, e != app.liveActivitiesEnabled {
                app.liveActivitiesEnabled = e
                if !e { endReason = "The user turned Live Activities off for the app: the system ended its Live Activities." }
            }
            var opened = false
            if terminated == true {
                app.isTerminated = true
                app.isForeground = false
                s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .system, activityID: nil, message: "The system terminated \(bundleID) (not force-quit)."))
            }
            if forceQuit == true {
                app.isForceQuit = true
                app.isForeground = false
                s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, activityID: nil, message: "The person force-quit \(bundleID): iOS will not launch it in the background until it is opened."))
            }
            if let fg = foreground {
                app.isForeground = fg
                if fg, app.isForceQuit || app.isTerminated {
                    app.isForceQuit = false
                    app.isTerminated = false
                    opened = true
                }
            }
            s.devices[deviceID]!.apps[bundleID] = app
            // Leaving the app ends its transient activities (Apple: it "ends automatically when the person leaves the app").
            if !app.isForeground {
                for i in s.devices[deviceID]!.activities.indices where s.devices[deviceID]!.activities[i].bundleID == bundleID
                    && s.devices[deviceID]!.activities[i].style == .transient && s.devices[deviceID]!.activities[i].state.isOngoing {
                    engine.dismiss(&s.devices[deviceID]!.activities[i], at: now)
                    s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, activityID: s.devices[deviceID]!.activities[i].id,
                                                                   message: "The person left \(bundleID): its transient activity ended."))
                }
            }
            if opened {
                // Opened again: the activities started by push while it was quit get their tokens now.
                for i in s.devices[deviceID]!.activities.indices where s.devices[deviceID]!.activities[i].bundleID == bundleID && s.devices[deviceID]!.activities[i].tokenWaitsForLaunch {
                    s.devices[deviceID]!.activities[i].tokenWaitsForLaunch = false
                    s.devices[deviceID]!.activities[i].tokenDueAt = now.addingTimeInterval(configuration.pushTokenDelay)
                    s.tokensDue.insert(deviceID)
                }
            }
            if let endReason {
                for i in s.devices[deviceID]!.activities.indices where s.devices[deviceID]!.activities[i].bundleID == bundleID && s.devices[deviceID]!.activities[i].state.isOngoing {
                    var a = s.devices[deviceID]!.activities[i]
                    a.state = .ended
                    a.endedAt = now
                    a.scheduledDismissal = now.addingTimeInterval(configuration.maximumEndedDuration)
                    s.devices[deviceID]!.activities[i] = a
                    s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, activityID: a.id, message: endReason))
                }
            }
        }
    }

    // MARK: Activities from the app

    public enum RequestPushType: Sendable, Hashable {
        case none
        case token
        case channel(String)
    }

    /// Like `Activity.request(attributes:content:pushType:)` in the foreground app.
    /// With `start` in the future the activity is scheduled (iOS 26): `pending` until then, and it
    /// counts toward the limits.
    public func requestActivity(bundleID: String, on deviceID: String, attributesType: String, attributes: JSONValue, contentState: JSONValue,
                                staleDate: Date? = nil, relevanceScore: Double = 0, pushType: RequestPushType = .token, start: Date? = nil,
                                alertConfiguration: AlertConfiguration? = nil, style: ActivityStyle = .standard) throws(SimulatorError) -> SimulatedActivity {
        defer { announce(device: deviceID) }
        let now = clock.now
        let activity = try state.withLock { (s) throws(SimulatorError) -> SimulatedActivity in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            guard let app = s.devices[deviceID]!.apps[bundleID] else { throw SimulatorError(.notFound, "\(bundleID) is not installed on \(deviceID)") }
            guard app.isForeground else {
                throw SimulatorError(.visibility, "Activity.request failed with ActivityAuthorizationError.visibility: \(bundleID) is not in the foreground. Start from the foreground app, a LiveActivityIntent, a push-to-start, or schedule it.")
            }
            if case .failure(let outcome) = checkStart(s, deviceID: deviceID, app: app, attributesType: attributesType, attributes: attributes, contentState: contentState) {
                throw SimulatorError(Self.authorizationCode(outcome.code, limit: outcome.sentence), outcome.sentence, field: outcome.field)
            }
            var channel: String?
            if case .channel(let id) = pushType {
                guard s.devices[deviceID]!.runs(atLeast: 18) else {
                    throw SimulatorError(.unsupported, "pushType .channel needs iOS 18; this device runs \(s.devices[deviceID]!.osVersion)", field: "pushType")
                }
                guard s.channels[bundleID]?[id] != nil else { throw SimulatorError(.invalidArgument, "channel \(id) does not exist; the activity fails to start", field: "pushType") }
                channel = id
            }
            if start != nil, !s.devices[deviceID]!.runs(atLeast: 26) {
                throw SimulatorError(.unsupported, "a scheduled start (Activity.request(…, start:)) needs iOS 26; this device runs \(s.devices[deviceID]!.osVersion)", field: "start")
            }
            if style == .transient {
                let d = s.devices[deviceID]!
                guard d.runs(atLeast: 18) else {
                    throw SimulatorError(.unsupported, "ActivityStyle.transient (request(attributes:content:pushType:style:)) needs iOS 18; this device runs \(d.osVersion)", field: "style")
                }
                // Apple: a transient activity appears "in the extended presentation in the Dynamic
                // Island"; it is silent on devices without one and on push tokens. Isle's stricter
                // reading: neither (docs/simulator.md).
                guard d.hasDynamicIsland else {
                    throw SimulatorError(.unsupported, "a transient activity shows only in the Dynamic Island, and this \(d.model) has none (Isle's assumption; Apple is silent)", field: "style")
                }
                guard pushType == .none else {
                    throw SimulatorError(.unsupported, "a transient activity takes no push updates here (Isle's assumption; Apple is silent): request it with pushType nil", field: "pushType")
                }
                guard start == nil else { throw SimulatorError(.invalidArgument, "a transient activity cannot be scheduled: it lasts while the app is open", field: "start") }
            }
            if start != nil, alertConfiguration == nil {
                throw SimulatorError(.invalidArgument, "a scheduled start needs an alertConfiguration (ActivityKit's request(…, alertConfiguration:start:) requires one): the alert the person sees when it starts", field: "alertConfiguration")
            }
            var a = newActivity(&s, deviceID: deviceID, app: app, attributesType: attributesType, attributes: attributes, contentState: contentState, now: now, by: .app)
            a.staleDate = staleDate
            a.relevanceScore = relevanceScore
            a.channelID = channel
            a.style = style
            if let start, start > now {
                a.state = .pending
                a.startedAt = start
                a.scheduledAlert = alertConfiguration
            } else if let alert = alertConfiguration, start != nil {
                // Its date already passed: it starts now, with its alert.
                a.lastAlert = ShownAlert(title: alert.title, body: alert.body, sound: alert.sound, at: now)
            }
            // The token is not there when request returns: it comes on pushTokenUpdates (WWDC23).
            if pushType == .token {
                a.tokenDueAt = now.addingTimeInterval(configuration.pushTokenDelay)
                s.tokensDue.insert(deviceID)
            }
            s.activityIndex[a.id] = s.devices[deviceID]!.activities.count
            s.devices[deviceID]!.activities.append(a)
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .app, activityID: a.id, message: "The app \(a.state == .pending ? "scheduled" : "started") a \(attributesType) activity\(a.tokenDueAt != nil ? "; its push token follows on pushTokenUpdates" : "")\(channel.map { " subscribed to channel \($0)" } ?? "")."))
            return a
        }
        if pushType == .token { scheduleTick(after: configuration.pushTokenDelay) }
        return activity
    }

    /// The app updates or ends its own activity (`activity.update` / `activity.end`); an end's
    /// dismissal policy is `.default`, `.immediate` (`dismissImmediately`) or `.after(dismissAt)`.
    public func appUpdate(activityID: String, on deviceID: String, contentState: JSONValue?, end: Bool = false, dismissImmediately: Bool = false, dismissAt: Date? = nil) throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        try state.withLock { (s) throws(SimulatorError) in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            guard let i = s.devices[deviceID]!.activities.firstIndex(where: { $0.id == activityID }) else { throw SimulatorError(.notFound, "no activity \(activityID) on \(deviceID)") }
            var a = s.devices[deviceID]!.activities[i]
            guard a.state.isOngoing else { throw SimulatorError(.conflict, "the activity has ended; updates are ignored") }
            guard let app = s.devices[deviceID]!.apps[a.bundleID] else { throw SimulatorError(.notFound, "\(a.bundleID) is not installed on \(deviceID)") }
            var aps: JSONObject = ["timestamp": .int(ActivityKitEncoding.unixSeconds(now)), "event": end ? "end" : "update"]
            if let contentState { aps["content-state"] = contentState } else if !end { aps["content-state"] = a.contentState }
            if end, dismissImmediately { aps["dismissal-date"] = .int(ActivityKitEncoding.unixSeconds(now)) }
            if end, !dismissImmediately, let dismissAt { aps["dismissal-date"] = .int(ActivityKitEncoding.unixSeconds(dismissAt)) }
            if let problem = engine.decode(aps["content-state"], required: false, attributesType: a.attributesType, app: app) {
                throw SimulatorError(.invalidArgument, problem.sentence, field: problem.field)
            }
            let outcome = engine.apply(aps, activity: &a, app: app, at: now)
            s.devices[deviceID]!.activities[i] = a
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .app, activityID: a.id, outcome: outcome, message: "The app \(end ? "ended" : "updated") the activity: \(outcome.sentence)"))
        }
    }

    /// The person swipes the activity away: it ends and is dismissed; its token answers 410.
    public func userDismiss(activityID: String, on deviceID: String) throws(SimulatorError) {
        defer { announce(device: deviceID) }
        let now = clock.now
        try state.withLock { (s) throws(SimulatorError) in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            guard let i = s.devices[deviceID]!.activities.firstIndex(where: { $0.id == activityID }) else { throw SimulatorError(.notFound, "no activity \(activityID) on \(deviceID)") }
            guard s.devices[deviceID]!.activities[i].state != .dismissed else { throw SimulatorError(.conflict, "the activity is already dismissed") }
            engine.dismiss(&s.devices[deviceID]!.activities[i], at: now)
            s.devices[deviceID]!.events.append(DeviceEvent(time: now, source: .user, activityID: activityID, message: "The person removed the Live Activity from the Lock Screen."))
        }
    }

    /// The user taps Allow for a push-started activity: its withheld update token is issued.
    public func allowUpdates(activityID: String, on deviceID: String) throws(SimulatorError) -> String? {
        defer { announce(device: deviceID) }
        return try state.withLock { (s) throws(SimulatorError) -> String? in
            guard let i = s.devices[deviceID]?.activities.firstIndex(where: { $0.id == activityID }) else { throw SimulatorError(.notFound, "no activity \(activityID) on \(deviceID)") }
            var a = s.devices[deviceID]!.activities[i]
            guard let token = a.withheldToken else { return a.updateToken }
            guard let environment = s.devices[deviceID]!.apps[a.bundleID]?.environment else { throw SimulatorError(.notFound, "\(a.bundleID) is not installed on \(deviceID)") }
            a.withheldToken = nil
            a.updateToken = token
            s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: a.bundleID, kind: .activity(a.id), environment: environment)
            s.devices[deviceID]!.activities[i] = a
            return token
        }
    }

    /// ActivityKit rotates an activity's push token: the old one answers 410 from then on.
    public func rotateUpdateToken(activityID: String, on deviceID: String) throws(SimulatorError) -> String {
        defer { announce(device: deviceID) }
        return try state.withLock { (s) throws(SimulatorError) -> String in
            guard let i = s.devices[deviceID]?.activities.firstIndex(where: { $0.id == activityID }) else { throw SimulatorError(.notFound, "no activity \(activityID) on \(deviceID)") }
            var a = s.devices[deviceID]!.activities[i]
            guard a.updateToken != nil else { throw SimulatorError(.conflict, "the activity has no push token") }
            guard a.state.isOngoing else { throw SimulatorError(.conflict, "the activity has ended") }
            guard let env = s.devices[deviceID]!.apps[a.bundleID]?.environment else { throw SimulatorError(.notFound, "\(a.bundleID) is not installed on \(deviceID)") }
            if let old = a.updateToken { retire(&s, old, at: clock.now) }
            issueUpdateToken(&s, &a, deviceID: deviceID, environment: env)
            s.devices[deviceID]!.activities[i] = a
            s.devices[deviceID]!.events.append(DeviceEvent(time: clock.now, source: .system, activityID: a.id, message: "ActivityKit issued a new push token; the old one is no longer valid."))
            return a.updateToken!
        }
    }

    // MARK: Screen

    public func screen(deviceID: String) throws(SimulatorError) -> ScreenState {
        let now = clock.now
        return try state.withLock { (s) throws(SimulatorError) -> ScreenState in
            try advanceLocked(&s, deviceID: deviceID, to: now)
            let d = s.devices[deviceID]!
            // A transient activity is never on the Lock Screen: only in the expanded island.
            let transient = d.activities.filter { $0.style == .transient && ($0.state == .active || $0.state == .stale) }
            let visible = d.activities.enumerated().filter { $0.element.state.isVisible && $0.element.state != .pending && $0.element.style == .standard }
            let ordered = visible.sorted { l, r in
                l.element.relevanceScore != r.element.relevanceScore ? l.element.relevanceScore > r.element.relevanceScore : l.offset < r.offset
            }.map(\.element)
            let items = ordered.map {
                ScreenState.Item(activityID: $0.id, bundleID: $0.bundleID, attributesType: $0.attributesType, state: $0.state, isStale: $0.state == .stale,
                                 relevanceScore: $0.relevanceScore, attributes: $0.attributes, contentState: $0.contentState, staleDate: $0.staleDate, lastAlert: $0.lastAlert)
            }
            let island = ordered.filter { $0.state == .active || $0.state == .stale }
            var mode: ScreenState.IslandMode = island.isEmpty ? .none : island.count == 1 ? .compact : .minimal
            var shown = Array(island.prefix(2).map(\.id))
            if let alerted = island.filter({ ($0.lastAlert.map { now.timeIntervalSince($0.at) < configuration.expandedPresentationDuration } ?? false) }).max(by: { $0.lastAlert!.at < $1.lastAlert!.at }) {
                mode = .expanded
                shown = [alerted.id]
            }
            if let t = transient.last, d.hasDynamicIsland {
                mode = .expanded
                shown = [t.id]
            }
            // Elsewhere: the Watch's Smart Stack (iOS 18+), CarPlay (iOS 26+) show the most relevant
            // ongoing activity, compact or the app's `small` layout; the Mac's menu bar (iOS 26+)
            // the Dynamic Island's own presentation (Apple: "unchanged compact, minimal, and expanded").
            var presentations: [ScreenState.Presentation] = []
            func layout(_ a: SimulatedActivity) -> String { d.apps[a.bundleID]?.supplementalActivityFamilies.contains("small") == true ? "small" : "compact" }
            func recentAlert(_ a: SimulatedActivity) -> ShownAlert? { a.lastAlert.flatMap { now.timeIntervalSince($0.at) < configuration.expandedPresentationDuration ? $0 : nil } }
            if d.family == "iPhone" {
                if let top = island.first, d.pairedWatch, d.runs(atLeast: 18) {
                    presentations.append(.init(surface: .watchSmartStack, activityID: top.id, layout: layout(top), contentState: top.contentState, alert: recentAlert(top)))
                }
                if let top = island.first, d.carPlayConnected, d.runs(atLeast: 26) {
                    presentations.append(.init(surface: .carPlay, activityID: top.id, layout: layout(top), contentState: top.contentState, alert: nil))
                }
                // The island's own mode and activities (a transient one included); on an iPhone
                // without a Dynamic Island, the mode it would have.
                if d.pairedMac, d.runs(atLeast: 26), mode != .none {
                    for id in shown {
                        guard let a = (island + transient).first(where: { $0.id == id }) else { continue }
                        presentations.append(.init(surface: .macMenuBar, activityID: a.id, layout: mode.rawValue, contentState: a.contentState, alert: recentAlert(a)))
                    }
                }
            }
            let widgets = d.apps.values.sorted { $0.bundleID < $1.bundleID }.flatMap { app in app.widgets.map { $0.view(bundleID: app.bundleID, at: now) } }
            var banner: ScreenState.Banner?
            if !d.hasDynamicIsland {
                // No Dynamic Island: the alert shows the Lock Screen presentation as a banner instead.
                if mode == .expanded, let id = shown.first, let alert = island.first(where: { $0.id == id })?.lastAlert { banner = .init(activityID: id, alert: alert) }
                mode = .none
                shown = []
            }
            let transientItems = transient.map {
                ScreenState.Item(activityID: $0.id, bundleID: $0.bundleID, attributesType: $0.attributesType, state: $0.state, isStale: $0.state == .stale,
                                 relevanceScore: $0.relevanceScore, attributes: $0.attributes, contentState: $0.contentState, staleDate: $0.staleDate, lastAlert: $0.lastAlert)
            }
            return ScreenState(time: now, lockScreen: items, dynamicIsland: mode, islandActivities: shown, banner: banner, widgets: widgets, family: d.family, presentations: presentations,
                               transientActivities: transientItems)
        }
    }

    // MARK: Helpers (lock held)

    /// Time-based transitions of one activity (a push judges its own activity; the others catch up
    /// whenever the device is read), so a push costs the same however many activities a device holds.
    func advanceActivityLocked(_ s: inout State, deviceID: String, index i: Int, to now: Date) {
        guard var d = s.devices.removeValue(forKey: deviceID) else { return }
        defer { s.devices[deviceID] = d }
        guard d.activities.indices.contains(i), let app = d.apps[d.activities[i].bundleID] else { return }
        let logged = d.events.count
        engine.advance(&d.activities[i], app: app, appBudget: &d.apps[app.bundleID]!.budgetLog, to: now, events: &d.events)
        if d.events.count > logged { d.events.sort { $0.time < $1.time } }
    }

    /// The index of an activity in its device's list, if it is that device's.
    func indexLocked(_ s: State, activityID: String, deviceID: String) -> Int? {
        guard let i = s.activityIndex[activityID], let d = s.devices[deviceID], d.activities.indices.contains(i), d.activities[i].id == activityID else {
            return s.devices[deviceID]?.activities.firstIndex { $0.id == activityID }
        }
        return i
    }

    func advanceLocked(_ s: inout State, deviceID: String, to now: Date) throws(SimulatorError) {
        rotateDueTokensLocked(&s, now: now)
        // Taken out of the dictionary while it changes, so its arrays stay uniquely referenced and
        // are mutated in place (not copied whole on every push).
        guard var d = s.devices.removeValue(forKey: deviceID) else { throw SimulatorError(.notFound, "no device \(deviceID)") }
        defer { s.devices[deviceID] = d }
        let logged = d.events.count
        // One copy of the app per run of activities of the same app (not one per activity).
        var current: SimulatedApp?
        for i in d.activities.indices {
            if current?.bundleID != d.activities[i].bundleID { current = d.apps[d.activities[i].bundleID] }
            guard let app = current, app.bundleID == d.activities[i].bundleID else { continue }
            let before = d.activities[i].state
            engine.advance(&d.activities[i], app: app, appBudget: &d.apps[app.bundleID]!.budgetLog, to: now, events: &d.events)
            if before != .dismissed, d.activities[i].state == .dismissed, let t = d.activities[i].updateToken { _ = t }
        }
        // Time-based transitions are logged at the moment they happened: keep the log in time order.
        if d.events.count > logged { d.events.sort { $0.time < $1.time } }
    }

    func checkStart(_ s: State, deviceID: String, app: SimulatedApp, attributesType: String, attributes: JSONValue, contentState: JSONValue) -> Result<Void, PushOutcome> {
        // ActivityKit's Live Activities arrived in iOS 16.1 (docs/protocol.md §10); 16.0 has the API's types, not the feature.
        if let device = s.devices[deviceID], !device.runs(atLeast: 16, 1) {
            return .failure(PushOutcome(.unsupportedOnThisVersion, "Not started: Live Activities need iOS 16.1; this device runs \(device.osVersion).", field: "osVersion", expected: "16.1 or later", found: device.osVersion))
        }
        // Apple's API pages say iPadOS 16.1+, but an iPad's Lock Screen shows Live Activities from
        // iPadOS 17 (Isle's stricter reading; Apple is silent; docs/simulator.md).
        if let device = s.devices[deviceID], device.family == "iPad", !device.runs(atLeast: 17) {
            return .failure(PushOutcome(.unsupportedOnThisVersion, "Not started: an iPad shows Live Activities from iPadOS 17; this one runs \(device.osVersion) (Isle's assumption).", field: "osVersion", expected: "17.0 or later", found: device.osVersion))
        }
        guard app.liveActivitiesEnabled else { return .failure(PushOutcome(.liveActivitiesDisabled, "Not started: the user turned Live Activities off for \(app.bundleID).")) }
        guard let schema = app.schemas[attributesType] else {
            let names = app.schemas.keys.sorted().joined(separator: ", ")
            return .failure(PushOutcome(.unknownAttributesType, "Not started: \(app.bundleID) has no ActivityAttributes type named \"\(attributesType)\" (it has \(names.isEmpty ? "none" : names); names are case-sensitive).",
                                        field: "attributes-type", expected: names, found: attributesType))
        }
        if let m = schema.attributes.decode(attributes, path: "attributes").mismatches.first {
            return .failure(PushOutcome(.decodingFailed, "Not started: Unable to decode attributes: \(m.path) expected \(m.expected), found \(m.found).", field: m.path, expected: m.expected, found: m.found))
        }
        if let m = schema.contentState.decode(contentState, path: "content-state").mismatches.first {
            return .failure(PushOutcome(.decodingFailed, "Not started: Unable to decode content state: \(m.path) expected \(m.expected), found \(m.found).", field: m.path, expected: m.expected, found: m.found))
        }
        let size = attributes.jsonBytes.count + contentState.jsonBytes.count
        if size > configuration.maximumActivityDataSize {
            return .failure(PushOutcome(.tooLarge, "Not started: attributes and content-state are \(size) bytes; ActivityKit allows \(configuration.maximumActivityDataSize) (attributesTooLarge)."))
        }
        let ongoing = s.devices[deviceID]!.activities.filter { $0.state.isOngoing }
        if ongoing.filter({ $0.bundleID == app.bundleID }).count >= configuration.maximumActivitiesPerApp {
            return .failure(PushOutcome(.limitReached, "Not started: \(app.bundleID) already has \(configuration.maximumActivitiesPerApp) ongoing activities (targetMaximumExceeded)."))
        }
        if ongoing.count >= configuration.maximumActivitiesPerDevice {
            return .failure(PushOutcome(.limitReached, "Not started: the device already has \(configuration.maximumActivitiesPerDevice) ongoing activities (globalMaximumExceeded)."))
        }
        return .success(())
    }

    static func authorizationCode(_ code: PushOutcome.Code, limit sentence: String) -> SimulatorError.Code {
        switch code {
        case .liveActivitiesDisabled: .denied
        case .tooLarge: .attributesTooLarge
        case .limitReached: sentence.contains("globalMaximumExceeded") ? .globalMaximumExceeded : .targetMaximumExceeded
        case .unknownAttributesType: .unsupported
        case .unsupportedOnThisVersion: .unsupported
        default: .invalidArgument
        }
    }

    func newActivity(_ s: inout State, deviceID: String, app: SimulatedApp, attributesType: String, attributes: JSONValue, contentState: JSONValue, now: Date, by source: DeviceEvent.Source) -> SimulatedActivity {
        s.nextID += 1
        return SimulatedActivity(
            id: "activity-\(s.nextID)", bundleID: app.bundleID, attributesType: attributesType, attributes: attributes, contentState: contentState,
            staleDate: nil, relevanceScore: 0, state: .active, startedAt: now, endedAt: nil, dismissedAt: nil, scheduledDismissal: nil,
            lastTimestamp: nil, updateToken: nil, withheldToken: nil, channelID: nil, startedBy: source, lastAlert: nil, scheduledAlert: nil)
    }

    /// The app's push-to-start tokens (one per attributes type, iOS 17.2+) and its widget push token
    /// (when it has widgets, iOS 26+).
    func issueInstallTokens(_ s: inout State, _ app: inout SimulatedApp, deviceID: String) {
        guard let device = s.devices[deviceID] else { return }
        for type in app.schemas.keys.sorted() where device.runs(atLeast: 17, 2) && app.pushToStartTokens[type] == nil {
            let token = Self.newToken(bytes: 40)
            app.pushToStartTokens[type] = token
            s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: app.bundleID, kind: .pushToStart(type), environment: app.environment)
            scheduleRotation(&s, token: token, within: configuration.pushToStartTokenRotation)
        }
        if !app.widgets.isEmpty, device.runs(atLeast: 26), app.widgetPushToken == nil {
            let token = Self.newToken(bytes: 32)
            app.widgetPushToken = token
            s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: app.bundleID, kind: .widgets, environment: app.environment)
            scheduleRotation(&s, token: token, within: configuration.pushToStartTokenRotation)
        }
        // Controls that reload by push: WidgetKit's control push token (ControlPushHandler, iOS 18).
        issueControlTokens(&s, &app, deviceID: deviceID)
        app.tokensDueAt = nil
    }

    /// One token per control (ControlInfo.pushInfo, iOS 18): a push reloads that control alone.
    func issueControlTokens(_ s: inout State, _ app: inout SimulatedApp, deviceID: String) {
        if s.devices[deviceID]?.runs(atLeast: 18) == true {
            for kind in app.controls where app.controlPushTokens[kind] == nil {
                let token = Self.newToken(bytes: 32)
                app.controlPushTokens[kind] = token
                s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: app.bundleID, kind: .control(kind), environment: app.environment)
                scheduleRotation(&s, token: token, within: configuration.pushToStartTokenRotation)
            }
            app.controlsPushToken = app.controls.first.flatMap { app.controlPushTokens[$0] }
        }
    }

    func issueUpdateToken(_ s: inout State, _ a: inout SimulatedActivity, deviceID: String, environment: SimulatedEnvironment, rotates: Bool = true) {
        let token = Self.newToken(bytes: 80)
        a.updateToken = token
        s.tokens[token] = TokenOwner(deviceID: deviceID, bundleID: a.bundleID, kind: .activity(a.id), environment: environment)
        if rotates { scheduleRotation(&s, token: token, within: configuration.activityTokenRotation) }
    }

    /// One of an app's tokens (push-to-start, widget, control) replaced by a new one of `bytes`
    /// bytes, if the app still `holds` it: the old one retired at `at`, the change logged.
    func replaceAppToken(_ s: inout State, _ token: String, owner: TokenOwner, at: Date, bytes: Int, holds: (SimulatedApp) -> Bool,
                         set: (inout SimulatedApp, String) -> Void, message: String) {
        guard var app = s.devices[owner.deviceID]?.apps[owner.bundleID], holds(app) else { return }
        retire(&s, token, at: at)
        let fresh = Self.newToken(bytes: bytes)
        set(&app, fresh)
        s.tokens[fresh] = TokenOwner(deviceID: owner.deviceID, bundleID: owner.bundleID, kind: owner.kind, environment: owner.environment)
        s.devices[owner.deviceID]!.apps[owner.bundleID] = app
        s.devices[owner.deviceID]!.events.append(DeviceEvent(time: at, source: .system, message: message))
    }

    /// The token changes by itself at a seeded moment within `range` from now (nil: never).
    func scheduleRotation(_ s: inout State, token: String, within range: ClosedRange<TimeInterval>?) {
        guard let range else { return }
        let at = clock.now.addingTimeInterval(Double.random(in: range, using: &s.random))
        s.tokenRotations[token] = at
        s.nextRotation = min(s.nextRotation ?? at, at)
    }

    /// Tokens whose moment to change has come get a successor, handed to the app as ActivityKit and
    /// WidgetKit do (`pushTokenUpdates`, `pushToStartTokenUpdates`, the widget push token); the old
    /// one answers 410 from that moment. Each changes once. Answers whether any changed.
    @discardableResult
    func rotateDueTokensLocked(_ s: inout State, now: Date) -> Bool {
        guard let next = s.nextRotation, next <= now else { return false }
        let due = s.tokenRotations.filter { $0.value <= now }.sorted { $0.value < $1.value }
        for (token, at) in due {
            s.tokenRotations.removeValue(forKey: token)
            guard let owner = s.tokens[token], s.devices[owner.deviceID] != nil else { continue }
            let deviceID = owner.deviceID
            s.rotatedUnannounced.insert(deviceID)
            switch owner.kind {
            case .activity(let id):
                guard let i = indexLocked(s, activityID: id, deviceID: deviceID) else { continue }
                var a = s.devices[deviceID]!.activities[i]
                guard a.updateToken == token, a.state.isOngoing else { continue }
                retire(&s, token, at: at)
                issueUpdateToken(&s, &a, deviceID: deviceID, environment: owner.environment, rotates: false)
                s.devices[deviceID]!.activities[i] = a
                s.devices[deviceID]!.events.append(DeviceEvent(time: at, source: .system, activityID: id,
                    message: "ActivityKit changed the activity's push token by itself (pushTokenUpdates): the old one answers 410 from now. Apple: the token \"may change throughout its duration\" (seeded; docs/simulator.md)."))
            case .pushToStart(let type):
                replaceAppToken(&s, token, owner: owner, at: at, bytes: 40, holds: { $0.pushToStartTokens[type] == token }, set: { $0.pushToStartTokens[type] = $1 },
                                message: "ActivityKit changed the push-to-start token of \(owner.bundleID) (\(type)) by itself (pushToStartTokenUpdates): the old one answers 410 from now. Apple: it \"may change over time\" (seeded; docs/simulator.md).")
            case .control(let kind):
                replaceAppToken(&s, token, owner: owner, at: at, bytes: 32, holds: { $0.controlPushTokens[kind] == token },
                                set: { app, fresh in
                                    app.controlPushTokens[kind] = fresh
                                    app.controlsPushToken = app.controls.first.flatMap { app.controlPushTokens[$0] }
                                },
                                message: "WidgetKit changed the push token of \(owner.bundleID)'s control \(kind) by itself (pushTokensDidChange): the old one answers 410 from now (seeded; docs/simulator.md).")
            case .widgets:
                replaceAppToken(&s, token, owner: owner, at: at, bytes: 32, holds: { $0.widgetPushToken == token }, set: { $0.widgetPushToken = $1 },
                                message: "WidgetKit changed the widget push token of \(owner.bundleID) by itself: the old one answers 410 from now (seeded; docs/simulator.md).")
            default:
                continue
            }
        }
        s.nextRotation = s.tokenRotations.values.min()
        return !due.isEmpty
    }

    /// A rotated-away token: APNs answers 410 Unregistered for it from now on.
    func retire(_ s: inout State, _ token: String, at t: Date) {
        if var owner = s.tokens[token] {
            owner.kind = .retired(t)
            s.tokens[token] = owner
        }
    }

    func mutateApp<R>(_ bundleID: String, on deviceID: String, _ body: (inout State, inout SimulatedApp) throws(SimulatorError) -> R) throws(SimulatorError) -> R {
        try state.withLock { (s) throws(SimulatorError) -> R in
            guard var app = s.devices[deviceID]?.apps[bundleID] else { throw SimulatorError(.notFound, "\(bundleID) is not installed on \(deviceID)") }
            let r = try body(&s, &app)
            s.devices[deviceID]!.apps[bundleID] = app
            return r
        }
    }

    static func newToken(bytes: Int) -> String {
        Hex.encode((0..<bytes).map { _ in UInt8.random(in: 0...255) })
    }
}

/// Tells subscribers that something in the world may have changed: a subscriber for one device
/// hears of that device's changes and of the world's; one for the world hears of every change.
/// (A phone's app follows only its own device: a push to one phone wakes that phone's streams, not
/// every phone's, so thousands of simulated phones cost what they do one by one.)
public final class ChangeFeed: Sendable {
    private struct Subscribers {
        var world: [UUID: AsyncStream<Void>.Continuation] = [:]
        var byDevice: [String: [UUID: AsyncStream<Void>.Continuation]] = [:]
        var count = 0
    }
    private let subscribers = Mutex(Subscribers())
    public init() {}

    /// Changes anywhere (`device` nil) or to one device and to the world as a whole.
    public func subscribe(device: String? = nil) -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let id = UUID()
        subscribers.withLock { s in
            if let device { s.byDevice[device, default: [:]][id] = continuation } else { s.world[id] = continuation }
            s.count += 1
        }
        continuation.onTermination = { [weak self] _ in
            self?.subscribers.withLock { s in
                let removed: AsyncStream<Void>.Continuation?
                if let device {
                    removed = s.byDevice[device]?.removeValue(forKey: id)
                    if s.byDevice[device]?.isEmpty == true { s.byDevice[device] = nil }
                } else {
                    removed = s.world.removeValue(forKey: id)
                }
                if removed != nil { s.count -= 1 }
            }
        }
        return stream
    }

    /// How many are following now (a test waits for a long poll to be waiting with it).
    public var subscriberCount: Int { subscribers.withLock { $0.count } }

    /// Something changed that may touch any device (the clock moved, a broadcast went out).
    public func notify() {
        let all = subscribers.withLock { s in Array(s.world.values) + s.byDevice.values.flatMap(\.values) }
        for c in all { c.yield(()) }
    }

    /// Something changed on these devices only (none: only the world's subscribers hear of it).
    public func notify<C: Collection<String>>(devices: C) {
        let some = subscribers.withLock { s in Array(s.world.values) + devices.flatMap { s.byDevice[$0]?.values.map { $0 } ?? [] } }
        for c in some { c.yield(()) }
    }

    public func notify(device: String) { notify(devices: CollectionOfOne(device)) }
}
