import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery
import NIOCore

/// Health, readiness, metrics, the OpenAPI document, and the calling app's delivery status.
struct OperationsController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any JobCounts & OperatorPauseRepository & JobIntake & JobDelivery & EventRepository
    /// `/metrics` counts open work at most once a second however often it is asked.
    let openJobs = ExpiringCache<[PushJobState: Int]?>()
    /// And looks at the oldest due push and the webhooks' lag as often.
    let scraped = ExpiringCache<Scrape?>()

    struct Scrape: Sendable {
        var oldestDueAge: TimeInterval
        var webhookLags: [(app: String, webhook: String, seconds: TimeInterval)]
    }

    func addRoutes(to router: Router<IsleRequestContext>) {
        // A person who opens the server's address finds where to go.
        router.get("/") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-cache"], body: .init(byteBuffer: ByteBuffer(string: Self.index)))
        }
        router.get("health") { _, _ in JSONResponse.make(API.Health()) }
        router.get("ready", use: ready)
        router.get("metrics", use: metrics)
        router.get("openapi.json") { _, _ in
            Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: OpenAPIDocument.json)))
        }
    }

    static let index = """
        <!doctype html><html lang="en"><head><meta charset="utf-8"><title>Isle server</title>
        <style>body { font: 15px/1.5 system-ui, sans-serif; margin: 32px; max-width: 720px; } code { font-family: ui-monospace, monospace; }</style></head>
        <body><h1>Isle server</h1><p>Live Activities and widgets over APNs.</p><ul>
        <li><a href="/console">The console</a>: sign in with an admin key (<code>isle key create --bundle-id … --scope admin</code>).</li>
        <li>The API under <code>/v1</code>, for your backend and your app: <a href="/openapi.json">its OpenAPI document</a>.</li>
        <li><a href="/health">/health</a>, <a href="/ready">/ready</a> and <a href="/metrics">/metrics</a> (Prometheus) for monitoring.</li>
        </ul></body></html>
        """

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        // The calling app's delivery status: running, backing off (APNs failing) or paused (a
        // configuration error), with the reason; `resume` probes at once after a fix.
        v1.get("app") { _, context in
            let caller = try context.caller(.backend)
            return JSONResponse.make(Views.app(bundleID: caller.bundleID, circuits: services.engine.circuits, now: services.clock.now))
        }
        v1.post("app/resume") { _, context in
            let caller = try context.caller(.backend)
            // Probes an app its circuit paused; an operator's pause is lifted in the console only
            // (where it is audited), never by the backend it may have been meant to stop.
            try await AppControl(services: services, store: store).probe(bundleID: caller.bundleID)
            return JSONResponse.make(Views.app(bundleID: caller.bundleID, circuits: services.engine.circuits, now: services.clock.now))
        }
    }

    /// Ready to accept work (one round trip to the database): `ready` or `degraded`. Which apps are
    /// paused or backing off, and why, only for a console key (`Authorization: Bearer isle_admin_…`),
    /// and only what the key may see in the console: an app's admin or viewer key its own app, a
    /// server-admin key every app. The endpoint is open, and bundle ids and APNs reasons are the
    /// operator's business — one app's operators are not another's.
    @Sendable func ready(_ request: Request, context: IsleRequestContext) async throws -> Response {
        do { try await store.ping() } catch {
            throw APIError(.serviceUnavailable, "notReady", "the database is not reachable", retryAfter: 1)
        }
        let circuits = services.engine.circuits
        // Paused, backing off, or retrying pushes APNs refused: each is an app whose pushes wait.
        let held = Set(circuits.all.filter { $0.value.mode != .running }.keys).union(circuits.operatorPauses.keys).union(circuits.appsRetrying(now: services.clock.now)).sorted()
        var o = API.Readiness(status: held.isEmpty ? .ready : .degraded, apps: nil)
        if !held.isEmpty, let op = try await operatorKey(request, context) {
            let shown = op.scope == .serverAdmin ? held : held.filter { $0 == op.bundleID }
            o.apps = shown.map { Views.app(bundleID: $0, circuits: circuits, now: services.clock.now) }
        }
        return JSONResponse.make(o)
    }

    /// The live console key the request carries (read through the API's one-second cache), as its
    /// app and scope; nil without one. A key that is sent but unknown or revoked counts against the
    /// client address's failure budget, as on the API and the console: past it, 429 before any
    /// look-up, so `/ready` is no faster way to guess a key. A probe without a key is never held back.
    func operatorKey(_ request: Request, _ context: IsleRequestContext) async throws -> (bundleID: String, scope: APIKeyScope)? {
        if let caller = context.caller {
            guard caller.scope.isConsole else { return nil }
            return (bundleID: caller.bundleID, scope: caller.scope)
        }
        guard let header = request.headers[.authorization], header.count > 7, header.prefix(7).lowercased() == "bearer " else { return nil }
        let address = context.remoteAddress ?? "unknown"
        let failures = services.authFailures
        if failures.isExhausted(address), let wait = failures.take(address) {
            throw KeyedRateLimiter.tooMany("this address sent unknown API keys: it", failures.limit, wait)
        }
        guard let key = try await services.apiKeys.current(secret: String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)) else {
            // Only a wrong key takes a token; a valid one, of any scope, takes none.
            _ = failures.take(address)
            return nil
        }
        guard key.scope.isConsole else { return nil }
        return (bundleID: key.bundleID, scope: key.scope)
    }

    /// Open work only, along partial indexes; everything else is counted as it happens
    /// (swift-metrics into a Prometheus registry).
    /// The oldest due push (a lane head or a scheduled job past its time, paused apps' included)
    /// and each webhook's oldest unacknowledged event.
    static func scrape(_ store: any JobDelivery & EventRepository, now: Date) async throws -> Scrape {
        let due = try await store.nextDue(after: now, excludingApps: [])
        var lags: [(app: String, webhook: String, seconds: TimeInterval)] = []
        for hook in try await store.allWebhooks() {
            let oldest = try await store.events(bundleID: hook.bundleID, after: hook.cursor, limit: 1).first
            lags.append((hook.bundleID, hook.id, oldest.map { now.timeIntervalSince($0.event.at) } ?? 0))
        }
        return Scrape(oldestDueAge: due.map { max(0, now.timeIntervalSince($0)) } ?? 0, webhookLags: lags)
    }

    @Sendable func metrics(_ request: Request, context: IsleRequestContext) async throws -> Response {
        let counts = try await openJobs.value("open", load: { try await store.openJobCounts() }) ?? [:]
        let metrics = services.engine.counters.metrics
        metrics.openJobs(counts)
        let now = services.clock.now
        if let scrape = try await scraped.value("scrape", load: { try await Self.scrape(store, now: now) }) {
            metrics.oldestDueAge(scrape.oldestDueAge)
            metrics.webhookLags(scrape.webhookLags)
        }
        let circuits = services.engine.circuits
        var paused: [String: Int] = ["operator": circuits.operatorPauses.count]
        for (bundleID, c) in circuits.all where circuits.operatorPause(bundleID) == nil {
            switch c.mode {
            case .running: break
            case .backingOff: paused["apnsUnavailable", default: 0] += 1
            case .paused: paused["configuration", default: 0] += 1
            }
        }
        metrics.pausedApps(paused)
        metrics.storeStatements(StoreStatements.total)
        var text = metrics.text()
        if StoreStatements.kindsEnabled {
            // A diagnosis switched on by ISLE_STATEMENT_KINDS=1 (IsleStore's StoreStatements).
            text += Array("# HELP isle_store_statements_by_kind_total SQL statements sent to the database, by their first words (ISLE_STATEMENT_KINDS=1).\n".utf8)
            text += Array("# TYPE isle_store_statements_by_kind_total counter\n".utf8)
            for (kind, n) in StoreStatements.kinds.sorted(by: { $0.key < $1.key }) { text += Array("isle_store_statements_by_kind_total{kind=\"\(kind)\"} \(n)\n".utf8) }
        }
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"], body: .init(byteBuffer: ByteBuffer(bytes: text)))
    }
}
