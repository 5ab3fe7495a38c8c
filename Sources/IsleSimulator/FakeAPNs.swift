import Crypto
public import Foundation
import IsleCore
public import IsleHTTP2Server
public import Logging
import Synchronization

/// A provider key the fake APNs accepts (registered from its public half).
public struct RegisteredKey: Sendable, Hashable {
    public var keyID: String
    public var teamID: String
    public var publicKeyPEM: String
    /// Restrict the key to one environment (team-scoped keys can be); nil = both.
    public var environment: SimulatedEnvironment?
    /// The team's bundle ids the key may push to (a topic-specific key, or the team's apps);
    /// nil = any bundle id.
    public var bundleIDs: Set<String>?
    public init(keyID: String, teamID: String, publicKeyPEM: String, environment: SimulatedEnvironment? = nil, bundleIDs: Set<String>? = nil) {
        self.keyID = keyID
        self.teamID = teamID
        self.publicKeyPEM = publicKeyPEM
        self.environment = environment
        self.bundleIDs = bundleIDs
    }
}

/// A scripted failure: answer matching requests with this instead of the real answer.
public struct FailureRule: Sendable, Hashable, Codable {
    /// Only pushes to this device token (hex); nil = every request.
    public var token: String?
    public var status: Int?
    public var reason: String?
    /// How many requests it applies to; nil = until removed.
    public var remaining: Int?
    /// Added before answering.
    public var latencyMilliseconds: Int?
    /// Close the connection with GOAWAY after answering.
    public var goAway: Bool
    public init(token: String? = nil, status: Int? = nil, reason: String? = nil, remaining: Int? = 1, latencyMilliseconds: Int? = nil, goAway: Bool = false) {
        self.token = token
        self.status = status
        self.reason = reason
        self.remaining = remaining
        self.latencyMilliseconds = latencyMilliseconds
        self.goAway = goAway
    }
}

/// One request as the fake APNs saw it, the JWT redacted.
public struct LoggedRequest: Sendable, Hashable, Codable {
    public var time: Date
    public var connectionID: Int
    public var method: String
    public var path: String
    public var headers: [[String]]
    public var body: String
    public var status: Int
    public var reason: String?
    public var apnsID: String?
    public var outcome: PushOutcome?
    /// Why a refused request was refused, where the reason alone would mislead: a provider token
    /// judged against the simulator's own (virtual) clock says how far off that clock is and what
    /// to do. Also sent in the answer's `isle-sim-outcome` header.
    public var note: String? = nil
    /// Requests of this connection in flight when it arrived (itself included), and whether the
    /// connection had shown a valid provider token by then: before that, APNs allows one stream.
    public var concurrentStreams: Int = 1
    public var afterValidToken: Bool = false
}

/// A strict fake APNs: Apple's paths, status codes, reasons and response headers, over HTTP/2 + TLS.
/// It parses the wire itself and shares no code with IsleAPNs.
public final class FakeAPNs: Sendable {
    public let world: SimulatorWorld
    let logger: Logger
    let state: Mutex<State>

    struct Connection {
        var jwt: String?
        var jwtSetAt: Date?
        var teamID: String?
        /// The key of the first push: APNs binds the connection to it (docs/protocol.md §1.4).
        var keyID: String?
        /// A valid provider token has been seen (more than one stream allowed from then on).
        var validated = false
        /// After `TooManyProviderTokenUpdates` the connection is unusable until then (§1.3).
        var unusableUntil: Date?
        /// Error answers on this connection (when, points), for the GOAWAY after too many.
        var errors: [(at: Date, points: Int)] = []
    }

    /// Which of Apple's hosts a listener stands for (docs/protocol.md §1.1, §7; docs/protocol.md, Wire).
    public enum Host: String, Sendable {
        case device, broadcast, management
    }

    struct State {
        var keys: [String: RegisteredKey] = [:]
        var connections: [Int: Connection] = [:]
        var failures: [FailureRule] = []
        var log: [LoggedRequest] = []
        /// Entries before this index are past the cap (dropped in batches).
        var logStart = 0
        var verifiedJWTs: [String: Bool] = [:]
        /// Connections whose stream limit was raised.
        var raisedStreams: Set<Int> = []
        /// How far APNs' clock is ahead of the world's (seconds; negative: behind): a sender whose
        /// clock is wrong, as APNs sees its tokens' `iat`.
        var clockOffset: TimeInterval = 0
    }

    public static let maximumLoggedRequests = 10_000

    struct DecodedJWT: Sendable {
        var kid: String
        var iss: String
        var iat: Int64
        var signature: [UInt8]
    }
    /// When recent connections were accepted (real time: a connection storm happens in real time).
    let recentConnections = Mutex<[ContinuousClock.Instant]>([])
    /// Connections closed at once for coming too fast.
    let refusedConnectionCount = Atomic<Int>(0)
    public var refusedConnections: Int { refusedConnectionCount.load(ordering: .relaxed) }

    /// Whether a new connection is let in: Apple may treat repeatedly opening and closing
    /// connections as a denial of service and block the client for a while ("Sending notification
    /// requests to APNs"). Isle's assumption: more than ``SimulatorConfiguration/connectionRateLimit``
    /// in ``SimulatorConfiguration/connectionRateWindow`` are closed at once, until the window has fewer.
    public func admitConnection() -> Bool {
        let c = world.configuration
        guard c.connectionRateLimit > 0 else { return true }
        let now = ContinuousClock.now
        let window = Duration.milliseconds(Int64(c.connectionRateWindow * 1000))
        let admitted = recentConnections.withLock { t -> Bool in
            t.removeAll { now - $0 > window }
            guard t.count < c.connectionRateLimit else { return false }
            t.append(now)
            return true
        }
        if !admitted {
            if refusedConnectionCount.wrappingAdd(1, ordering: .relaxed).newValue == 1 {
                logger.warning("closing new connections: more than \(c.connectionRateLimit) within \(c.connectionRateWindow) s (APNs treats rapid connect/disconnect as a denial of service; docs/simulator.md)")
            }
        }
        return admitted
    }

    /// Connections whose provider-token history the fake APNs holds (open ones that sent a request).
    public var trackedConnections: Int { state.withLock { $0.connections.count } }

    /// A connection ended: its provider-token history and error count go (ids are never reused).
    public func connectionEnded(_ id: Int) {
        state.withLock { s in
            s.connections.removeValue(forKey: id)
            s.raisedStreams.remove(id)
        }
    }

    /// Tokens already decoded (well-formed ones only; the signature is checked per key in `State`).
    let decodedJWTs = Mutex<[String: DecodedJWT]>([:])

    public init(world: SimulatorWorld, logger: Logger) {
        self.world = world
        self.logger = logger
        state = Mutex(State())
    }

    /// The key registered under `keyID`, if any.
    public func registeredKey(_ keyID: String) -> RegisteredKey? { state.withLock { $0.keys[keyID] } }

    public func register(_ key: RegisteredKey) throws(SimulatorError) {
        guard (try? P256.Signing.PublicKey(pemRepresentation: key.publicKeyPEM)) != nil else {
            throw SimulatorError(.invalidArgument, "publicKeyPEM is not a P-256 public key in PEM form", field: "publicKeyPEM")
        }
        guard key.keyID.count == 10, key.teamID.count == 10 else { throw SimulatorError(.invalidArgument, "keyID and teamID must be 10 characters", field: key.keyID.count == 10 ? "teamID" : "keyID") }
        state.withLock { s in
            s.keys[key.keyID] = key
            // A key registered again (another public key, team or scope): tokens checked against
            // the old one are checked again.
            s.verifiedJWTs.removeAll()
        }
    }

    /// APNs' clock, ahead of the world's by `seconds` (negative: behind). A provider token's age
    /// is judged by it: 3,600 s ahead makes every token just signed look an hour old
    /// (`ExpiredProviderToken`), 301 s behind makes it look signed in the future (`InvalidProviderToken`).
    public var clockOffset: TimeInterval {
        get { state.withLock { $0.clockOffset } }
        set { state.withLock { $0.clockOffset = newValue } }
    }

    /// The provider keys it accepts.
    public var registeredKeys: [RegisteredKey] { state.withLock { Array($0.keys.values) } }
    public func addFailure(_ rule: FailureRule) { state.withLock { $0.failures.append(rule) } }
    public func clearFailures() { state.withLock { $0.failures.removeAll() } }
    public var requestLog: [LoggedRequest] { state.withLock { Array($0.log[$0.logStart...]) } }
    public func clearRequestLog() {
        state.withLock { s in
            s.log.removeAll()
            s.logStart = 0
        }
    }

    // MARK: Serving

    public func handle(_ request: HTTP2ServerRequest, on host: Host? = nil) async -> HTTP2ServerResponse {
        let apnsID = request.value("apns-id").flatMap { Self.isUUID($0) ? $0.lowercased() : nil } ?? UUID().uuidString.lowercased()
        let requestID = request.value("apns-request-id").flatMap { Self.isUUID($0) ? $0.lowercased() : nil } ?? UUID().uuidString.lowercased()
        let isDevice = request.path.hasPrefix("/3/device")
        let token = isDevice ? String(request.path.dropFirst("/3/device/".count)) : nil
        let validatedBefore = state.withLock { $0.connections[request.connectionID]?.validated ?? false }

        var response: HTTP2ServerResponse
        var reason: String?
        var outcome: PushOutcome?
        let failure = state.withLock { s -> FailureRule? in
            guard let i = s.failures.firstIndex(where: { $0.token == nil || $0.token == token }) else { return nil }
            let rule = s.failures[i]
            if let r = rule.remaining {
                if r <= 1 { s.failures.remove(at: i) } else { s.failures[i].remaining = r - 1 }
            }
            return rule
        }
        if let failure, let status = failure.status {
            reason = failure.reason
            response = Self.error(status, failure.reason ?? "InternalServerError")
        } else {
            (response, reason, outcome) = await route(request, token: token, apnsID: apnsID, requestID: requestID, host: host)
        }
        // The first valid provider token on a connection lifts the one-stream limit.
        if state.withLock({ s -> Bool in
            guard let c = s.connections[request.connectionID], c.validated, !s.raisedStreams.contains(request.connectionID) else { return false }
            s.raisedStreams.insert(request.connectionID)
            return true
        }) { response.maxConcurrentStreams = 1000 }
        if let failure {
            if let ms = failure.latencyMilliseconds { response.delay = .milliseconds(ms) }
            if failure.goAway { response.goAwayReason = failure.reason ?? "Shutdown" }
        }
        // Too many errors on one connection: APNs disconnects it, sooner for BadDeviceToken; 410 is
        // not an error (Apple, "Handling notification responses from APNs").
        let limits = world.configuration
        if limits.connectionErrorLimit > 0, (400...499).contains(response.status), response.status != 410, response.goAwayReason == nil {
            // Real time, as connections live in it (a virtual clock standing still would never age errors out).
            let now = Date()
            let points = reason == "BadDeviceToken" ? limits.badDeviceTokenErrorWeight : 1
            let close = state.withLock { s -> Bool in
                var c = s.connections[request.connectionID] ?? Connection()
                c.errors.removeAll { now.timeIntervalSince($0.at) >= limits.connectionErrorWindow }
                c.errors.append((now, points))
                let over = c.errors.reduce(0) { $0 + $1.points } >= limits.connectionErrorLimit
                if over { c.errors.removeAll() }
                s.connections[request.connectionID] = c
                return over
            }
            if close { response.goAwayReason = reason ?? "BadRequest" }
        }
        if isDevice {
            response.headers.insert(("apns-id", apnsID), at: 0)
            if response.status == 200, world.environment == .sandbox { response.headers.append(("apns-unique-id", UUID().uuidString.lowercased())) }
        } else {
            response.headers.insert(("apns-request-id", requestID), at: 0)
            if response.status == 200, request.path.hasPrefix("/4/broadcasts") { response.headers.append(("apns-unique-id", UUID().uuidString.lowercased())) }
        }
        let entry = LoggedRequest(
            time: world.clock.now, connectionID: request.connectionID, method: request.method, path: Self.redactPath(request.path),
            headers: request.headers.map { [$0.name, $0.name == "authorization" ? Self.redactJWT($0.value) : $0.value] },
            body: String(decoding: request.body.prefix(8192), as: UTF8.self), status: response.status, reason: reason, apnsID: isDevice ? apnsID : requestID, outcome: outcome,
            note: response.status >= 400 ? response.headers.first { $0.name == "isle-sim-outcome" }.map { String($0.value.dropFirst("refused: ".count)) } : nil,
            concurrentStreams: request.concurrentStreams, afterValidToken: validatedBefore)
        state.withLock { s in
            // The newest `maximumLoggedRequests` are kept; older ones are cut in one go once as many
            // again have piled up, so a long run does not shift the whole log on every request.
            s.log.append(entry)
            if s.log.count - s.logStart > Self.maximumLoggedRequests { s.logStart += 1 }
            if s.logStart >= Self.maximumLoggedRequests {
                s.log.removeFirst(s.logStart)
                s.logStart = 0
            }
        }
        return response
    }

    func route(_ r: HTTP2ServerRequest, token: String?, apnsID: String, requestID: String, host: Host?) async -> (HTTP2ServerResponse, String?, PushOutcome?) {
        func fail(_ status: Int, _ reason: String, timestamp: Date? = nil) -> (HTTP2ServerResponse, String?, PushOutcome?) {
            (Self.error(status, reason, timestamp: timestamp), reason, nil)
        }
        // Which endpoint? A device push (nearly every request) is told from its prefix alone.
        enum Endpoint { case device, broadcast(String), channels(String), allChannels(String) }
        let endpoint: Endpoint
        let devicePath = r.path.utf8.starts(with: "/3/device/".utf8)
        let parts: [String] = devicePath ? [] : (r.path.split(separator: "?").first.map(String.init) ?? r.path).split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if devicePath || (parts.count >= 3 && parts[1] == "3" && parts[2] == "device") {
            endpoint = .device
        } else if parts.count == 5, parts[1] == "4", parts[2] == "broadcasts", parts[3] == "apps" {
            endpoint = .broadcast(parts[4])
        } else if parts.count == 5, parts[1] == "1", parts[2] == "apps", parts[4] == "channels" {
            endpoint = .channels(parts[3])
        } else if parts.count == 5, parts[1] == "1", parts[2] == "apps", parts[4] == "all-channels" {
            endpoint = .allChannels(parts[3])
        } else {
            return fail(404, "BadPath")
        }
        // Each host serves its own paths: a broadcast sent to the device host (or the reverse) is
        // a path that host does not have.
        if let host {
            let served: Bool = switch endpoint {
            case .device: host == .device
            case .broadcast: host == .broadcast
            case .channels, .allChannels: host == .management
            }
            if !served { return fail(404, "BadPath") }
        }
        // Method.
        switch endpoint {
        case .device, .broadcast: if r.method != "POST" { return fail(405, "MethodNotAllowed") }
        case .channels: if !["POST", "GET", "DELETE"].contains(r.method) { return fail(405, "MethodNotAllowed") }
        case .allChannels: if r.method != "GET" { return fail(405, "MethodNotAllowed") }
        }
        // Duplicate headers.
        for i in r.headers.indices {
            for j in r.headers.indices where j > i && r.headers[j].name == r.headers[i].name { return fail(400, "DuplicateHeaders") }
        }
        // Provider token, and the topic it may push to.
        let bundle: String
        switch endpoint {
        case .device:
            let topic = r.value("apns-topic") ?? ""
            bundle = Self.suffixes.values.filter { !$0.isEmpty && topic.hasSuffix($0) }.max(by: { $0.count < $1.count }).map { String(topic.dropLast($0.count)) } ?? topic
        case .broadcast(let b), .channels(let b), .allChannels(let b):
            bundle = b
        }
        if let problem = checkJWT(r, bundle: bundle, isDevice: { if case .device = endpoint { true } else { false } }()) {
            var answer = fail(problem.status, problem.reason)
            if let note = problem.note { answer.0.headers.append(Self.refusalHeader(note)) }
            return answer
        }

        switch endpoint {
        case .device:
            return await devicePush(r, token: token ?? "", apnsID: apnsID)
        case .broadcast(let bundle):
            return broadcastPush(r, bundle: bundle, requestID: requestID)
        case .channels(let bundle):
            if bundle.contains(".push-type.") { return fail(400, "TopicDisallowed") }
            if let id = r.value("apns-request-id"), !Self.isUUID(id) { return fail(400, "BadMessageId") }
            return channelRequest(r, bundle: bundle)
        case .allChannels(let bundle):
            if bundle.contains(".push-type.") { return fail(400, "TopicDisallowed") }
            switch world.listChannels(bundleID: bundle) {
            case .list(let ids): return (HTTP2ServerResponse(status: 200, headers: [("content-type", "application/json")], body: JSONValue.object(["channels": .array(ids.map(JSONValue.string))]).jsonBytes), nil, nil)
            case .failure(let s, let reason): return fail(s, reason)
            default: return fail(500, "InternalServerError")
            }
        }
    }

    // MARK: JWT (docs/protocol.md §1.2–1.4, §11.1)

    func checkJWT(_ r: HTTP2ServerRequest, bundle: String, isDevice: Bool) -> (status: Int, reason: String, note: String?)? {
        guard let auth = r.value("authorization"), !auth.isEmpty else { return (403, "MissingProviderToken", nil) }
        // "bearer " in any case, without lowercasing the whole header (it is sent with every push).
        guard auth.utf8.count > 7, zip(auth.utf8.prefix(7), "bearer ".utf8).allSatisfy({ ($0 | 0x20) == $1 }) else { return (403, "InvalidProviderToken", nil) }
        var jwt = String(auth.dropFirst(7))
        if jwt.first?.isWhitespace == true || jwt.last?.isWhitespace == true { jwt = jwt.trimmingCharacters(in: .whitespaces) }
        // The same token comes with every request of a connection: decode it once.
        let decoded: DecodedJWT
        if let d = decodedJWTs.withLock({ $0[jwt] }) {
            decoded = d
        } else {
            let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
            guard parts.count == 3, let headerBytes = Self.base64URL(parts[0]), let claimBytes = Self.base64URL(parts[1]), let signature = Self.base64URL(parts[2]),
                  let header = try? JSONParser.parse(headerBytes), let claims = try? JSONParser.parse(claimBytes)
            else { return (403, "InvalidProviderToken", nil) }
            guard header["alg"] == "ES256", let kid = header["kid"]?.stringValue, let iss = claims["iss"]?.stringValue else { return (403, "InvalidProviderToken", nil) }
            // Apple documents iat as a number of seconds (an integer in its example). Some libraries
            // send a string of digits or a fraction, which APNs appears to take (docs/simulator.md):
            // refused by default, the stricter reading; `acceptsLooseIssuedAt` takes them.
            var issuedAt = claims["iat"]?.numberValue?.int64Value
            if issuedAt == nil, world.configuration.acceptsLooseIssuedAt {
                if let d = claims["iat"]?.numberValue?.doubleValue, d.isFinite, d >= 0, d < 1e15 { issuedAt = Int64(d) }
                if let s = claims["iat"]?.stringValue, !s.isEmpty, s.utf8.count <= 15, s.allSatisfy(\.isASCII), s.allSatisfy(\.isNumber) { issuedAt = Int64(s) }
            }
            guard let iat = issuedAt else { return (403, "InvalidProviderToken", nil) }
            decoded = DecodedJWT(kid: kid, iss: iss, iat: iat, signature: signature)
            decodedJWTs.withLock { c in
                if c.count > 10_000 { c.removeAll() }
                c[jwt] = decoded
            }
        }
        let (kid, iss, iat, signature) = (decoded.kid, decoded.iss, decoded.iat, decoded.signature)
        let now = world.clock.now
        let real = Date()
        let tokenClock = world.configuration.providerTokenClock
        return state.withLock { s -> (status: Int, reason: String, note: String?)? in
            var c = s.connections[r.connectionID] ?? Connection()
            // A connection that asked for new tokens too often stays unusable for a while (§1.3).
            if let until = c.unusableUntil, now < until { return (429, "TooManyProviderTokenUpdates", nil) }
            guard let key = s.keys[kid], key.teamID == iss else { return (403, "InvalidProviderToken", nil) }
            if let env = key.environment, env != world.environment { return (403, "BadEnvironmentKeyIdInToken", nil) }
            if s.verifiedJWTs[jwt] == nil {
                let ok = (try? P256.Signing.PublicKey(pemRepresentation: key.publicKeyPEM)).flatMap { pub in
                    (try? P256.Signing.ECDSASignature(rawRepresentation: signature)).map { pub.isValidSignature($0, for: Array(jwt.utf8[..<(jwt.utf8.lastIndex(of: UInt8(ascii: ".")) ?? jwt.utf8.endIndex)])) }
                } ?? false
                if s.verifiedJWTs.count > 10_000 { s.verifiedJWTs.removeAll() }
                s.verifiedJWTs[jwt] = ok
            }
            guard s.verifiedJWTs[jwt] == true else { return (403, "InvalidProviderToken", nil) }
            if let refusal = Self.judgeIssuedAt(iat, now: now, real: real, offset: s.clockOffset, clock: tokenClock, virtual: !(world.clock is SystemWallClock)) {
                return refusal
            }
            // One team per connection; the first push binds its key: another key of the team may
            // follow only if both are team-scoped for any bundle (§1.4).
            if let team = c.teamID, team != iss { return (403, "UnrelatedKeyIdInToken", nil) }
            if let first = c.keyID, first != kid, let firstKey = s.keys[first], firstKey.bundleIDs != nil || key.bundleIDs != nil || firstKey.environment != key.environment {
                return (403, "UnrelatedKeyIdInToken", nil)
            }
            // The key's topics: a device push elsewhere is disallowed, a broadcast or channel
            // request for another bundle does not match (§3.4, §7.4).
            if let bundles = key.bundleIDs, !bundles.contains(bundle) { return isDevice ? (400, "TopicDisallowed", nil) : (403, "TopicMismatch", nil) }
            if let previous = c.jwt, previous != jwt {
                if let at = c.jwtSetAt, now.timeIntervalSince(at) < 20 * 60 {
                    c.unusableUntil = at.addingTimeInterval(20 * 60)
                    s.connections[r.connectionID] = c
                    return (429, "TooManyProviderTokenUpdates", nil)
                }
            }
            if c.jwt != jwt {
                c.jwt = jwt
                c.jwtSetAt = now
            }
            c.teamID = iss
            if c.keyID == nil { c.keyID = kid }
            c.validated = true
            s.connections[r.connectionID] = c
            return nil
        }
    }

    /// A provider token's age: at most an hour (`ExpiredProviderToken`), at most five minutes in
    /// the future (`InvalidProviderToken`), judged by the simulator's clock — or, with
    /// ``SimulatorConfiguration/ProviderTokenClock/simulatorOrReal``, by it or real time. A refusal
    /// that the simulator's own clock explains (virtual and off real time, or APNs' clock offset
    /// set through the control API) carries a note saying so and what to do.
    static func judgeIssuedAt(_ iat: Int64, now: Date, real: Date, offset: TimeInterval, clock: SimulatorConfiguration.ProviderTokenClock,
                              virtual: Bool) -> (status: Int, reason: String, note: String?)? {
        func verdict(_ at: Date) -> String? {
            let age = at.timeIntervalSince1970 + offset - Double(iat)
            return age > 3600 ? "ExpiredProviderToken" : age < -300 ? "InvalidProviderToken" : nil
        }
        guard var reason = verdict(now) else { return nil }
        let byReal = verdict(real)
        if clock == .simulatorOrReal {
            // Valid by real time: taken. Refused by both: APNs' world is real time, so its reason.
            guard let realReason = byReal else { return nil }
            reason = realReason
        }
        let judgedAt = clock == .simulatorOrReal ? real : now
        let age = Int((judgedAt.timeIntervalSince1970 + offset - Double(iat)).rounded())
        let lag = Int((now.timeIntervalSince(real)).rounded())
        let clockName = clock == .simulatorOrReal ? "real time" : "the simulator's clock"
        let ageText = age < 0 ? "iat is \(-age) s ahead of \(clockName)" : "iat is \(age) s older than \(clockName) (at most 3600)"
        var causes: [String] = []
        // The virtual clock is the cause only when real time would take the token; APNs' clock
        // offset only when the token is fine without it.
        if virtual, abs(lag) >= 60, byReal == nil {
            if lag < 0 {
                causes.append("a virtual clock \(-lag) s behind real time: advance it (POST /clock/advance) or restart isle sim without --virtual-clock")
            } else {
                causes.append("a virtual clock \(lag) s ahead of real time: sign with its time (isle serve --clock-url) or restart isle sim")
            }
        }
        func verdictWithoutOffset(_ at: Date) -> Bool {
            let age = at.timeIntervalSince1970 - Double(iat)
            return age <= 3600 && age >= -300
        }
        if offset != 0, verdictWithoutOffset(judgedAt) {
            causes.append("APNs' clock is set \(Int(offset.rounded())) s \(offset > 0 ? "ahead" : "behind") (POST /apns/clock-offset)")
        }
        guard !causes.isEmpty else { return (403, reason, nil) }
        return (403, reason, "\(ageText), " + causes.joined(separator: "; "))
    }

    // MARK: Device pushes (docs/protocol.md §2, §3; docs/protocol.md, Isle's decisions)

    static let pushTypes: Set<String> = ["alert", "background", "complication", "controls", "fileprovider", "liveactivity", "location", "mdm", "pushtotalk", "voip", "widgets"]
    static let suffixes: [String: String] = [
        "alert": "", "background": "", "mdm": "", "complication": ".complication", "controls": ".push-type.controls", "fileprovider": ".pushkit.fileprovider",
        "liveactivity": ".push-type.liveactivity", "location": ".location-query", "pushtotalk": ".voip-ptt", "voip": ".voip", "widgets": ".push-type.widgets",
    ]

    func devicePush(_ r: HTTP2ServerRequest, token: String, apnsID: String) async -> (HTTP2ServerResponse, String?, PushOutcome?) {
        func fail(_ status: Int, _ reason: String, timestamp: Date? = nil) -> (HTTP2ServerResponse, String?, PushOutcome?) {
            (Self.error(status, reason, timestamp: timestamp), reason, nil)
        }
        if token.isEmpty { return fail(400, "MissingDeviceToken") }
        guard let pushType = r.value("apns-push-type"), Self.pushTypes.contains(pushType) else { return fail(400, "InvalidPushType") }
        guard let topic = r.value("apns-topic"), !topic.isEmpty else { return fail(400, "MissingTopic") }
        let suffix = Self.suffixes[pushType]!
        if !suffix.isEmpty, !topic.hasSuffix(suffix) {
            // A bare bundle id on a liveactivity push: the token is not for that topic (forum 712499).
            return fail(400, pushType == "liveactivity" || pushType == "widgets" ? "DeviceTokenNotForTopic" : "BadTopic")
        }
        var priority = 10
        if let p = r.value("apns-priority") {
            guard let v = Int(p), [1, 5, 10].contains(v) else { return fail(400, "BadPriority") }
            priority = v
        }
        if pushType == "background", priority == 10 { return fail(400, "BadPriority") }
        if let e = r.value("apns-expiration"), Int64(e).map({ $0 < 0 }) ?? true { return fail(400, "BadExpirationDate") }
        if let c = r.value("apns-collapse-id"), c.utf8.count > 64 { return fail(400, "BadCollapseId") }
        if let id = r.value("apns-id"), !Self.isUUID(id) { return fail(400, "BadMessageId") }
        if r.body.isEmpty { return fail(400, "PayloadEmpty") }
        if r.body.count > (pushType == "voip" ? 5120 : 4096) { return fail(413, "PayloadTooLarge") }
        guard token.count % 2 == 0, token.count >= 32, token.allSatisfy(\.isHexDigit) else { return fail(400, "BadDeviceToken") }
        guard let payload = try? JSONParser.parse(r.body), payload["aps"] != nil else {
            // APNs accepts any JSON object; the device cannot use it. Keep APNs' answer, explain in the outcome.
            let o = PushOutcome(.decodingFailed, "APNs accepted the push, but the payload is not a JSON object with aps; the device ignores it.")
            return (HTTP2ServerResponse(status: 200), nil, o)
        }
        let result = await world.deliver(token: token.lowercased(), pushType: pushType, topic: topic, priority: priority, payload: payload, apnsID: apnsID,
                                         expiration: r.value("apns-expiration").flatMap { Int64($0) }, collapseID: r.value("apns-collapse-id"))
        if result.status == 200 { return (HTTP2ServerResponse(status: 200, headers: Self.outcomeHeader(result.outcome)), nil, result.outcome) }
        return (Self.error(result.status, result.reason ?? "BadDeviceToken", timestamp: result.invalidSince), result.reason, result.outcome)
    }

    /// The simulator's own header on a 200: what the device did with the push (`code: sentence`,
    /// ASCII, at most 300 characters), so a sender can show it (Isle's console does). Apple's APNs
    /// sends nothing like it; a client must never depend on it.
    static func outcomeHeader(_ outcome: PushOutcome?) -> [(name: String, value: String)] {
        guard let outcome else { return [] }
        let whole = "\(outcome.code.rawValue): \(outcome.sentence)"
        // Most sentences are printable ASCII already: cut by bytes then, without a pass per character.
        if whole.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7f }) { return [("isle-sim-outcome", String(whole.utf8.prefix(300))!)] }
        let text = whole.unicodeScalars.map { $0.isASCII && $0.value >= 0x20 && $0.value != 0x7f ? Character($0) : "?" }
        return [("isle-sim-outcome", String(String(text).prefix(300)))]
    }

    /// `isle-sim-outcome: refused: …` on an error answer: why, when the reason alone would mislead
    /// (printable ASCII, at most 300 bytes, as the outcome header).
    static func refusalHeader(_ note: String) -> (name: String, value: String) {
        let text = ("refused: " + note).unicodeScalars.map { $0.isASCII && $0.value >= 0x20 && $0.value != 0x7f ? Character($0) : "?" }
        return ("isle-sim-outcome", String(String(text).prefix(300)))
    }

    // MARK: Broadcast (docs/protocol.md §7.3–7.4)

    func broadcastPush(_ r: HTTP2ServerRequest, bundle: String, requestID: String) -> (HTTP2ServerResponse, String?, PushOutcome?) {
        func fail(_ status: Int, _ reason: String) -> (HTTP2ServerResponse, String?, PushOutcome?) { (Self.error(status, reason), reason, nil) }
        if bundle.contains(".push-type.") { return fail(400, "TopicDisallowed") }
        if let id = r.value("apns-request-id"), !Self.isUUID(id) { return fail(400, "BadMessageId") }
        guard let channel = r.value("apns-channel-id"), !channel.isEmpty else { return fail(400, "MissingChannelId") }
        guard Data(base64Encoded: channel) != nil, channel.count <= 256 else { return fail(400, "BadChannelId") }
        guard let pushType = r.value("apns-push-type") else { return fail(400, "MissingPushType") }
        guard pushType.lowercased() == "liveactivity" else { return fail(400, "InvalidPushType") }
        guard let p = r.value("apns-priority"), let priority = Int(p), [1, 5, 10].contains(priority) else { return fail(400, "BadPriority") }
        guard let e = r.value("apns-expiration"), let expiration = Int64(e), expiration >= 0 else { return fail(400, "BadExpirationDate") }
        if r.body.isEmpty { return fail(400, "PayloadEmpty") }
        if r.body.count > 5120 { return fail(413, "PayloadTooLarge") }
        let policy: Int
        switch world.readChannel(bundleID: bundle, id: channel) {
        case .found(let p): policy = p
        case .failure(let status, let reason): return fail(status, reason)
        default: return fail(400, "ChannelNotRegistered")
        }
        // Every check comes before the fan-out: nothing reaches a device for a non-2xx answer.
        if policy == 0, expiration != 0 { return fail(400, "BadExpirationDate") }
        guard let payload = try? JSONParser.parse(r.body) else { return fail(400, "BadRequestPayload") }
        guard let (_, outcomes) = world.broadcast(bundleID: bundle, channelID: channel, priority: priority, payload: payload, requestID: requestID,
                                                  expiration: expiration) else {
            return fail(400, "ChannelNotRegistered")
        }
        let summary = PushOutcome(.applied, "Broadcast to \(outcomes.count) subscribed activit\(outcomes.count == 1 ? "y" : "ies"): " +
            Dictionary(grouping: outcomes, by: \.code).map { "\($0.value.count) \($0.key.rawValue)" }.sorted().joined(separator: ", "))
        return (HTTP2ServerResponse(status: 200), nil, summary)
    }

    // MARK: Channel management (docs/protocol.md §7.2)

    func channelRequest(_ r: HTTP2ServerRequest, bundle: String) -> (HTTP2ServerResponse, String?, PushOutcome?) {
        func fail(_ status: Int, _ reason: String) -> (HTTP2ServerResponse, String?, PushOutcome?) { (Self.error(status, reason), reason, nil) }
        switch r.method {
        case "POST":
            guard !r.body.isEmpty else { return fail(400, "PayloadEmpty") }
            guard let body = (try? JSONParser.parse(r.body))?.objectValue else { return fail(400, "BadRequestPayload") }
            if body.keys.contains(where: { $0 != "message-storage-policy" && $0 != "push-type" }) { return fail(400, "BadRequestParams") }
            guard let type = body["push-type"]?.stringValue else { return fail(400, "MissingPushType") }
            guard type == "LiveActivity" else { return fail(400, "InvalidPushType") }
            guard let policy = body["message-storage-policy"]?.numberValue?.int64Value, policy == 0 || policy == 1 else { return fail(400, "BadRequestParams") }
            switch world.createChannel(bundleID: bundle, storagePolicy: Int(policy)) {
            case .created(let id): return (HTTP2ServerResponse(status: 201, headers: [("apns-channel-id", id)]), nil, nil)
            case .failure(let s, let reason): return fail(s, reason)
            default: return fail(500, "InternalServerError")
            }
        default:
            guard let id = r.value("apns-channel-id"), !id.isEmpty else { return fail(400, "MissingChannelId") }
            guard Data(base64Encoded: id) != nil else { return fail(400, "BadChannelId") }
            let result = r.method == "GET" ? world.readChannel(bundleID: bundle, id: id) : world.deleteChannel(bundleID: bundle, id: id)
            switch result {
            case .found(let policy):
                let body: JSONValue = ["message-storage-policy": .int(policy), "push-type": "LiveActivity"]
                return (HTTP2ServerResponse(status: 200, headers: [("apns-channel-id", id), ("content-type", "application/json")], body: body.jsonBytes), nil, nil)
            case .deleted: return (HTTP2ServerResponse(status: 204), nil, nil)
            case .failure(let s, let reason): return fail(s, reason)
            default: return fail(500, "InternalServerError")
            }
        }
    }

    // MARK: Helpers

    static func error(_ status: Int, _ reason: String, timestamp: Date? = nil) -> HTTP2ServerResponse {
        var body: JSONObject = ["reason": .string(reason)]
        if status == 410 { body["timestamp"] = .int(Int64(((timestamp ?? Date()).timeIntervalSince1970 * 1000).rounded())) }
        return HTTP2ServerResponse(status: status, headers: [("content-type", "application/json")], body: JSONValue.object(body).jsonBytes)
    }

    /// 8-4-4-4-12 hexadecimal digits (either case), read as bytes.
    static func isUUID(_ s: String) -> Bool {
        var count = 0
        for (i, b) in s.utf8.enumerated() {
            count += 1
            if i == 8 || i == 13 || i == 18 || i == 23 {
                guard b == UInt8(ascii: "-") else { return false }
            } else {
                guard (0x30...0x39).contains(b) || (0x41...0x46).contains(b) || (0x61...0x66).contains(b) else { return false }
            }
        }
        return count == 36
    }

    static func base64URL(_ s: Substring) -> [UInt8]? {
        guard !s.contains("=") else { return nil }
        var t = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while t.count % 4 != 0 { t += "=" }
        return Data(base64Encoded: t).map(Array.init)
    }

    /// `bearer <redacted kid=… iss=… iat=…>`: enough to debug, nothing to replay.
    /// The same token comes with every request of a connection: redact it once.
    static let redactedJWTs = Mutex<[String: String]>([:])

    static func redactJWT(_ value: String) -> String {
        if let done = redactedJWTs.withLock({ $0[value] }) { return done }
        let redacted = redactJWTUncached(value)
        redactedJWTs.withLock { c in
            if c.count > 1_000 { c.removeAll() }
            c[value] = redacted
        }
        return redacted
    }

    static func redactJWTUncached(_ value: String) -> String {
        let jwt = value.dropFirst(7)
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let h = base64URL(parts[0]).flatMap({ try? JSONParser.parse($0) }), let c = base64URL(parts[1]).flatMap({ try? JSONParser.parse($0) }) else {
            return "bearer <redacted>"
        }
        return "bearer <redacted kid=\(h["kid"]?.stringValue ?? "?") iss=\(c["iss"]?.stringValue ?? "?") iat=\(c["iat"]?.briefDescription ?? "?")>"
    }

    /// Device tokens in paths are shortened in the log.
    static func redactPath(_ path: String) -> String {
        guard path.hasPrefix("/3/device/") else { return path }
        let token = path.dropFirst("/3/device/".count)
        return token.count > 12 ? "/3/device/\(token.prefix(6))…\(token.suffix(6))" : path
    }
}
