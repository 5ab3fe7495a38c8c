public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// The app side of Isle: hands the server every activity's push token (and each rotation), the
/// push-to-start tokens, the widget push token, the person's Live Activity settings, and what the
/// person did (dismissed, ended) — and keeps doing it across a flaky network and app restarts.
///
/// ```swift
/// let isle = try IsleClient(serverURL: url, deviceKey: "isle_device_…")   // Keychain storage
/// await isle.track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber }
/// Task { await isle.run() }
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
        /// Called after every request the client makes (a debug log, a test's eyes). Never given
        /// the installation secret or a whole token.
        public var log: (@Sendable (LogEntry) -> Void)?
        public init(serverURL: URL, deviceKey: String, environment: Environment? = Environment.ofRunningBuild()) {
            self.serverURL = serverURL
            self.deviceKey = deviceKey
            self.environment = environment
        }
    }

    /// One request the client made, and how it ended.
    public struct LogEntry: Sendable, Hashable, CustomStringConvertible {
        /// What the report was: `installation`, `register`, `token`, `dismissed`, `ended`.
        public var report: String
        public var method: String
        public var path: String
        /// The server's status; nil when no answer came (network, server away).
        public var status: Int?
        /// `sent`, `retrying`, `refused` or `new installation`.
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
    var wakeup: AsyncStream<Void>.Continuation?
    var tasks: [Task<Void, Never>] = []

    /// The shared client of an app: its state in the Keychain on Apple platforms (a file in the
    /// caches directory elsewhere), the environment read from the build.
    public init(serverURL: URL, deviceKey: String, storage: (any IsleClientStorage)? = nil) throws {
        try self.init(configuration: Configuration(serverURL: serverURL, deviceKey: deviceKey), storage: storage ?? Self.defaultStorage())
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

    /// Loads what an earlier launch kept (a new installation id the first time).
    public init(configuration: Configuration, storage: any IsleClientStorage, session: URLSession = .shared) throws {
        self.configuration = configuration
        self.storage = storage
        self.session = session
        if let data = try storage.load() {
            state = try JSONDecoder().decode(ClientState.self, from: data)
        } else {
            state = ClientState(installationID: UUID().uuidString.lowercased())
        }
    }

    public var installationID: String { state.installationID }
    /// Reports waiting to be sent.
    public var pendingReports: Int { state.outbox.count }
    /// Reports the server refused for good, with its reason.
    public var refusedReports: [String] { state.refused }
    /// The server's id for an activity, once its registration went through.
    public func serverID(of activityID: String) -> String? { state.serverIDs[activityID] }

    // MARK: What the app reports

    /// The installation: push-to-start tokens (by attributes type), the widget push token, the
    /// person's settings. Only what is given changes.
    public func reportInstallation(pushToStartToken: (type: String, token: Data)? = nil, widgetToken: Data? = nil, liveActivitiesEnabled: Bool? = nil,
                                   frequentPushesEnabled: Bool? = nil) {
        let before = (state.pushToStartTokens, state.widgetToken, state.liveActivitiesEnabled, state.frequentPushesEnabled, state.environment)
        if let (type, token) = pushToStartToken { state.pushToStartTokens[type] = token.hex }
        if let widgetToken { state.widgetToken = widgetToken.hex }
        if let liveActivitiesEnabled { state.liveActivitiesEnabled = liveActivitiesEnabled }
        if let frequentPushesEnabled { state.frequentPushesEnabled = frequentPushesEnabled }
        state.environment = configuration.environment?.rawValue
        // Every launch reports what it reads; the server hears only what changed (or everything,
        // until the installation is registered).
        let unchanged = before.0 == state.pushToStartTokens && before.1 == state.widgetToken && before.2 == state.liveActivitiesEnabled
            && before.3 == state.frequentPushesEnabled && before.4 == state.environment
        if unchanged, state.secret != nil { return }
        add(.installation, lane: ClientState.installationLane)
    }

    /// An activity's push token: the first registers the activity, later ones are rotations.
    ///
    /// `externalKey` binds the activity to your backend's key (an order id) only with `ticket`,
    /// the registration ticket your backend signed for that key (docs/security.md) — the device
    /// key is public, so the server never takes a key on the app's word. Without a ticket, a key
    /// only links an activity your backend started by push-to-start on this installation; any
    /// other activity is registered by its id alone (``serverID(of:)``: hand it to your backend).
    public func reportToken(activityID: String, attributesType: String, token: Data, externalKey: String?, ticket: String? = nil, topics: [String] = []) {
        guard state.lastTokens[activityID] != token.hex else { return }
        state.lastTokens[activityID] = token.hex
        if state.registered.insert(activityID).inserted {
            state.types[activityID] = attributesType
            if let ticket { state.tickets[activityID] = ticket }
            add(.register(local: activityID, attributesType: attributesType, token: token.hex, externalKey: externalKey, topics: topics), lane: ClientState.lane(activityID))
        } else {
            add(.token(local: activityID, token: token.hex), lane: ClientState.lane(activityID))
        }
    }

    /// The person dismissed the activity (`dismissed`), or it ended (`ended`).
    public func reportState(activityID: String, _ s: LiveActivityState) {
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
        wakeup?.yield()
    }

    func persist() {
        guard !stopped else { return }
        // A failed save loses nothing in memory; the next change saves again.
        if let data = try? JSONEncoder().encode(state) { try? storage.save(data) }
    }

    // MARK: Observing ActivityKit

    /// Keeps the server in step with one attributes type: the activities that exist now and their
    /// current tokens first (nothing issued while the app was not running is missed), then every
    /// token, state and activity as it comes; the push-to-start token and the settings too.
    /// `externalKey` names an activity for the backend: a push-started one is matched by it; any
    /// other is bound to it only with `ticket`, your backend's registration ticket for that key
    /// (see ``reportToken(activityID:attributesType:token:externalKey:ticket:topics:)``).
    public func track<Kit: LiveActivityKit>(_ kit: Kit, topics: @escaping @Sendable (Kit.Handle) -> [String] = { _ in [] },
                                            externalKey: @escaping @Sendable (Kit.Handle) -> String?,
                                            ticket: @escaping @Sendable (Kit.Handle) -> String? = { _ in nil }) {
        let type = kit.attributesType
        reportInstallation(liveActivitiesEnabled: kit.areActivitiesEnabled, frequentPushesEnabled: kit.frequentPushesEnabled)
        if let token = kit.pushToStartToken { reportInstallation(pushToStartToken: (type, token)) }
        var seen = Set<String>()
        for a in kit.activities {
            seen.insert(a.id)
            observe(a, type: type, topics: topics, externalKey: externalKey, ticket: ticket)
        }
        // Registered earlier, and no longer listed: the person or the system dismissed it while
        // the app was not running (ActivityKit lists no dismissed activity).
        for (local, t) in state.types where t == type && !seen.contains(local) {
            reportState(activityID: local, .dismissed)
        }
        let already = seen
        tasks.append(Task { [weak self] in
            var known = already
            for await a in kit.activityUpdates where known.insert(a.id).inserted {
                await self?.observe(a, type: type, topics: topics, externalKey: externalKey, ticket: ticket)
            }
        })
        tasks.append(Task { [weak self] in
            for await token in kit.pushToStartTokenUpdates { await self?.reportInstallation(pushToStartToken: (type, token)) }
        })
        tasks.append(Task { [weak self] in
            for await on in kit.activityEnablementUpdates { await self?.reportInstallation(liveActivitiesEnabled: on) }
        })
        tasks.append(Task { [weak self] in
            for await on in kit.frequentPushEnablementUpdates { await self?.reportInstallation(frequentPushesEnabled: on) }
        })
    }

    /// Keeps the server in step with one activity (its token, rotations, dismissal, end), for an
    /// app that tracks activities one by one rather than a whole attributes type.
    public func track<H: LiveActivityHandle>(activity: H, attributesType: String, topics: [String] = [], externalKey: String?, ticket: String? = nil) {
        observe(activity, type: attributesType, topics: { _ in topics }, externalKey: { _ in externalKey }, ticket: { _ in ticket })
    }

    func observe<H: LiveActivityHandle>(_ a: H, type: String, topics: @escaping @Sendable (H) -> [String], externalKey: @escaping @Sendable (H) -> String?,
                                        ticket: @escaping @Sendable (H) -> String?) {
        if let token = a.pushToken { reportToken(activityID: a.id, attributesType: type, token: token, externalKey: externalKey(a), ticket: ticket(a), topics: topics(a)) }
        tasks.append(Task { [weak self] in
            for await token in a.pushTokenUpdates {
                await self?.reportToken(activityID: a.id, attributesType: type, token: token, externalKey: externalKey(a), ticket: ticket(a), topics: topics(a))
            }
        })
        tasks.append(Task { [weak self] in
            for await s in a.activityStateUpdates { await self?.reportState(activityID: a.id, s) }
        })
    }

    /// Stops observing and sending.
    public func stop() {
        stopped = true
        for t in tasks { t.cancel() }
        tasks.removeAll()
        wakeup?.finish()
    }

    // MARK: Sending

    /// Sends reports until the outbox is empty or nothing more is due; runs until ``stop()``.
    /// Call it once, in a task of the app's.
    public func run() async {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        wakeup = continuation
        continuation.yield()
        var iterator = stream.makeAsyncIterator()
        while !Task.isCancelled {
            let wait = await flush()
            if let wait {
                // Woken by a new report, or when the next retry is due.
                let timer = Task { [weak self] in
                    try? await Task.sleep(for: .milliseconds(Int(min(3600, max(0.01, wait)) * 1000)))
                    await self?.wakeup?.yield()
                }
                guard await iterator.next(isolation: self) != nil else { timer.cancel(); return }
                timer.cancel()
            } else {
                guard await iterator.next(isolation: self) != nil else { return }
            }
        }
    }

    /// Sends every report that is due, in order per lane. Answers how long until the next retry
    /// is due (nil: nothing is waiting).
    @discardableResult
    public func flush() async -> TimeInterval? {
        guard !flushing else { return configuration.firstRetry }
        flushing = true
        defer { flushing = false }
        while !stopped {
            let now = Date()
            // The head of each lane, if due.
            var heads: [String: Report] = [:]
            for r in state.outbox where heads[r.lane] == nil { heads[r.lane] = r }
            // Activities are registered under the installation: until it has its secret, they wait.
            if state.secret == nil {
                if heads[ClientState.installationLane] == nil { state.add(Report(key: UUID().uuidString.lowercased(), lane: ClientState.installationLane, kind: .installation)) }
                heads = heads.filter { $0.key == ClientState.installationLane }
                if let i = state.outbox.first(where: { $0.lane == ClientState.installationLane }) { heads[ClientState.installationLane] = i }
            }
            let due = heads.values.filter { $0.notBefore <= now }.sorted { ($0.lane == ClientState.installationLane ? "" : $0.lane) < ($1.lane == ClientState.installationLane ? "" : $1.lane) }
            if due.isEmpty {
                let next = heads.values.map(\.notBefore).min()
                return next.map { max(0, $0.timeIntervalSince(now)) }
            }
            for r in due { await send(r) }
        }
        return nil
    }

    enum Outcome {
        case done(serverID: String?, secret: String?)
        case retry(after: TimeInterval?)
        case refused(String)
        /// The installation's secret is lost: start over under a new installation id.
        case newInstallation
    }

    func send(_ report: Report) async {
        guard !stopped, let i = state.outbox.firstIndex(where: { $0.key == report.key }) else { return }
        // The request is fixed at its first attempt and every retry repeats it exactly: its
        // Idempotency-Key stands for this one request (the server refuses the key with another
        // body), and what changed since goes in a newer report.
        if state.outbox[i].request == nil {
            switch makeRequest(state.outbox[i]) {
            case .success(let r): state.outbox[i].request = r
            case .failure(let why):
                state.refused.append(why.message)
                state.outbox.remove(at: i)
                persist()
                return
            }
        }
        state.outbox[i].attempts += 1
        persist()
        let frozen = state.outbox[i]
        let outcome = await perform(frozen)
        // Stopped meanwhile (the app is going away): like a process that died here, the answer is
        // not written; the next launch repeats the request with the same key.
        guard !stopped, let j = state.outbox.firstIndex(where: { $0.key == report.key }) else { return }
        switch outcome {
        case .done(let id, let secret):
            if let secret { state.secret = secret }
            if case .register(let local, _, _, _, _) = report.kind {
                if let id { state.serverIDs[local] = id }
                state.tickets[local] = nil
            }
            state.outbox.remove(at: j)
        case .retry(let after):
            let attempts = state.outbox[j].attempts
            let backoff = min(configuration.maximumRetry, configuration.firstRetry * pow(2, Double(max(0, attempts - 1))))
            state.outbox[j].notBefore = Date().addingTimeInterval(max(after ?? 0, backoff))
        case .refused(let why):
            state.refused.append(why)
            state.outbox.remove(at: j)
            // Nothing after a refused registration can reach the server.
            if case .register(let local, _, _, _, _) = report.kind {
                state.outbox.removeAll { $0.lane == ClientState.lane(local) }
                state.registered.remove(local)
                state.types[local] = nil
                state.tickets[local] = nil
            }
        case .newInstallation:
            state.installationID = UUID().uuidString.lowercased()
            state.secret = nil
            // Every request made for the old id is made anew, under a new key.
            for k in state.outbox.indices where state.outbox[k].request != nil || k == j {
                state.outbox[k].attempts = 0
                state.outbox[k].key = UUID().uuidString.lowercased()
                state.outbox[k].request = nil
            }
        }
        persist()
    }

    /// One request with a completion handler, not `URLSession.data(for:)`: on Linux
    /// (swift-corelibs-foundation), cancelling a task whose `data(for:)` is finishing can deadlock
    /// the session's queue against the task's status lock (seen in this SDK's tests). A request is
    /// bounded by `requestTimeout` instead of by cancellation.
    func transfer(_ request: URLRequest) async throws -> (Data, URLResponse) {
        let session = self.session
        return try await withCheckedThrowingContinuation { (c: CheckedContinuation<(Data, URLResponse), any Error>) in
            session.dataTask(with: request) { data, response, error in
                if let error {
                    c.resume(throwing: error)
                } else if let response {
                    c.resume(returning: (data ?? Data(), response))
                } else {
                    c.resume(throwing: URLError(.badServerResponse))
                }
            }.resume()
        }
    }

    struct RequestError: Error { var message: String }

    /// The report as a request, from the state as it is now.
    func makeRequest(_ report: Report) -> Result<Report.Request, RequestError> {
        var body: [String: Any] = [:]
        let method: String
        let path: String
        switch report.kind {
        case .installation:
            method = "PUT"
            path = "/v1/installations/\(state.installationID)"
            if !state.pushToStartTokens.isEmpty { body["pushToStartTokens"] = state.pushToStartTokens }
            if let w = state.widgetToken { body["widgetToken"] = w }
            if let e = state.liveActivitiesEnabled { body["liveActivitiesEnabled"] = e }
            if let f = state.frequentPushesEnabled { body["frequentPushesEnabled"] = f }
            if let e = configuration.environment { body["environment"] = e.rawValue }
        case .register(let local, let type, let token, let key, let topics):
            method = "POST"
            path = "/v1/activities"
            body = ["attributesType": type, "token": token, "installationID": state.installationID]
            if let key { body["externalKey"] = key }
            if key != nil, let ticket = state.tickets[local] { body["ticket"] = ticket }
            if !topics.isEmpty { body["topics"] = topics }
            if let e = configuration.environment { body["environment"] = e.rawValue }
        case .token(let local, let token):
            guard let id = state.serverIDs[local] else { return .failure(RequestError(message: "token rotation for activity \(local), which the server never registered")) }
            method = "PUT"
            path = "/v1/activities/\(id)/token"
            body = ["token": token]
        case .state(let local, let what):
            guard let id = state.serverIDs[local] else { return .failure(RequestError(message: "\(what) for activity \(local), which the server never registered")) }
            method = "POST"
            path = "/v1/activities/\(id)/\(what)"
        }
        let data = (try? JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])) ?? Data("{}".utf8)
        return .success(Report.Request(method: method, path: path, body: data))
    }

    func perform(_ report: Report) async -> Outcome {
        guard let frozen = report.request else { return .retry(after: nil) }
        let method = frozen.method, path = frozen.path
        guard let url = URL(string: configuration.serverURL.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + path) else { return .refused("bad URL \(path)") }
        var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
        request.httpMethod = method
        request.setValue("Bearer \(configuration.deviceKey)", forHTTPHeaderField: "Authorization")
        request.setValue(report.key, forHTTPHeaderField: "Idempotency-Key")
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        if let secret = state.secret { request.setValue(secret, forHTTPHeaderField: "Isle-Installation-Secret") }
        request.httpBody = frozen.body
        let data: Data
        let response: HTTPURLResponse
        let name = Self.name(report.kind)
        do {
            let (d, r) = try await transfer(request)
            guard let http = r as? HTTPURLResponse else { return logged(.retry(after: nil), name, method, path, nil) }
            (data, response) = (d, http)
        } catch {
            // The network, or the server away: try again later.
            return logged(.retry(after: nil), name, method, path, nil)
        }
        let json = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        return logged(Self.outcome(response, json: json, report: report, hasSecret: state.secret != nil, method: method, path: path), name, method, path, response.statusCode)
    }

    static func name(_ kind: Report.Kind) -> String {
        switch kind {
        case .installation: "installation"
        case .register: "register"
        case .token: "token"
        case .state(_, let what): what
        }
    }

    func logged(_ outcome: Outcome, _ report: String, _ method: String, _ path: String, _ status: Int?) -> Outcome {
        guard let log = configuration.log else { return outcome }
        let text = switch outcome {
        case .done: "sent"
        case .retry: "retrying"
        case .refused: "refused"
        case .newInstallation: "new installation"
        }
        log(LogEntry(report: report, method: method, path: path, status: status, outcome: text))
        return outcome
    }

    static func outcome(_ response: HTTPURLResponse, json: [String: Any]?, report: Report, hasSecret: Bool, method: String, path: String) -> Outcome {
        switch response.statusCode {
        case 200..<300:
            return .done(serverID: json?["id"] as? String, secret: json?["installationSecret"] as? String)
        case 429, 500..<600:
            // Retry-After in seconds, bounded: a server's odd value never parks the outbox for ever.
            let after = response.value(forHTTPHeaderField: "Retry-After").flatMap(TimeInterval.init).map { $0.isFinite ? min(3600, max(0, $0)) : 60 }
            return .retry(after: after)
        case 403 where report.kind == .installation && !hasSecret:
            // Registered before, but its one-time secret was lost with an answer: a new installation.
            return .newInstallation
        case 409 where (json?["error"] as? [String: Any])?["code"] as? String == "idempotencyKeyInUse":
            return .retry(after: 1)
        default:
            let error = json?["error"] as? [String: Any]
            return .refused("\(method) \(path): \(response.statusCode) \(error?["code"] as? String ?? "") \(error?["message"] as? String ?? "")")
        }
    }
}
