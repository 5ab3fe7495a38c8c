import Foundation
import Hummingbird
import HTTPTypes
import IsleCore
import IsleStore
import Logging
import NIOCore
import Crypto
import IsleAPNs

struct API: Sendable {
    let store: any IsleStore
    let engine: DeliveryEngine
    let clock: any WallClock
    let logger: Logger
    var limiter: RateLimiter? = nil
    let keys = ExpiringCache<APIKeyRecord?>()
    let metricsCache = ExpiringCache<[PushJobState: Int]?>()

    /// The app, as the engine sees it (read at most once a second).
    func app(_ bundleID: String) async throws -> AppRecord? { try await engine.apps.app(bundleID, store: store) }

    // MARK: Plumbing

    func authorize(_ request: Request, _ scope: APIKeyScope) async throws -> Caller {
        guard let header = request.headers[.authorization], header.lowercased().hasPrefix("bearer ") else {
            throw APIError(.unauthorized, "unauthenticated", "send the API key as Authorization: Bearer isle_…")
        }
        let secret = String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        let hash = APIKeys.hash(secret)
        // Read at most once a second per key: a revocation takes effect within a second.
        guard let key = try await keys.value(hash, load: { try await store.apiKey(secretHash: hash) }), key.revokedAt == nil else {
            throw APIError(.unauthorized, "unauthenticated", "the API key is unknown or revoked")
        }
        guard key.scope == scope else {
            throw APIError(.forbidden, "wrongScope", "this endpoint needs a \(scope.rawValue) key; this is a \(key.scope.rawValue) key")
        }
        try limiter?.check(keyID: key.id, scope: key.scope)
        return Caller(bundleID: key.bundleID, scope: key.scope, keyID: key.id)
    }

    static func json(_ value: JSONValue, _ status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: value.jsonBytes)))
    }

    /// Runs a write at most once per `Idempotency-Key`: a repeat gets the first answer; the same
    /// key with a different request is refused.
    func idempotent(_ request: Request, _ caller: Caller, _ bytes: [UInt8], _ body: (IdempotencyRecord?) async throws -> (HTTPResponse.Status, JSONValue)) async throws -> Response {
        guard let key = request.headers[HTTPField.Name("Idempotency-Key")!] else {
            let (status, value) = try await body(nil)
            return Self.json(value, status)
        }
        guard !key.isEmpty, key.utf8.count <= 255, key.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw APIError.invalid("Idempotency-Key", "Idempotency-Key must be 1 to 255 printable ASCII characters, without spaces")
        }
        let hash = Hex.encode(SHA256.hash(data: Array("\(request.method.rawValue) \(request.uri.path)\n".utf8) + bytes))
        // Keys live per app and per key scope: a device cannot take a key the backend will use.
        let scopedKey = "\(caller.scope.rawValue):\(key)"
        func replay() async throws -> Response? {
            guard let done = try await store.idempotencyRecord(bundleID: caller.bundleID, key: scopedKey), !done.isExpired(now: clock.now) else { return nil }
            guard done.requestHash == hash else {
                throw APIError(.conflict, "idempotencyKeyReused", "this Idempotency-Key was used for a different request in the last 24 hours", field: "Idempotency-Key")
            }
            var r = Response(status: .init(code: done.status), headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: done.body)))
            r.headers[HTTPField.Name("Idempotent-Replay")!] = "true"
            return r
        }
        if let answer = try await replay() { return answer }
        // The record is written with the work (atomically with the jobs when there are jobs).
        let pending = IdempotencyRecord(key: scopedKey, bundleID: caller.bundleID, requestHash: hash, status: 0, body: "", createdAt: clock.now)
        do {
            let (status, value) = try await body(pending)
            return Self.json(value, status)
        } catch let error as StoreError where error.code == .conflict {
            // A concurrent request with the same key committed first: its answer is this one's.
            if let answer = try await replay() { return answer }
            throw APIError(.conflict, "idempotencyKeyInUse", "a request with this Idempotency-Key is being processed; retry it shortly", field: "Idempotency-Key")
        }
    }

    /// The record to commit with the work: the answer, and (`jobs`) the ids of the jobs queued
    /// with it, added by the store inside the transaction so a replay is the whole first answer.
    func finishIdempotency(_ pending: IdempotencyRecord?, _ status: HTTPResponse.Status, _ value: JSONValue, jobs: Bool = false) -> IdempotencyRecord? {
        guard var p = pending else { return nil }
        p.status = status.code
        p.body = value.jsonString
        p.jobsField = jobs ? "jobs" : nil
        return p
    }

    // MARK: Sizes (docs/security.md): nothing unbounded is stored

    enum Limits {
        static let id = 128
        static let externalKey = 256
        static let topic = 128
        static let topics = 32
        static let attributesType = 128
        static let pushToStartTypes = 32
        /// Attributes and content state each, serialized (a Live Activity payload is at most 4 KB).
        static let activityJSON = 4096
    }

    /// A string field, at most `limit` bytes.
    static func bounded(_ value: String?, _ field: String, _ limit: Int) throws -> String? {
        guard let value else { return nil }
        // Counted in Unicode scalars, as JSON Schema's maxLength counts (the document states the limits).
        guard !value.isEmpty, value.unicodeScalars.count <= limit else { throw APIError.invalid(field, "\(field) must be 1 to \(limit) characters (got \(value.unicodeScalars.count))") }
        return value
    }

    /// An id from the path, at most ``Limits/id`` bytes.
    static func pathID(_ value: String, _ name: String) throws -> String {
        guard !value.isEmpty, value.unicodeScalars.count <= Limits.id else { throw APIError.invalid(name, "the \(name) id must be 1 to \(Limits.id) characters") }
        return value
    }

    /// Attributes or content state an app registers: an object within the size limit that
    /// decodes with the registered schema, when there is one.
    static func checkedObject(_ value: JSONValue?, _ field: String, schema: ObjectSchema?) throws -> JSONValue? {
        guard let value, !value.isNull else { return nil }
        guard value.objectValue != nil else { throw APIError.invalid(field, "\(field) must be an object") }
        let size = value.jsonBytes.count
        guard size <= Limits.activityJSON else {
            throw APIError(.unprocessableContent, "tooLarge", "\(field) is \(size) bytes; a Live Activity's \(field) must fit a 4 KB payload (at most \(Limits.activityJSON))", field: field)
        }
        if let schema, let first = schema.decode(value, path: field).mismatches.first {
            throw APIError(.unprocessableContent, "schemaMismatch", "\(first.path): expected \(first.expected), found \(first.found)", field: Self.field(first.path))
        }
        return value
    }

    // MARK: Installation secrets (docs/security.md)

    static let installationSecretHeader = HTTPField.Name("Isle-Installation-Secret")!

    /// 32 random bytes, base64url: handed to the app once, at its installation's first registration.
    static func newInstallationSecret() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return "isle_inst_" + Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    static func secretHash(_ secret: String) -> String { Hex.encode(SHA256.hash(data: Array(secret.utf8))) }

    /// Compares two hashes without an early exit.
    static func sameHash(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for i in 0..<x.count { difference |= x[i] ^ y[i] }
        return difference == 0
    }

    /// The device must present the installation's secret (when it has one).
    static func checkSecret(_ presented: String?, of installation: InstallationRecord) throws {
        guard let hash = installation.secretHash else { return }
        guard let presented, !presented.isEmpty else {
            throw APIError(.forbidden, "installationSecretRequired", "installation \(installation.id) is registered: present its secret in the Isle-Installation-Secret header", field: "Isle-Installation-Secret")
        }
        guard sameHash(secretHash(presented), hash) else {
            throw APIError(.forbidden, "wrongInstallationSecret", "the Isle-Installation-Secret header does not match installation \(installation.id)'s secret", field: "Isle-Installation-Secret")
        }
    }

    /// Device calls on an activity that belongs to an installation need that installation's secret.
    func checkActivitySecret(_ request: Request, activityID: String, bundleID: String) async throws {
        guard let a = try await store.activity(id: activityID), a.bundleID == bundleID else { return }
        guard let installationID = a.installationID, let inst = try await store.installation(id: installationID) else { return }
        try Self.checkSecret(request.headers[Self.installationSecretHeader], of: inst)
    }

    // MARK: Routes

    func addRoutes(to router: Router<BasicRequestContext>) {
        router.get("health") { _, _ in API.json(["status": "ok"]) }
        router.get("ready") { _, _ in
            do {
                try await store.ping()
            } catch {
                throw APIError(.serviceUnavailable, "notReady", "the database is not reachable")
            }
            // Ready to accept work; apps whose deliveries are paused or backing off are named.
            let held = engine.circuits.all.filter { $0.value.mode != .running }.sorted { $0.key < $1.key }
            var o: JSONObject = ["status": held.isEmpty ? "ready" : "degraded"]
            if !held.isEmpty { o["apps"] = .array(held.map { API.json(bundleID: $0.key, $0.value) }) }
            return API.json(.object(o))
        }
        // The calling app's delivery status: running, backing off (APNs failing) or paused (a
        // configuration error), with the reason; `resume` probes at once after a fix.
        router.get("v1/app") { request, _ in
            let caller = try await authorize(request, .backend)
            return API.json(API.json(bundleID: caller.bundleID, engine.circuits.circuit(caller.bundleID)))
        }
        router.post("v1/app/resume") { request, _ in
            let caller = try await authorize(request, .backend)
            engine.circuits.resume(caller.bundleID, now: clock.now)
            try await store.wakeApp(bundleID: caller.bundleID, now: clock.now)
            engine.wake()
            return API.json(API.json(bundleID: caller.bundleID, engine.circuits.circuit(caller.bundleID)))
        }
        router.get("metrics") { _, _ in
            // Open work only, along partial indexes, and at most once a second however often
            // /metrics is asked; everything else is counted as it happens (swift-metrics into a
            // Prometheus registry).
            let counts = try await metricsCache.value("open", load: { try await store.openJobCounts() }) ?? [:]
            engine.counters.metrics.openJobs(counts)
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"], body: .init(byteBuffer: ByteBuffer(bytes: engine.counters.metrics.text())))
        }
        router.get("openapi.json") { _, _ in
            Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: OpenAPIDocument.json)))
        }

        // Device scope
        router.put("v1/installations/:installation") { request, context in
            let caller = try await authorize(request, .device)
            let id = try Self.pathID(try context.parameters.decoded("installation"), "installation")
            let (b, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                if b.object["userID"] != nil {
                    throw APIError.invalid("userID", "userID is bound by your backend (PUT /v1/installations/{id}/user with the backend key): the device key is public, so Isle never takes a user id on the device's word")
                }
                let presented = request.headers[Self.installationSecretHeader]
                let newSecret = Self.newInstallationSecret()
                let newHash = Self.secretHash(newSecret)
                var tokens: [String: String?] = [:]
                if let t = b.object["pushToStartTokens"] {
                    guard let o = t.objectValue else { throw APIError.invalid("pushToStartTokens", "pushToStartTokens must be an object: attributes type → hex token") }
                    guard o.count <= Limits.pushToStartTypes else { throw APIError.invalid("pushToStartTokens", "at most \(Limits.pushToStartTypes) attributes types") }
                    for (type, value) in o {
                        _ = try Self.bounded(type, "pushToStartTokens.\(type.prefix(40))", Limits.attributesType)
                        if value.isNull { tokens[type] = .some(nil); continue }
                        guard let s = value.stringValue, let t = try? DeviceToken(hex: s) else { throw APIError.invalid("pushToStartTokens.\(type)", "pushToStartTokens.\(type) must be a hex token") }
                        tokens[type] = .some(t.hex)
                    }
                }
                let clearsWidget = b.object["widgetToken"]?.isNull == true
                let widget = clearsWidget ? nil : try b.token("widgetToken", required: false)
                let enabled = try b.bool("liveActivitiesEnabled")
                let frequent = try b.bool("frequentPushesEnabled")
                let now = clock.now
                let bundleID = caller.bundleID
                let newTokens = tokens
                // Read, change and write in one transaction: two reports never undo each other.
                let inst = try await store.modifyInstallation(id: id, create: { InstallationRecord(id: id, bundleID: bundleID, updatedAt: now) }) { inst in
                    guard inst.bundleID == bundleID else { throw APIError.notFound("installation \(id)") }
                    // The first registration gets the secret; every later one must present it.
                    // (An installation from before secrets existed gets one at its next registration.)
                    if inst.secretHash == nil { inst.secretHash = newHash } else { try Self.checkSecret(presented, of: inst) }
                    for (type, token) in newTokens { inst.pushToStartTokens[type] = token }
                    if clearsWidget { inst.widgetToken = nil } else if let widget { inst.widgetToken = widget }
                    if let enabled { inst.liveActivitiesEnabled = enabled }
                    if let frequent { inst.frequentPushesEnabled = frequent }
                    inst.updatedAt = now
                }
                let value = Self.json(inst)
                // The idempotency record never holds the secret (a replay is answered to anyone
                // who repeats the request): an app that loses this answer registers anew under
                // a new installation id.
                if let r = finishIdempotency(pending, .ok, value) { try await store.saveIdempotencyRecord(r) }
                if inst.secretHash == newHash, case .object(var o) = value {
                    // Shown once: the app keeps it (the Keychain) and sends it with every later call.
                    o["installationSecret"] = .string(newSecret)
                    return (.ok, .object(o))
                }
                return (.ok, value)
            }
        }

        // The backend binds an installation to its user (for push-to-start to a user's devices).
        router.put("v1/installations/:installation/user") { request, context in
            let caller = try await authorize(request, .backend)
            let id = try context.parameters.decoded("installation")
            let (b, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                guard b.object.keys.contains("userID") else { throw APIError.invalid("userID", "give userID: the backend's id for the person (a string), or null to unbind") }
                let userID = b.object["userID"]?.isNull == true ? nil : try b.string("userID")
                if let userID, userID.isEmpty || userID.utf8.count > 256 { throw APIError.invalid("userID", "userID must be 1 to 256 bytes") }
                guard let existing = try await store.installation(id: id), existing.bundleID == caller.bundleID else { throw APIError.notFound("installation \(id)") }
                let inst = try await store.modifyInstallation(id: id, create: { existing }) { $0.userID = userID }
                let value = Self.json(inst)
                if let r = finishIdempotency(pending, .ok, value) { try await store.saveIdempotencyRecord(r) }
                return (.ok, value)
            }
        }

        router.post("v1/activities") { request, _ in
            let caller = try await authorize(request, .device)
            let (b, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                let type = try Self.bounded(try b.string("attributesType", required: true), "attributesType", Limits.attributesType)!
                let channelID = try Self.bounded(try b.string("channelID"), "channelID", Limits.id)
                if let channelID, try await store.channel(id: channelID)?.bundleID != caller.bundleID {
                    throw APIError(.notFound, "notFound", "\(channelID) is not a channel of \(caller.bundleID)", field: "channelID")
                }
                let tokenOrNil = try b.token("token", required: channelID == nil)
                let key = try Self.bounded(try b.string("externalKey"), "externalKey", Limits.externalKey)
                guard let app = try await app(caller.bundleID) else { throw APIError.notFound("app \(caller.bundleID)") }
                guard app.schema(type) != nil || app.schemas.isEmpty else {
                    throw APIError(.notFound, "unknownAttributesType", "\(caller.bundleID) has no attributes type \(type); registered: \(app.schemas.map(\.attributesType).joined(separator: ", "))", field: "attributesType")
                }
                if let token = tokenOrNil, let existing = try await store.activity(updateToken: token), existing.state.acceptsPushes {
                    throw APIError(.conflict, "tokenInUse", "this token belongs to activity \(existing.id)", field: "token")
                }
                let topics = try b.strings("topics") ?? []
                guard topics.count <= Limits.topics else { throw APIError.invalid("topics", "at most \(Limits.topics) topics") }
                for (i, t) in topics.enumerated() { _ = try Self.bounded(t, "topics[\(i)]", Limits.topic) }
                let installationID = try Self.bounded(try b.string("installationID"), "installationID", Limits.id)
                let schema = app.schema(type)
                let attributes = try Self.checkedObject(b.object["attributes"], "attributes", schema: schema?.attributes)
                let contentState = try Self.checkedObject(b.object["contentState"], "contentState", schema: schema?.contentState)
                if let installationID {
                    guard let inst = try await store.installation(id: installationID), inst.bundleID == caller.bundleID else {
                        throw APIError.invalid("installationID", "no installation \(installationID): register it first with PUT /v1/installations/{id}")
                    }
                    try Self.checkSecret(request.headers[Self.installationSecretHeader], of: inst)
                }
                if let key, installationID == nil,
                   try await store.liveActivities(bundleID: caller.bundleID, externalKey: key).contains(where: { $0.state == .starting && $0.installationID != nil }) {
                    throw APIError(.forbidden, "installationSecretRequired", "the activity \(key) was started on an installation: register its token with that installationID and the Isle-Installation-Secret header", field: "installationID")
                }
                // A push-started activity reports its update token: link it (to the activity
                // started on this installation, when the app says which it is).
                if let key, let token = tokenOrNil,
                   let started = try await store.linkStartedActivity(bundleID: caller.bundleID, externalKey: key, attributesType: type, installationID: installationID, token: token, topics: topics) {
                    try await store.wakeLane(activityID: started.id, now: clock.now)
                    engine.wake()
                    let value = Self.json(started)
                    if let r = finishIdempotency(pending, .ok, value) { try await store.saveIdempotencyRecord(r) }
                    return (.ok, value)
                }
                // A backend key names one activity (or one per device, after a push-to-start to a
                // user): another installation cannot take it over.
                if let key, let other = try await store.liveActivities(bundleID: caller.bundleID, externalKey: key).first(where: { $0.installationID == nil || $0.installationID != installationID }) {
                    throw APIError(.conflict, "externalKeyInUse", "\(key) is the key of live activity \(other.id)\(other.installationID == nil ? "" : " on another installation"); end it first or use another key", field: "externalKey")
                }
                let a = ActivityRecord(id: "act_" + UUID().uuidString.lowercased(), bundleID: caller.bundleID, externalKey: key, installationID: installationID, attributesType: type,
                                       attributes: attributes, content: contentState, state: .active, updateToken: tokenOrNil, channelID: channelID,
                                       relevanceScore: try b.number("relevanceScore"), startedAt: clock.now, topics: topics)
                try await store.insertActivity(a)
                let value = Self.json(a)
                if let r = finishIdempotency(pending, .created, value) { try await store.saveIdempotencyRecord(r) }
                return (.created, value)
            }
        }

        router.put("v1/activities/:activity/token") { request, context in
            let caller = try await authorize(request, .device)
            let (b, bytes) = try await Body.read(request)
            let id = try context.parameters.decoded("activity")
            return try await idempotent(request, caller, bytes) { pending in
                try await checkActivitySecret(request, activityID: id, bundleID: caller.bundleID)
                let token = try b.token("token", required: true)!
                if let holder = try await store.activity(updateToken: token), holder.id != id, holder.state.acceptsPushes {
                    throw APIError(.conflict, "tokenInUse", "this token belongs to activity \(holder.id)", field: "token")
                }
                let bundleID = caller.bundleID
                guard let a = try await store.modifyActivity(id: id, { a in
                    guard a.bundleID == bundleID else { throw APIError.notFound("activity \(id)") }
                    // A token rotated on the device may reach us after APNs answered 410 for the old
                    // one: a new token brings an unreachable activity back.
                    guard a.state.acceptsPushes || a.state == .unreachable else {
                        throw APIError(.conflict, "activityEnded", "the activity is \(a.state.rawValue); its token is no longer used")
                    }
                    a.updateToken = token
                    if a.state == .starting || a.state == .unreachable {
                        a.state = .active
                        a.stateReason = nil
                    }
                }) else { throw APIError.notFound("activity \(id)") }
                // A job waiting for this token goes now.
                try await store.wakeLane(activityID: id, now: clock.now)
                engine.wake()
                let value = Self.json(a)
                if let r = finishIdempotency(pending, .ok, value) { try await store.saveIdempotencyRecord(r) }
                return (.ok, value)
            }
        }

        router.post("v1/activities/:activity/:report") { request, context in
            let caller = try await authorize(request, .device)
            let report = try context.parameters.decoded("report")
            guard report == "dismissed" || report == "ended" else { throw APIError.notFound("/v1/activities/…/\(report)") }
            let id = try context.parameters.decoded("activity")
            let (_, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                try await checkActivitySecret(request, activityID: id, bundleID: caller.bundleID)
                let now = clock.now
                let bundleID = caller.bundleID
                guard let a = try await store.modifyActivity(id: id, { a in
                    guard a.bundleID == bundleID else { throw APIError.notFound("activity \(id)") }
                    if a.endedAt == nil { a.endedAt = now }
                    if report == "dismissed" {
                        a.state = .dismissed
                        a.dismissedAt = now
                        a.stateReason = "the person dismissed it"
                    } else if a.state.acceptsPushes {
                        a.state = .ended
                        a.stateReason = "the app ended it"
                    }
                }) else { throw APIError.notFound("activity \(id)") }
                let value = Self.json(a)
                if let r = finishIdempotency(pending, .ok, value) { try await store.saveIdempotencyRecord(r) }
                return (.ok, value)
            }
        }

        // Channels (iOS 18 broadcast)
        router.post("v1/channels") { request, _ in
            let caller = try await authorize(request, .backend)
            let (b, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                if let unknown = b.object.keys.first(where: { $0 != "storagePolicy" }) {
                    throw APIError.invalid(unknown, "unknown field \(unknown); a channel takes storagePolicy (0 or 1)")
                }
                // Compared as a number first: converting an out-of-range Double to Int would trap.
                let requested = try b.number("storagePolicy") ?? 0
                guard requested == 0 || requested == 1 else { throw APIError.invalid("storagePolicy", "storagePolicy must be 0 (no message stored) or 1 (most recent stored)") }
                let policy = requested == 1 ? 1 : 0
                guard let app = try await app(caller.bundleID) else { throw APIError.notFound("app \(caller.bundleID)") }
                let channel: BroadcastChannel
                do {
                    channel = try await engine.clients.client(for: app).createChannel(bundleID: app.bundleID, storagePolicy: MessageStoragePolicy(rawValue: policy)!)
                } catch let e as APNsError {
                    throw APIError(.badGateway, "apnsRejected", "APNs did not create the channel: \(e.message)")
                }
                let record = ChannelRecord(id: channel.id, bundleID: app.bundleID, storagePolicy: policy, createdAt: clock.now)
                try await store.insertChannel(record)
                let value: JSONValue = ["id": .string(record.id), "storagePolicy": .int(policy)]
                if let r = finishIdempotency(pending, .created, value) { try await store.saveIdempotencyRecord(r) }
                return (.created, value)
            }
        }
        router.get("v1/channels") { request, _ in
            let caller = try await authorize(request, .backend)
            return Self.json(.array(try await store.channels(bundleID: caller.bundleID).map { ["id": .string($0.id), "storagePolicy": .int($0.storagePolicy)] }))
        }
        router.delete("v1/channels/:channel") { request, context in
            let caller = try await authorize(request, .backend)
            let id = try context.parameters.decoded("channel")
            guard let c = try await store.channel(id: id), c.bundleID == caller.bundleID, let app = try await app(caller.bundleID) else { throw APIError.notFound("channel \(id)") }
            do { try await engine.clients.client(for: app).deleteChannel(bundleID: app.bundleID, channelID: id) } catch let e as APNsError where e.response?.reason != .channelNotRegistered {
                throw APIError(.badGateway, "apnsRejected", "APNs did not delete the channel: \(e.message)")
            }
            try await store.deleteChannel(id: id)
            return Response(status: .noContent)
        }
        for event in ["update", "end"] {
            router.post("v1/channels/:channel/\(event)") { request, context in
                let caller = try await authorize(request, .backend)
                let id = try context.parameters.decoded("channel")
                let (b, bytes) = try await Body.read(request)
                return try await idempotent(request, caller, bytes) { pending in
                    guard let channel = try await store.channel(id: id), channel.bundleID == caller.bundleID else { throw APIError.notFound("channel \(id)") }
                    let (aps, priority) = try Self.updateOrEnd(b, event: event)
                    var withTimestamp = aps
                    withTimestamp["timestamp"] = .int(Int64(clock.now.timeIntervalSince1970))
                    let report = PayloadValidator(options: .init(pushType: .liveactivity, broadcast: true, priority: priority.flatMap(PushPriority.init(rawValue:)), now: clock.now))
                        .validate(bytes: JSONValue.object(["aps": .object(withTimestamp)]).jsonBytes)
                    if let e = report.errors.first { throw APIError(.unprocessableContent, e.code.rawValue, "\(e.message) \(e.fix)", field: Self.field(e.path)) }
                    let job = NewPushJob(bundleID: caller.bundleID, kind: .broadcast, channelID: id, aps: .object(aps), hasAlert: aps["alert"] != nil, requestedPriority: priority,
                                         runAt: max(try b.date("sendAt") ?? clock.now, clock.now))
                    let value: JSONValue = ["accepted": 1]
                    let ids = try await store.enqueue([job], idempotency: finishIdempotency(pending, .accepted, value, jobs: true), now: clock.now)
                    engine.wake()
                    return (.accepted, ["accepted": 1, "jobs": .array(ids.map { .int($0) })])
                }
            }
        }

        // Backend scope
        for event in ["update", "end"] {
            router.post("v1/activities/:activity/\(event)") { request, context in
                let caller = try await authorize(request, .backend)
                let id = try context.parameters.decoded("activity")
                return try await enqueueForActivities(request, caller, event: event) { try await [ownActivity(caller, id)] }
            }
            router.post("v1/activities/by-key/:key/\(event)") { request, context in
                let caller = try await authorize(request, .backend)
                let key = try context.parameters.decoded("key")
                // Every live activity with the key: one per device after a push-to-start to a user.
                return try await enqueueForActivities(request, caller, event: event) {
                    let live = try await store.liveActivities(bundleID: caller.bundleID, externalKey: key)
                    if !live.isEmpty { return live }
                    guard let a = try await store.activity(bundleID: caller.bundleID, externalKey: key) else { throw APIError.notFound("activity with key \(key)") }
                    return [a]
                }
            }
            router.post("v1/topics/:topic/\(event)") { request, context in
                let caller = try await authorize(request, .backend)
                let topic = try context.parameters.decoded("topic")
                return try await enqueueForActivities(request, caller, event: event, fanOut: true) {
                    try await store.activities(bundleID: caller.bundleID, topic: topic)
                }
            }
        }

        router.post("v1/installations/:installation/start") { request, context in
            let caller = try await authorize(request, .backend)
            let id = try context.parameters.decoded("installation")
            return try await startActivities(request, caller) {
                guard let i = try await store.installation(id: id), i.bundleID == caller.bundleID else { throw APIError.notFound("installation \(id)") }
                return [i]
            }
        }
        router.post("v1/users/:user/start") { request, context in
            let caller = try await authorize(request, .backend)
            let user = try context.parameters.decoded("user")
            return try await startActivities(request, caller) {
                let all = try await store.installations(bundleID: caller.bundleID, userID: user)
                guard !all.isEmpty else { throw APIError.notFound("installations of user \(user)") }
                return all
            }
        }
        router.post("v1/installations/:installation/widgets/reload") { request, context in
            let caller = try await authorize(request, .backend)
            let id = try context.parameters.decoded("installation")
            let (_, bytes) = try await Body.read(request)
            return try await idempotent(request, caller, bytes) { pending in
                guard let i = try await store.installation(id: id), i.bundleID == caller.bundleID else { throw APIError.notFound("installation \(id)") }
                guard i.widgetToken != nil else { throw APIError(.conflict, "noWidgetToken", "the installation has not registered a widget push token") }
                let job = NewPushJob(bundleID: caller.bundleID, kind: .widgets, installationID: id, aps: ["content-changed": true], hasAlert: false, requestedPriority: 10, runAt: clock.now)
                let value: JSONValue = ["accepted": 1]
                let ids = try await store.enqueue([job], idempotency: finishIdempotency(pending, .accepted, value, jobs: true), now: clock.now)
                engine.wake()
                return (.accepted, ["accepted": 1, "jobs": .array(ids.map { .int($0) })])
            }
        }

        // Reads
        router.get("v1/activities/:activity") { request, context in
            let caller = try await authorize(request, .backend)
            return try await activityView(try await ownActivity(caller, try context.parameters.decoded("activity")), request: request)
        }
        router.get("v1/activities/by-key/:key") { request, context in
            let caller = try await authorize(request, .backend)
            let key = try context.parameters.decoded("key")
            guard let a = try await store.activity(bundleID: caller.bundleID, externalKey: key) else { throw APIError.notFound("activity with key \(key)") }
            return try await activityView(a, request: request)
        }
        router.get("v1/deliveries/:apnsID") { request, context in
            let caller = try await authorize(request, .backend)
            let id = try context.parameters.decoded("apnsID").lowercased()
            guard let d = try await store.delivery(apnsID: id) else { throw APIError.notFound("delivery \(id)") }
            if let aid = d.activityID {
                _ = try await ownActivity(caller, aid)
            } else {
                // Widget and broadcast deliveries: the job says whose they are.
                guard let job = try await store.job(id: d.jobID), job.bundleID == caller.bundleID else { throw APIError.notFound("delivery \(id)") }
            }
            return Self.json(Self.json(d))
        }
    }

    func ownActivity(_ caller: Caller, _ id: String) async throws -> ActivityRecord {
        guard let a = try await store.activity(id: id), a.bundleID == caller.bundleID else { throw APIError.notFound("activity \(id)") }
        return a
    }

    /// The activity with a page of its delivery history: the newest `deliveries` (default 100,
    /// at most 1,000) before `before` (a delivery id), oldest first; `moreDeliveries.before` pages on.
    func activityView(_ a: ActivityRecord, request: Request) async throws -> Response {
        var o = Self.json(a).objectValue!
        let query = request.uri.queryParameters
        var limit = 100
        if let text = query["deliveries"] {
            guard let n = Int(String(text)), (1...1000).contains(n) else { throw APIError.invalid("deliveries", "deliveries must be a whole number from 1 to 1000") }
            limit = n
        }
        var before: Int64?
        if let text = query["before"] {
            guard let n = Int64(String(text)), n > 0 else { throw APIError.invalid("before", "before must be a delivery id (a positive whole number)") }
            before = n
        }
        let page = try await store.deliveries(activityID: a.id, before: before, limit: limit + 1)
        let shown = page.count > limit ? Array(page.dropFirst()) : page
        o["deliveries"] = .array(shown.map(Self.json))
        if page.count > limit, let oldest = shown.first?.id { o["moreDeliveries"] = ["before": .int(oldest)] }
        return Self.json(.object(o))
    }

    // MARK: Enqueueing

    /// Builds, validates and enqueues one update or end for each activity.
    func enqueueForActivities(_ request: Request, _ caller: Caller, event: String, fanOut: Bool = false, _ targets: () async throws -> [ActivityRecord]) async throws -> Response {
        let (b, bytes) = try await Body.read(request)
        return try await idempotent(request, caller, bytes) { pending in
            guard let app = try await app(caller.bundleID) else { throw APIError.notFound("app \(caller.bundleID)") }
            let (aps, priority) = try Self.updateOrEnd(b, event: event)
            let runAt = max(try b.date("sendAt") ?? clock.now, clock.now)
            let activities = try await targets()
            var warnings: [JSONValue] = []
            var checked: Set<String> = []
            for a in activities where !checked.contains(a.attributesType) {
                checked.insert(a.attributesType)
                warnings += try validate(aps, schema: app.schema(a.attributesType), priority: priority)
            }
            if !fanOut, let a = activities.first, !a.state.acceptsPushes {
                throw APIError(.conflict, "activityNotLive", "the activity is \(a.state.rawValue)\(a.stateReason.map { ": \($0)" } ?? ""); Isle sends nothing more to it")
            }
            let live = activities.filter { $0.state.acceptsPushes }
            let jobs = live.map {
                NewPushJob(bundleID: caller.bundleID, kind: event == "end" ? .end : .update, activityID: $0.id, aps: .object(aps), hasAlert: aps["alert"] != nil,
                           requestedPriority: priority, runAt: runAt)
            }
            var value: JSONObject = ["accepted": .int(jobs.count)]
            if !warnings.isEmpty { value["warnings"] = .array(warnings) }
            if !fanOut, live.count == 1 { value["activityID"] = .string(live[0].id) }
            if !fanOut, live.count > 1 { value["activityIDs"] = .array(live.map { .string($0.id) }) }
            let ids = try await store.enqueue(jobs, idempotency: finishIdempotency(pending, .accepted, .object(value), jobs: !fanOut), now: clock.now)
            engine.wake()
            if !fanOut { value["jobs"] = .array(ids.map { .int($0) }) }
            return (.accepted, .object(value))
        }
    }

    /// The `aps` of an update or end (without its timestamp, added at send time) from a request
    /// body — for activities and channels alike — and the priority asked for.
    static func updateOrEnd(_ b: Body, event: String) throws -> (JSONObject, Int?) {
        var aps: JSONObject = ["event": .string(event)]
        if let s = try b.object("contentState", required: event == "update") { aps["content-state"] = s }
        if let alert = try b.alert() { aps["alert"] = alert }
        if let d = try b.date("staleDate") { aps["stale-date"] = .int(Int64(d.timeIntervalSince1970)) }
        if let r = try b.number("relevanceScore") { aps["relevance-score"] = .double(r) }
        if event == "end", let d = try b.date("dismissalDate") { aps["dismissal-date"] = .int(Int64(d.timeIntervalSince1970)) }
        if event == "update", b.object["dismissalDate"] != nil { throw APIError.invalid("dismissalDate", "dismissalDate applies to end only") }
        let priority = try b.priority()
        _ = try b.date("sendAt")
        for k in b.object.keys where !["contentState", "alert", "staleDate", "relevanceScore", "dismissalDate", "priority", "sendAt"].contains(k) {
            throw APIError.invalid(k, "unknown field \(k); expected contentState, alert, staleDate, relevanceScore, dismissalDate (end), priority, sendAt")
        }
        return (aps, priority)
    }

    /// Push-to-start to installations: records a `starting` activity for each and queues the start.
    func startActivities(_ request: Request, _ caller: Caller, _ targets: () async throws -> [InstallationRecord]) async throws -> Response {
        let (b, bytes) = try await Body.read(request)
        return try await idempotent(request, caller, bytes) { pending in
            guard let app = try await app(caller.bundleID) else { throw APIError.notFound("app \(caller.bundleID)") }
            let type = try b.string("attributesType", required: true)!
            guard let schema = app.schema(type) else {
                throw APIError(.notFound, "unknownAttributesType", "\(caller.bundleID) has no attributes type \(type) (names are case-sensitive); registered: \(app.schemas.map(\.attributesType).joined(separator: ", "))", field: "attributesType")
            }
            let attributes = try b.object("attributes", required: true)!
            let state = try b.object("contentState", required: true)!
            guard let alert = try b.alert() else { throw APIError.invalid("alert", "a start needs an alert: the device drops a push-to-start without one") }
            var aps: JSONObject = ["event": "start", "content-state": state, "attributes-type": .string(type), "attributes": attributes, "alert": alert, "input-push-token": 1]
            if let d = try b.date("staleDate") { aps["stale-date"] = .int(Int64(d.timeIntervalSince1970)) }
            if let r = try b.number("relevanceScore") { aps["relevance-score"] = .double(r) }
            let warnings = try validate(aps, schema: schema, priority: 10)
            let key = try b.string("externalKey")
            let topics = try b.strings("topics") ?? []
            let installations = try await targets()
            var jobs: [NewPushJob] = []
            var activities: [ActivityRecord] = []
            var started: [JSONValue] = []
            for i in installations {
                guard i.pushToStartTokens[type] != nil else {
                    if installations.count == 1 { throw APIError(.conflict, "noPushToStartToken", "installation \(i.id) has no push-to-start token for \(type)") }
                    continue
                }
                guard i.liveActivitiesEnabled else {
                    if installations.count == 1 { throw APIError(.conflict, "liveActivitiesDisabled", "the person turned Live Activities off on installation \(i.id)") }
                    continue
                }
                let a = ActivityRecord(id: "act_" + UUID().uuidString.lowercased(), bundleID: caller.bundleID, externalKey: key, installationID: i.id, attributesType: type,
                                       attributes: attributes, content: state, state: .starting, relevanceScore: try b.number("relevanceScore"), startedAt: clock.now, topics: topics)
                activities.append(a)
                jobs.append(NewPushJob(bundleID: caller.bundleID, kind: .start, activityID: a.id, installationID: i.id, aps: .object(aps), hasAlert: true, requestedPriority: 10, runAt: clock.now))
                started.append(["activityID": .string(a.id), "installationID": .string(i.id)])
            }
            guard !jobs.isEmpty else { throw APIError(.conflict, "noPushToStartToken", "none of the user's installations can start a \(type) activity") }
            var value: JSONObject = ["accepted": .int(jobs.count), "activities": .array(started)]
            if !warnings.isEmpty { value["warnings"] = .array(warnings) }
            // The activities, their start jobs and the idempotent answer: one transaction.
            try await store.enqueue(jobs, creating: activities, idempotency: finishIdempotency(pending, .accepted, .object(value)), now: clock.now)
            engine.wake()
            return (.accepted, .object(value))
        }
    }

    /// Validates the payload Isle will send (IsleCore's validator, the registered schema, the size
    /// limit). Errors become a 422 naming the request field; warnings are returned.
    func validate(_ aps: JSONObject, schema: ActivitySchema?, priority: Int?) throws -> [JSONValue] {
        var withTimestamp = aps
        withTimestamp["timestamp"] = .int(Int64(clock.now.timeIntervalSince1970))
        let payload = JSONValue.object(["aps": .object(withTimestamp)])
        let report = PayloadValidator(options: .init(pushType: .liveactivity, priority: priority.flatMap(PushPriority.init(rawValue:)), schema: schema, now: clock.now))
            .validate(bytes: payload.jsonBytes)
        if let e = report.errors.first {
            throw APIError(.unprocessableContent, e.code.rawValue, "\(e.message) \(e.fix)", field: Self.field(e.path))
        }
        return report.warnings.map { ["code": .string($0.code.rawValue), "field": Self.field($0.path).map(JSONValue.string) ?? .null, "message": .string($0.message)] }
    }

    /// `$.aps.content-state.driverName` → `contentState.driverName`.
    static func field(_ path: String) -> String? {
        var p = path
        for (wire, api) in [("$.aps.content-state", "contentState"), ("$.aps.attributes-type", "attributesType"), ("$.aps.attributes", "attributes"),
                            ("$.aps.stale-date", "staleDate"), ("$.aps.dismissal-date", "dismissalDate"), ("$.aps.relevance-score", "relevanceScore"), ("$.aps.alert", "alert")] where p.hasPrefix(wire) {
            p = api + p.dropFirst(wire.count)
            return p
        }
        return p == "$" || p == "$.aps" ? nil : p
    }

    // MARK: JSON views

    static func json(bundleID: String, _ c: AppCircuit) -> JSONValue {
        var d: JSONObject
        switch c.mode {
        case .running: d = ["state": "running"]
        case .backingOff(let until, let reason): d = ["state": "backingOff", "reason": .string(reason), "retryAt": json(until)]
        case .paused(let until, let reason, let since): d = ["state": "paused", "reason": .string(reason), "since": json(since), "retryAt": json(until)]
        }
        return ["bundleID": .string(bundleID), "delivery": .object(d)]
    }

    static func json(_ d: Date?) -> JSONValue { d.map { .int(Int64($0.timeIntervalSince1970)) } ?? .null }

    static func json(_ i: InstallationRecord) -> JSONValue {
        ["id": .string(i.id), "bundleID": .string(i.bundleID), "userID": i.userID.map(JSONValue.string) ?? .null,
         "pushToStartTypes": .array(i.pushToStartTokens.keys.sorted().map(JSONValue.string)), "hasWidgetToken": .bool(i.widgetToken != nil),
         "liveActivitiesEnabled": .bool(i.liveActivitiesEnabled), "frequentPushesEnabled": .bool(i.frequentPushesEnabled), "updatedAt": json(i.updatedAt)]
    }

    static func json(_ a: ActivityRecord) -> JSONValue {
        ["id": .string(a.id), "externalKey": a.externalKey.map(JSONValue.string) ?? .null, "installationID": a.installationID.map(JSONValue.string) ?? .null,
         "attributesType": .string(a.attributesType), "attributes": a.attributes ?? .null, "contentState": a.content ?? .null, "state": .string(a.state.rawValue),
         "stateReason": a.stateReason.map(JSONValue.string) ?? .null, "hasToken": .bool(a.updateToken != nil), "topics": .array(a.topics.map(JSONValue.string)),
         "relevanceScore": a.relevanceScore.map(JSONValue.double) ?? .null, "staleDate": json(a.staleDate), "startedAt": json(a.startedAt), "endedAt": json(a.endedAt),
         "dismissedAt": json(a.dismissedAt)]
    }

    static func json(_ d: DeliveryRecord) -> JSONValue {
        ["id": d.id.map { .int($0) } ?? .null, "jobID": .int(d.jobID), "activityID": d.activityID.map(JSONValue.string) ?? .null, "apnsID": d.apnsID.map(JSONValue.string) ?? .null,
         "apnsUniqueID": d.apnsUniqueID.map(JSONValue.string) ?? .null, "status": .int(d.status), "reason": d.reason.map(JSONValue.string) ?? .null,
         "latencyMS": .double(d.latencyMS), "priority": .int(d.priority), "downgraded": .bool(d.downgraded), "at": json(d.at)]
    }
}
