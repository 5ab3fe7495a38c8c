import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import NIOCore

/// The simulator's JSON control API (HTTP/1.1, loopback): devices, apps, keys, activities from
/// "the app", settings, the clock, scripted failures, and what the device and APNs saw.
/// Errors share one shape with the server's API (IsleHTTPAPI's `APIError`):
/// `{"error":{"code","message","field"?}}`.
struct ControlAPI {
    let world: SimulatorWorld
    let apns: FakeAPNs
    /// Widget timeline URLs may name other hosts than loopback (`--allow-non-loopback`).
    var allowsNonLoopbackURLs = false

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        encoder.dateEncodingStrategy = .iso8601
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: Array(try encoder.encode(value)))))
    }

    static func raw(_ value: JSONValue, status: HTTPResponse.Status = .ok) -> Response {
        JSONResponse.make(value, status: status, pretty: true)
    }

    /// Reads the body as a JSON object (an empty body is `{}`).
    static func body(_ request: Request) async throws -> JSONObject {
        var request = request
        return try await JSONBody.read(&request, limit: 4 << 20).object
    }

    /// `GET /events`' filters: `device`, `apnsID`, `token`, `activity`, `outcome` and `source`
    /// (comma-separated lists), `after` (a cursor from an earlier answer), `limit` (1–10000).
    static func eventQuery(_ parameters: Parameters) throws -> EventQuery {
        let known: Set<String> = ["device", "apnsID", "token", "activity", "outcome", "source", "after", "limit", "wait"]
        for (name, _) in parameters where !known.contains(String(name)) {
            throw APIError(.badRequest, "invalidArgument", "unknown query parameter \(name); GET /events takes \(known.sorted().joined(separator: ", "))", field: String(name))
        }
        func one(_ name: String) throws -> String? {
            let values = parameters.getAll(name)
            guard values.count <= 1 else { throw APIError(.badRequest, "invalidArgument", "\(name) is given more than once", field: name) }
            guard let first = values.first else { return nil }
            let v = String(first)
            guard !v.isEmpty else { throw APIError(.badRequest, "invalidArgument", "\(name) is empty", field: name) }
            return v
        }
        var q = EventQuery(deviceID: try one("device"), apnsID: try one("apnsID"), token: try one("token"), activityID: try one("activity"))
        if let list = try one("outcome") {
            var codes: Set<PushOutcome.Code> = []
            for name in list.split(separator: ",") {
                guard let code = PushOutcome.Code(rawValue: String(name)) else {
                    throw APIError(.badRequest, "invalidArgument", "outcome \(name) is not an outcome; they are \(PushOutcome.Code.allCases.map(\.rawValue).joined(separator: ", "))", field: "outcome")
                }
                codes.insert(code)
            }
            q.outcomes = codes
        }
        if let list = try one("source") {
            var sources: Set<DeviceEvent.Source> = []
            for name in list.split(separator: ",") {
                guard let source = DeviceEvent.Source(rawValue: String(name)) else {
                    throw APIError(.badRequest, "invalidArgument", "source \(name) is not push, app, user or system", field: "source")
                }
                sources.insert(source)
            }
            q.sources = sources
        }
        // An empty cursor (no devices yet) is the start.
        if parameters.getAll("after").count == 1, parameters.getAll("after").first?.isEmpty == true {
            q.after = EventCursor()
        } else if let after = try one("after") {
            guard let cursor = EventCursor(text: after) else {
                throw APIError(.badRequest, "invalidArgument", "after must be the cursor of an earlier answer (such as device-1=4,device-2=0)", field: "after")
            }
            q.after = cursor
        }
        if let limit = try one("limit") {
            guard let n = Int(limit), (1...10_000).contains(n) else { throw APIError(.badRequest, "invalidArgument", "limit must be an integer from 1 to 10000", field: "limit") }
            q.limit = n
        }
        if let token = q.token, !(token.count % 2 == 0 && token.allSatisfy(\.isHexDigit)) {
            throw APIError(.badRequest, "invalidArgument", "token must be a device token in hexadecimal", field: "token")
        }
        return q
    }

    static func string(_ o: JSONObject, _ key: String, required: Bool = true) throws -> String? {
        switch o[key] {
        case .string(let s)? where !s.isEmpty: return s
        case nil where !required: return nil
        case nil: throw APIError(.badRequest, "invalidArgument", "\(key) is required: a non-empty string", field: key)
        default: throw APIError(.badRequest, "invalidArgument", "\(key) must be a non-empty string", field: key)
        }
    }

    static func bool(_ o: JSONObject, _ key: String) throws -> Bool? {
        switch o[key] {
        case nil: return nil
        case .bool(let b)?: return b
        default: throw APIError(.badRequest, "invalidArgument", "\(key) must be true or false", field: key)
        }
    }

    static func number(_ o: JSONObject, _ key: String) throws -> Double? {
        switch o[key] {
        case nil: return nil
        case .number(let n)?: return n.doubleValue
        default: throw APIError(.badRequest, "invalidArgument", "\(key) must be a number", field: key)
        }
    }

    static func int(_ o: JSONObject, _ key: String) throws -> Int? {
        guard let d = try number(o, key) else { return nil }
        guard d == d.rounded(), abs(d) < 1e12 else { throw APIError(.badRequest, "invalidArgument", "\(key) must be an integer", field: key) }
        return Int(d)
    }

    func run<T>(_ body: () throws(SimulatorError) -> T) throws -> T {
        do { return try body() } catch { throw APIError(error) }
    }

    func addRoutes(to router: Router<BasicRequestContext>) {
        router.get("health") { _, _ in ControlAPI.raw(["status": "ok"]) }
        PhonePage.routes(router, world: world)

        router.get("clock") { _, _ in
            ControlAPI.raw(["now": .string(ISO8601DateFormatter().string(from: world.clock.now)), "unix": .double(world.clock.now.timeIntervalSince1970),
                             "manual": .bool(world.clock is ManualWallClock)])
        }
        router.post("clock/advance") { request, _ in
            let o = try await ControlAPI.body(request)
            guard let seconds = try ControlAPI.number(o, "seconds") else { throw APIError(.badRequest, "invalidArgument", "seconds is required", field: "seconds") }
            do throws(SimulatorError) { try await world.advanceClock(by: seconds) } catch { throw APIError(error) }
            return ControlAPI.raw(["now": .string(ISO8601DateFormatter().string(from: world.clock.now)), "unix": .double(world.clock.now.timeIntervalSince1970)])
        }

        router.post("apns/clock-offset") { request, _ in
            let o = try await ControlAPI.body(request)
            guard let seconds = try ControlAPI.number(o, "seconds"), abs(seconds) <= 366 * 86_400 else {
                throw APIError(.badRequest, "invalidArgument", "seconds is required: how far APNs' clock is ahead of the simulator's (negative: behind), at most a year", field: "seconds")
            }
            apns.clockOffset = seconds
            return ControlAPI.raw(["seconds": .double(seconds)])
        }

        router.post("keys") { request, _ in
            let o = try await ControlAPI.body(request)
            let env = try ControlAPI.string(o, "environment", required: false).map { e -> SimulatedEnvironment in
                guard let v = SimulatedEnvironment(rawValue: e) else { throw APIError(.badRequest, "invalidArgument", "environment must be sandbox or production", field: "environment") }
                return v
            }
            var bundles: Set<String>?
            if let list = o["bundleIDs"] {
                guard let items = list.arrayValue?.compactMap(\.stringValue), items.count == list.arrayValue?.count, !items.isEmpty else {
                    throw APIError(.badRequest, "invalidArgument", "bundleIDs must be a non-empty array of bundle ids the key may push to", field: "bundleIDs")
                }
                bundles = Set(items)
            }
            let key = RegisteredKey(keyID: try ControlAPI.string(o, "keyID")!, teamID: try ControlAPI.string(o, "teamID")!, publicKeyPEM: try ControlAPI.string(o, "publicKeyPEM")!,
                                    environment: env, bundleIDs: bundles)
            try run { () throws(SimulatorError) in try apns.register(key) }
            return ControlAPI.raw(["keyID": .string(key.keyID), "teamID": .string(key.teamID)], status: .created)
        }

        router.post("devices") { request, _ in
            let o = try await ControlAPI.body(request)
            let name = try ControlAPI.string(o, "name", required: false) ?? ""
            let os = try ControlAPI.string(o, "osVersion", required: false) ?? "26.0"
            let model = try ControlAPI.string(o, "model", required: false) ?? "iPhone 16 Pro"
            let island = try ControlAPI.bool(o, "hasDynamicIsland")
            let watch = try ControlAPI.bool(o, "pairedWatch"), car = try ControlAPI.bool(o, "carPlay"), mac = try ControlAPI.bool(o, "pairedMac")
            // Checked before the device exists, so a refused request makes nothing.
            if let problem = SimulatedDevice.surroundingsProblem(model: model, pairedWatch: watch, carPlay: car) { throw APIError(problem) }
            let id = try run { () throws(SimulatorError) in try world.createDevice(name: name, osVersion: os, model: model, hasDynamicIsland: island) }
            if watch != nil || car != nil || mac != nil {
                try run { () throws(SimulatorError) in try world.setSurroundings(deviceID: id, pairedWatch: watch, carPlay: car, pairedMac: mac) }
            }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) }, status: .created)
        }
        // The person's surroundings: a paired Apple Watch or Mac, CarPlay, the lock.
        router.patch("devices/:device") { request, context in
            let id = try context.parameters.require("device")
            let o = try await ControlAPI.body(request)
            for key in o.keys where !["pairedWatch", "carPlay", "pairedMac", "locked"].contains(key) {
                throw APIError(.badRequest, "invalidArgument", "unknown field \(key); PATCH /devices/{id} takes pairedWatch, carPlay, pairedMac and locked", field: key)
            }
            let watch = try ControlAPI.bool(o, "pairedWatch"), car = try ControlAPI.bool(o, "carPlay"), mac = try ControlAPI.bool(o, "pairedMac"), locked = try ControlAPI.bool(o, "locked")
            try run { () throws(SimulatorError) in try world.setSurroundings(deviceID: id, pairedWatch: watch, carPlay: car, pairedMac: mac, locked: locked) }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) })
        }
        router.put("devices/:device/apps/:bundle/controls") { request, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let o = try await ControlAPI.body(request)
            guard let list = o["kinds"]?.arrayValue, let kinds = Optional(list.compactMap(\.stringValue)), kinds.count == list.count else {
                throw APIError(.badRequest, "invalidArgument", "kinds is required: an array of control kinds (strings)", field: "kinds")
            }
            try run { () throws(SimulatorError) in try world.setControls(bundleID: bundle, on: id, kinds: kinds) }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.app(bundle, on: id) })
        }
        router.post("devices/:device/network") { request, context in
            let id = try context.parameters.require("device")
            let o = try await ControlAPI.body(request)
            guard let online = try ControlAPI.bool(o, "online") else { throw APIError(.badRequest, "invalidArgument", "online is required: true or false", field: "online") }
            do { try await world.setOnline(id, online) } catch let e as SimulatorError { throw APIError(e) }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) })
        }
        router.get("devices") { _, _ in
            try ControlAPI.json(try world.deviceIDs.map { id in try run { () throws(SimulatorError) in try world.device(id) } })
        }
        router.get("devices/:device") { _, context in
            let id = try context.parameters.require("device")
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) })
        }
        router.get("devices/:device/events") { _, context in
            let id = try context.parameters.require("device")
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) }.events)
        }
        // Every device's events, filtered, after a cursor, waiting for the first match (long poll).
        router.get("events") { request, _ in
            let query = try ControlAPI.eventQuery(request.uri.queryParameters)
            let waitText = request.uri.queryParameters["wait"].map(String.init)
            var wait = 0.0
            if let waitText {
                guard let w = Double(waitText), w.isFinite, w >= 0, w <= 60 else {
                    throw APIError(.badRequest, "invalidArgument", "wait must be a number of seconds from 0 to 60 (how long to wait for a first matching event)", field: "wait")
                }
                wait = w
            }
            let (events, cursor) = wait > 0 ? await world.waitForEvents(matching: query, timeout: .milliseconds(Int64(wait * 1000))) : world.events(matching: query)
            struct Page: Encodable {
                var events: [FoundEvent]
                var cursor: String
            }
            return try ControlAPI.json(Page(events: events, cursor: cursor.text))
        }
        router.get("devices/:device/screen") { _, context in
            let id = try context.parameters.require("device")
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.screen(deviceID: id) })
        }

        router.post("devices/:device/apps") { request, context in
            let id = try context.parameters.require("device")
            let o = try await ControlAPI.body(request)
            let install = try ControlAPI.appInstall(o, allowsNonLoopbackURLs: allowsNonLoopbackURLs)
            let app = try run { () throws(SimulatorError) in try world.install(install, on: id) }
            return try ControlAPI.json(app, status: .created)
        }
        router.delete("devices/:device/apps/:bundle") { _, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            try run { () throws(SimulatorError) in try world.uninstall(bundleID: bundle, on: id) }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.device(id) })
        }
        router.patch("devices/:device/apps/:bundle/settings") { request, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let o = try await ControlAPI.body(request)
            let live = try ControlAPI.bool(o, "liveActivitiesEnabled")
            let frequent = try ControlAPI.bool(o, "frequentUpdatesEnabled")
            let fg = try ControlAPI.bool(o, "foreground")
            let quit = try ControlAPI.bool(o, "forceQuit")
            let terminated = try ControlAPI.bool(o, "terminated")
            try run { () throws(SimulatorError) in
                try world.updateSettings(bundleID: bundle, on: id, liveActivitiesEnabled: live, frequentUpdatesEnabled: frequent, foreground: fg, forceQuit: quit, terminated: terminated)
            }
            return try ControlAPI.json(try run { () throws(SimulatorError) in try world.app(bundle, on: id) })
        }
        router.post("devices/:device/apps/:bundle/push-to-start-tokens/:type/rotate") { _, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let type = try context.parameters.require("type")
            let token = try run { () throws(SimulatorError) in try world.rotatePushToStartToken(bundleID: bundle, attributesType: type, on: id) }
            return ControlAPI.raw(["token": .string(token)])
        }
        router.post("devices/:device/apps/:bundle/widget-push-token/rotate") { _, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let token = try run { () throws(SimulatorError) in try world.rotateWidgetPushToken(bundleID: bundle, on: id) }
            return ControlAPI.raw(["token": .string(token)])
        }
        router.post("devices/:device/apps/:bundle/activities") { request, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let o = try await ControlAPI.body(request)
            let type = try ControlAPI.string(o, "attributesType")!
            guard let attributes = o["attributes"], attributes.objectValue != nil else { throw APIError(.badRequest, "invalidArgument", "attributes is required: an object", field: "attributes") }
            guard let state = o["contentState"], state.objectValue != nil else { throw APIError(.badRequest, "invalidArgument", "contentState is required: an object", field: "contentState") }
            let stale = try ControlAPI.number(o, "staleDate").map { Date(timeIntervalSince1970: $0) }
            let score = try ControlAPI.number(o, "relevanceScore") ?? 0
            let start = try ControlAPI.number(o, "startDate").map { Date(timeIntervalSince1970: $0) }
            var alertConfiguration: AlertConfiguration?
            if let value = o["alertConfiguration"], !value.isNull {
                guard let a = value.objectValue, let title = a["title"]?.stringValue, let body = a["body"]?.stringValue else {
                    throw APIError(.badRequest, "invalidArgument", "alertConfiguration must be an object with title and body strings (and an optional sound)", field: "alertConfiguration")
                }
                if let sound = a["sound"], sound.stringValue == nil, !sound.isNull {
                    throw APIError(.badRequest, "invalidArgument", "alertConfiguration.sound must be a string", field: "alertConfiguration.sound")
                }
                alertConfiguration = AlertConfiguration(title: title, body: body, sound: a["sound"]?.stringValue)
            }
            let pushType: SimulatorWorld.RequestPushType
            switch o["pushType"] {
            case nil, .string("token")?: pushType = .token
            case .string("none")?, .null?: pushType = .none
            case .object(let c)? where c["channel"]?.stringValue != nil: pushType = .channel(c["channel"]!.stringValue!)
            default: throw APIError(.badRequest, "invalidArgument", "pushType must be \"token\", \"none\" or {\"channel\": id}", field: "pushType")
            }
            let wait = try ControlAPI.bool(o, "waitForPushToken") ?? false
            let style: ActivityStyle
            switch o["style"] {
            case nil, .string("standard")?: style = .standard
            case .string("transient")?: style = .transient
            default: throw APIError(.badRequest, "invalidArgument", "style must be \"standard\" or \"transient\" (ActivityStyle, iOS 18)", field: "style")
            }
            var a = try run { () throws(SimulatorError) in
                try world.requestActivity(bundleID: bundle, on: id, attributesType: type, attributes: attributes, contentState: state, staleDate: stale, relevanceScore: score, pushType: pushType, start: start,
                                           alertConfiguration: alertConfiguration, style: style)
            }
            // As on a device, the token is not in request's answer; an app awaits pushTokenUpdates,
            // and "waitForPushToken": true does the same before answering.
            if wait, pushType == .token {
                do { a.updateToken = try await world.waitForPushToken(activityID: a.id, on: id) } catch let e as SimulatorError { throw APIError(e) }
                a.tokenDueAt = nil
            }
            return try ControlAPI.json(a, status: .created)
        }
        router.get("devices/:device/activities/:activity/push-token") { _, context in
            // The app awaiting pushTokenUpdates: answers once ActivityKit has handed the token out.
            let id = try context.parameters.require("device")
            let activity = try context.parameters.require("activity")
            let token: String
            do { token = try await world.waitForPushToken(activityID: activity, on: id) } catch let e as SimulatorError { throw APIError(e) }
            return ControlAPI.raw(["activityID": .string(activity), "token": .string(token)])
        }
        router.post("devices/:device/activities/:activity/:action") { request, context in
            let id = try context.parameters.require("device")
            let activity = try context.parameters.require("activity")
            let action = try context.parameters.require("action")
            let o = try await ControlAPI.body(request)
            switch action {
            case "dismiss": try run { () throws(SimulatorError) in try world.userDismiss(activityID: activity, on: id) }
            case "allow": _ = try run { () throws(SimulatorError) in try world.allowUpdates(activityID: activity, on: id) }
            case "rotate-token": _ = try run { () throws(SimulatorError) in try world.rotateUpdateToken(activityID: activity, on: id) }
            case "update", "end":
                let state = o["contentState"]
                if let state, state.objectValue == nil { throw APIError(.badRequest, "invalidArgument", "contentState must be an object", field: "contentState") }
                let immediate = try ControlAPI.bool(o, "dismissImmediately") ?? false
                let after = try ControlAPI.number(o, "dismissAt").map { t throws -> Date in
                    guard t.isFinite, (0...1e11).contains(t) else { throw APIError(.badRequest, "invalidArgument", "dismissAt must be Unix seconds", field: "dismissAt") }
                    return Date(timeIntervalSince1970: t)
                }
                try run { () throws(SimulatorError) in
                    try world.appUpdate(activityID: activity, on: id, contentState: state, end: action == "end", dismissImmediately: immediate, dismissAt: after)
                }
            default:
                throw APIError(.notFound, "notFound", "unknown action \(action); use dismiss, allow, rotate-token, update or end")
            }
            let device = try run { () throws(SimulatorError) in try world.device(id) }
            return try ControlAPI.json(device.activities.first { $0.id == activity })
        }
        router.post("devices/:device/apps/:bundle/widgets/reload") { request, context in
            let id = try context.parameters.require("device")
            let bundle = try context.parameters.require("bundle")
            let o = try await ControlAPI.body(request)
            let kinds = o["kinds"]?.arrayValue?.compactMap(\.stringValue)
            _ = try run { () throws(SimulatorError) in try world.app(bundle, on: id) }
            let outcome = await world.reloadWidgets(deviceID: id, bundleID: bundle, kinds: kinds, reason: .app)
            return try ControlAPI.json(outcome)
        }
        router.post("apps/:bundle/broadcast-capability") { request, context in
            let bundle = try context.parameters.require("bundle")
            let o = try await ControlAPI.body(request)
            guard let enabled = try ControlAPI.bool(o, "enabled") else { throw APIError(.badRequest, "invalidArgument", "enabled is required", field: "enabled") }
            let deleted = world.setBroadcastCapability(bundleID: bundle, enabled: enabled)
            return ControlAPI.raw(["bundleID": .string(bundle), "enabled": .bool(enabled), "deletedChannels": .int(Int64(deleted))])
        }

        router.post("failures") { request, _ in
            let o = try await ControlAPI.body(request)
            let status = try ControlAPI.int(o, "status")
            if let status, !(200...599).contains(status) { throw APIError(.badRequest, "invalidArgument", "status must be an HTTP status", field: "status") }
            let times = try ControlAPI.int(o, "times")
            if let times, times < 1 { throw APIError(.badRequest, "invalidArgument", "times must be at least 1 (omit it for a permanent rule)", field: "times") }
            let rule = FailureRule(token: try ControlAPI.string(o, "token", required: false)?.lowercased(), status: status, reason: try ControlAPI.string(o, "reason", required: false),
                                   remaining: o["times"] == nil && o["permanent"] == .bool(true) ? nil : (times ?? 1), latencyMilliseconds: try ControlAPI.int(o, "latencyMilliseconds"),
                                   goAway: try ControlAPI.bool(o, "goAway") ?? false)
            if rule.status == nil, rule.latencyMilliseconds == nil, !rule.goAway { throw APIError(.badRequest, "invalidArgument", "give status (and reason), latencyMilliseconds or goAway", field: "status") }
            apns.addFailure(rule)
            return try ControlAPI.json(rule, status: .created)
        }
        router.delete("failures") { _, _ in
            apns.clearFailures()
            return Response(status: .noContent)
        }
        router.get("requests") { _, _ in try ControlAPI.json(apns.requestLog) }
        router.delete("requests") { _, _ in
            apns.clearRequestLog()
            return Response(status: .noContent)
        }
    }

    static func appInstall(_ o: JSONObject, allowsNonLoopbackURLs: Bool = false) throws -> SimulatorWorld.AppInstall {
        let bundle = try string(o, "bundleID")!
        let env = try string(o, "environment", required: false).map { e -> SimulatedEnvironment in
            guard let v = SimulatedEnvironment(rawValue: e) else { throw APIError(.badRequest, "invalidArgument", "environment must be sandbox or production", field: "environment") }
            return v
        } ?? .sandbox
        var schemas: [ActivitySchema] = []
        for (i, s) in (o["schemas"]?.arrayValue ?? []).enumerated() {
            do { schemas.append(try ActivitySchema(json: s)) } catch {
                throw APIError(.badRequest, "invalidArgument", "schemas[\(i)]: \(error)", field: "schemas[\(i)]")
            }
        }
        var localization: [String: String] = [:]
        for (k, v) in o["localization"]?.objectValue ?? [:] {
            guard let s = v.stringValue else { throw APIError(.badRequest, "invalidArgument", "localization values must be strings", field: "localization.\(k)") }
            localization[k] = s
        }
        var widgets: [SimulatedWidget.Configuration] = []
        for (i, w) in (o["widgets"]?.arrayValue ?? []).enumerated() {
            guard let kind = w["kind"]?.stringValue else { throw APIError(.badRequest, "invalidArgument", "widgets[\(i)].kind is required", field: "widgets[\(i)].kind") }
            let family = w["family"]?.stringValue ?? "systemSmall"
            if let url = w["url"]?.stringValue {
                guard let parsed = URL(string: url), let scheme = parsed.scheme?.lowercased(), scheme == "http" || scheme == "https", let host = parsed.host, !host.isEmpty else {
                    throw APIError(.badRequest, "invalidArgument", "widgets[\(i)].url must be an http(s) URL", field: "widgets[\(i)].url")
                }
                guard allowsNonLoopbackURLs || IsleSim.isLoopback(host) else {
                    throw APIError(.badRequest, "invalidArgument", "widgets[\(i)].url: the simulator fetches timelines from loopback only (\(host) is not); start it with --allow-non-loopback to allow other hosts", field: "widgets[\(i)].url")
                }
                widgets.append(.init(kind: kind, family: family, source: .url(url)))
            } else if let t = w["timeline"] {
                do { widgets.append(.init(kind: kind, family: family, source: .fixed(try WidgetTimeline(json: t)))) } catch {
                    throw APIError(.badRequest, "invalidArgument", "widgets[\(i)].timeline: \(error.message)", field: "widgets[\(i)].timeline")
                }
            } else {
                throw APIError(.badRequest, "invalidArgument", "widgets[\(i)] needs url or timeline", field: "widgets[\(i)]")
            }
        }
        var controls: [String] = []
        if let list = o["controls"] {
            guard let kinds = list.arrayValue?.compactMap(\.stringValue), kinds.count == list.arrayValue?.count, kinds.allSatisfy({ !$0.isEmpty }) else {
                throw APIError(.badRequest, "invalidArgument", "controls must be an array of control kinds (strings) that reload by push", field: "controls")
            }
            controls = kinds
        }
        var families: [String] = []
        if let list = o["supplementalActivityFamilies"] {
            guard let names = list.arrayValue?.compactMap(\.stringValue), names.count == list.arrayValue?.count, names.allSatisfy({ $0 == "small" || $0 == "medium" }) else {
                throw APIError(.badRequest, "invalidArgument", "supplementalActivityFamilies must be an array of \"small\" (Apple Watch, CarPlay) and \"medium\" (StandBy)", field: "supplementalActivityFamilies")
            }
            families = names
        }
        var install = SimulatorWorld.AppInstall(bundleID: bundle, environment: env, schemas: schemas, declaresFrequentUpdates: try bool(o, "frequentUpdates") ?? false,
                                                localization: localization, widgets: widgets, controls: controls, foreground: try bool(o, "foreground") ?? true)
        install.supplementalActivityFamilies = families
        return install
    }
}

/// The control API has no authentication, so it answers only what comes from this machine and
/// not from a web page: the `Host` header must name loopback (a DNS-rebinding page sends its own
/// name), and a request that carries an `Origin` (every browser request does; curl and test
/// clients do not) must come from a loopback origin. Both answer 403 in the error shape.
struct LoopbackOnlyMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // HTTP/1.1's Host header arrives as the request's authority.
        guard let host = request.head.authority, IsleSim.isLoopback(IsleSim.hostPart(host)) else {
            throw APIError(.forbidden, "forbiddenHost", "the simulator's control API answers requests addressed to a loopback host only (Host: \(request.head.authority ?? "none"))", field: "Host")
        }
        if let origin = request.headers[.origin] {
            let authority = origin.split(separator: "://", maxSplits: 1).last.map(String.init) ?? ""
            guard origin != "null", IsleSim.isLoopback(IsleSim.hostPart(authority)) else {
                throw APIError(.forbidden, "forbiddenOrigin", "the simulator's control API does not answer web pages from other origins (Origin: \(origin))", field: "Origin")
            }
        }
        return try await next(request, context)
    }
}

extension APIError {
    /// A simulator refusal in the shared envelope, its code kept.
    init(_ e: SimulatorError) {
        let status: HTTPResponse.Status = switch e.code {
        case .notFound: .notFound
        case .conflict: .conflict
        case .invalidArgument: .badRequest
        default: .unprocessableContent
        }
        self.init(status, e.code.rawValue, e.message, field: e.field)
    }
}
