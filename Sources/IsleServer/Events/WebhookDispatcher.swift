import AsyncHTTPClient
public import Foundation
import IsleCore
import IsleStore
import IsleWire
import IsleDelivery
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Synchronization

/// How webhooks are sent (docs/events.md).
public struct WebhookSettings: Sendable, Hashable {
    /// Events per request, at most.
    public var batch = 100
    /// A request the endpoint does not answer within this fails (and is tried again).
    public var requestTimeout: TimeInterval = 10
    /// The longest wait between two attempts after failures (1 s, 2 s, 4 s, … up to this).
    public var maximumBackoff: TimeInterval = 300
    /// How long one process keeps the right to send an endpoint's events without renewing it.
    public var lease: TimeInterval = 30
    /// How often the list of endpoints, and events committed by other processes, are looked for.
    public var poll: TimeInterval = 1
    /// The only hosts a webhook may point at (`example.com`, or `*.example.com` for its
    /// subdomains), which may then be private addresses too; nil: any host whose addresses are
    /// all public (docs/security.md, "Webhooks").
    public var allowedHosts: [String]?
    /// Webhooks may reach loopback, private and link-local addresses (tests and development).
    public var allowPrivate = false
    /// The longest long poll of `GET /v1/events` (a proxy in front may cut shorter requests).
    public var maximumPollWait: TimeInterval = 30
    /// A webhook failing this long is disabled, with a `webhook.disabled` event (0: never).
    public var disableAfter: TimeInterval = 3 * 86_400
    public init() {}

    /// Whether `host` is one of ``allowedHosts`` (always, when there is no list).
    public func allows(host: String) -> Bool {
        guard let allowedHosts else { return true }
        let h = host.lowercased()
        return allowedHosts.contains { pattern in
            let p = pattern.lowercased()
            if p.hasPrefix("*.") { return h.hasSuffix(String(p.dropFirst(1))) && h.count > p.count - 1 }
            return h == p
        }
    }
}

/// Sends every app's events to its webhooks: per endpoint in order, a batch at a time, the next
/// batch only after the endpoint answered 2xx (at least once: a batch whose answer was lost is
/// sent again, with the same event ids). A failing endpoint is retried with a doubling backoff and
/// its failures are kept on its record, for `GET /v1/webhooks` and the console.
final class WebhookDispatcher: Service {
    let store: any EventRepository & APIKeyRepository
    let bell: EventBell
    let clock: any WallClock
    let settings: WebhookSettings
    let masterKey: MasterKey?
    let logger: Logger
    let worker = "webhooks-" + UUID().uuidString.prefix(8).lowercased()

    /// Failures counted for `/metrics` (`isle_webhook_failures_total`).
    let metrics: ServerMetrics?

    init(store: any EventRepository & APIKeyRepository, bell: EventBell, clock: any WallClock, settings: WebhookSettings, masterKey: MasterKey?, logger: Logger, metrics: ServerMetrics? = nil) {
        self.metrics = metrics
        self.store = store
        self.bell = bell
        self.clock = clock
        self.settings = settings
        self.masterKey = masterKey
        self.logger = logger
    }

    func run() async throws {
        // After a crash on SQLite, the dead process's holds would stall its endpoints for a lease.
        do {
            let released = try await store.releaseWebhookHoldsAtStart()
            if released > 0 { logger.info("webhooks: released the holds of the process that stopped", metadata: ["webhooks": "\(released)"]) }
        } catch {
            logger.log(level: .forStoreFailure(.warning, error), "webhooks: could not release the last process's holds; they end with their lease", metadata: ["error": "\(error)"])
        }
        await cancelWhenGracefulShutdown {
            await self.loop()
        }
    }

    /// A client for one round of one endpoint: to the address just checked, whatever the name
    /// resolves to meanwhile (the name stays the TLS server name), never following a redirect.
    func client(for target: WebhookTarget) -> HTTPClient {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        configuration.timeout = .init(connect: .seconds(5), read: .seconds(Int64(max(1, settings.requestTimeout))))
        if !target.hostIsAddress { configuration.dnsOverride = [target.host: target.address] }
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    /// One task per endpoint, so a slow or hanging endpoint delays only its own events.
    func loop() async {
        let state = LoopState()
        // When no endpoint exists, the endpoints are listed once a poll, not at every event: an
        // app without webhooks costs no read per delivery batch. (With endpoints, each wake reads
        // them again: their cursors say what is waiting.)
        var noneSince: ContinuousClock.Instant?
        await withDiscardingTaskGroup { group in
            while !Task.isCancelled {
                let generation = bell.generation
                var next = clock.now.addingTimeInterval(settings.poll)
                do {
                    let hooks: [WebhookRecord]
                    if let since = noneSince, ContinuousClock.now - since < .milliseconds(Int64(settings.poll * 1000)) {
                        hooks = []
                    } else {
                        hooks = try await store.allWebhooks()
                        noneSince = hooks.isEmpty ? .now : nil
                    }
                    for hook in hooks where state.busy.withLock({ $0.insert(hook.id).inserted }) {
                        group.addTask {
                            let due = await self.serve(hook)
                            state.busy.withLock { _ = $0.remove(hook.id) }
                            if let due { state.nextTry.withLock { $0 = min($0 ?? due, due) } }
                        }
                    }
                } catch {
                    logger.log(level: .forStoreFailure(.warning, error), "webhooks: reading the endpoints failed; trying again", metadata: ["error": "\(error)"])
                }
                if let due = state.nextTry.withLock({ t -> Date? in defer { t = nil }; return t }) { next = min(next, due) }
                let wait = max(0, next.timeIntervalSince(clock.now))
                if wait > 0 { await bell.wait(since: generation, timeout: .milliseconds(Int64(wait * 1000))) }
            }
        }
    }

    /// Sends what `hook` has waiting, batch after batch, until it is caught up, fails, or another
    /// process holds it. Returns when to look again sooner than the next poll (a retry's time).
    func serve(_ initial: WebhookRecord) async -> Date? {
        var hook = initial
        // Disabled: nothing is sent, nothing written, until it is enabled.
        if hook.disabledAt != nil { return nil }
        if let at = hook.nextAttemptAt, at > clock.now { return at }
        var http: HTTPClient?
        defer { if let http { Task { try? await http.shutdown() } } }
        do {
            // Nothing waiting: no write (the hold) for an idle endpoint.
            guard try await !store.events(bundleID: hook.bundleID, after: hook.cursor, limit: 1).isEmpty else { return nil }
            // A webhook whose key was revoked stops (docs/events.md): nothing is sent, nothing written.
            if try await keyRevoked(hook) { return nil }
            guard try await store.holdWebhook(id: hook.id, worker: worker, now: clock.now, lease: settings.lease) else { return nil }
            // Read again under the hold: another instance may have moved the cursor meanwhile.
            guard let current = try await store.webhook(id: hook.id), current.disabledAt == nil else { return nil }
            hook = current
            // Checked at every round, under this server's rules now: a webhook made before a rule
            // (or a stricter --webhook-hosts) obeys it, and a name resolving elsewhere since is seen.
            let target: WebhookTarget
            switch await WebhookTarget.check(url: hook.url, settings: settings) {
            case .success(let t): target = t
            case .failure(let refusal):
                await record(hook, status: 0, error: refusal.message, events: [], since: clock.now, kind: "delivery")
                hook.failed(status: 0, error: refusal.message, at: clock.now, maximumBackoff: settings.maximumBackoff)
                metrics?.webhookFailed(app: hook.bundleID, webhook: hook.id)
                logger.warning("webhook refused: it will be checked again", metadata: ["webhook": "\(hook.id)", "app": "\(hook.bundleID)", "reason": "\(refusal.code)"])
                guard try await store.saveWebhookProgress(hook) else { return nil }
                try await disableIfFailingTooLong(hook)
                return hook.nextAttemptAt
            }
            let client = self.client(for: target)
            http = client
            let secrets = try signingSecrets(hook)
            let started = clock.now
            while !Task.isCancelled, clock.now.timeIntervalSince(started) < settings.lease / 2 {
                let read = try await store.events(bundleID: hook.bundleID, after: hook.cursor, limit: settings.batch)
                guard let last = read.last else { return nil }
                // Its filter: the types it does not receive are passed over (the cursor moves on).
                let events = read.filter { hook.receives($0.event.type) }
                if events.isEmpty {
                    hook.cursor = max(hook.cursor, last.seq)
                    guard try await store.saveWebhookProgress(hook) else { return nil }
                    continue
                }
                let body = WireEncoder.encode(API.WebhookBatch(events: events.map(API.Event.init))).jsonBytes
                let sent = clock.now
                let (status, failure) = await post(body, to: hook, secrets: secrets, http: client)
                if Task.isCancelled { return nil }
                await record(hook, status: status, error: failure?.error, events: events, since: sent, kind: "delivery")
                if let failure {
                    hook.failed(status: failure.status, error: failure.error, at: clock.now, maximumBackoff: settings.maximumBackoff)
                    metrics?.webhookFailed(app: hook.bundleID, webhook: hook.id)
                    logger.warning("webhook failed; it will be tried again", metadata: [
                        "webhook": "\(hook.id)", "app": "\(hook.bundleID)", "status": "\(failure.status)", "error": "\(failure.error)", "retry.at": "\(hook.nextAttemptAt ?? clock.now)",
                    ])
                    guard try await store.saveWebhookProgress(hook) else { return nil }
                    try await disableIfFailingTooLong(hook)
                    return hook.nextAttemptAt
                }
                hook.acknowledged(through: last.seq, count: events.count, at: clock.now)
                guard try await store.saveWebhookProgress(hook) else { return nil }  // deleted or changed meanwhile
            }
            return clock.now
        } catch {
            logger.log(level: .forStoreFailure(.warning, error), "webhooks: the store failed; trying again", metadata: ["webhook": "\(hook.id)", "error": "\(error)"])
            return clock.now.addingTimeInterval(1)
        }
    }

    /// The endpoints being served now, and the soonest retry one of them asked for.
    final class LoopState: Sendable {
        let busy = Mutex<Set<String>>([])
        let nextTry = Mutex<Date?>(nil)
    }

    struct Failure {
        var status: Int
        var error: String
    }

    /// Sends one event to `hook` now, out of its stream (its cursor does not move), and keeps the
    /// attempt in its log. The endpoint is checked under this server's rules first.
    func redeliver(_ event: StoredEvent, to hook: WebhookRecord) async throws -> WebhookAttempt {
        let sent = clock.now
        let answer: (status: Int, failure: Failure?)
        switch await WebhookTarget.check(url: hook.url, settings: settings) {
        case .failure(let refusal): answer = (0, Failure(status: 0, error: refusal.message))
        case .success(let target):
            let client = self.client(for: target)
            answer = await post(WireEncoder.encode(API.WebhookBatch(events: [API.Event(event)])).jsonBytes, to: hook, secrets: try signingSecrets(hook), http: client)
            try? await client.shutdown()
        }
        await record(hook, status: answer.status, error: answer.failure?.error, events: [event], since: sent, kind: "redelivery")
        return WebhookAttempt(webhookID: hook.id, bundleID: hook.bundleID, at: sent, status: answer.status, latencyMS: max(0, clock.now.timeIntervalSince(sent) * 1000),
                              error: answer.failure?.error, events: 1, firstEvent: event.seq, lastEvent: event.seq, kind: "redelivery")
    }

    /// The secrets that sign a request now: the current one, and the one before a rotation until
    /// its overlap ends (a receiver holding either verifies the request).
    func signingSecrets(_ hook: WebhookRecord) throws -> [String] {
        func open(_ sealed: String) throws -> String { try masterKey.map { try $0.open(sealed, bundleID: hook.bundleID) } ?? sealed }
        var secrets = [try open(hook.secret)]
        if let previous = hook.previousSecret, let until = hook.previousSecretUntil, until > clock.now { secrets.append(try open(previous)) }
        return secrets
    }

    /// The attempt, in the webhook's log (a failure to write it is logged, never fatal).
    func record(_ hook: WebhookRecord, status: Int, error: String?, events: [StoredEvent], since: Date, kind: String) async {
        let attempt = WebhookAttempt(webhookID: hook.id, bundleID: hook.bundleID, at: since, status: status, latencyMS: max(0, clock.now.timeIntervalSince(since) * 1000),
                                     error: error, events: events.count, firstEvent: events.first?.seq, lastEvent: events.last?.seq, kind: kind)
        do { try await store.recordWebhookAttempt(attempt) } catch {
            logger.log(level: .forStoreFailure(.warning, error), "webhooks: could not keep an attempt in the log", metadata: ["webhook": "\(hook.id)", "error": "\(error)"])
        }
    }

    /// A webhook failing for longer than ``WebhookSettings/disableAfter`` is disabled, and the
    /// app's stream says so (`webhook.disabled`, in the same transaction).
    func disableIfFailingTooLong(_ hook: WebhookRecord) async throws {
        guard settings.disableAfter > 0, let since = hook.failingSince, clock.now.timeIntervalSince(since) >= settings.disableAfter,
              let current = try await store.webhook(id: hook.id), current.disabledAt == nil else { return }
        var disabled = current
        let days = settings.disableAfter / 86_400
        let reason = "failing since \(ISO8601DateFormatter().string(from: since)) (\(current.attempts) attempts; \(current.lastError ?? "no answer")): disabled after \(days.formatted()) day\(days == 1 ? "" : "s"); enable it once the endpoint answers"
        disabled.disabledAt = clock.now
        disabled.disabledReason = reason
        let event = NewEvent(bundleID: hook.bundleID, type: .webhookDisabled, data: [
            "webhookID": .string(hook.id), "url": .string(hook.url), "source": "failures", "reason": .string(reason), "failingSince": .int(Int64(since.timeIntervalSince1970)),
        ], at: clock.now)
        if try await store.changeWebhook(disabled, replayFrom: nil, resetFailure: false, events: [event]) {
            bell.ring()
            logger.warning("webhook disabled: it kept failing", metadata: ["webhook": "\(hook.id)", "app": "\(hook.bundleID)", "failing.since": "\(since)"])
        }
    }

    /// One POST, signed with each of `secrets`: the endpoint's status (0: no answer), and the
    /// failure unless it answered 2xx.
    func post(_ body: [UInt8], to hook: WebhookRecord, secrets: [String], http: HTTPClient) async -> (status: Int, failure: Failure?) {
        var request = HTTPClientRequest(url: hook.url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "Isle-Webhooks/1")
        request.headers.add(name: "Isle-Webhook-Id", value: hook.id)
        request.headers.add(name: WebhookSignature.header, value: WebhookSignature.sign(body: body, secrets: secrets, at: clock.now))
        request.body = .bytes(ByteBuffer(bytes: body))
        do {
            let response = try await http.execute(request, timeout: .seconds(Int64(max(1, settings.requestTimeout))))
            // The answer's body is read and dropped: never stored or shown (the endpoint may be
            // something the key holder wants to read through Isle).
            _ = try? await response.body.collect(upTo: 64 * 1024)
            let status = Int(response.status.code)
            if (200..<300).contains(status) { return (status, nil) }
            return (status, Failure(status: status, error: "the endpoint answered \(status)"))
        } catch {
            return (0, Failure(status: 0, error: Self.describe(error)))
        }
    }

    /// Whether `hook` was made with an API key that is revoked (or gone) now.
    func keyRevoked(_ hook: WebhookRecord) async throws -> Bool {
        guard let keyID = hook.keyID else { return false }
        let key = try await store.apiKeys(bundleID: hook.bundleID).first { $0.id == keyID }
        return key == nil || key?.revokedAt != nil
    }

    /// What the backend is told of a failed request: refused, timed out, the TLS handshake failed,
    /// or the connection failed — never an errno, a TLS library's text, or anything of the
    /// endpoint's answer but its status (a webhook must not be a way to probe a network).
    static func describe(_ error: any Error) -> String {
        if let e = error as? HTTPClientError {
            switch e {
            case .deadlineExceeded, .readTimeout: return "timed out: no answer within the timeout"
            case .connectTimeout: return "timed out: could not connect within the timeout"
            case .remoteConnectionClosed: return "the endpoint closed the connection"
            default: break
            }
        }
        let text = String(reflecting: error)
        if text.contains("NIOSSL") || text.contains("BoringSSL") || text.contains("handshake") || text.contains("certificate") {
            return "the TLS handshake failed (check the endpoint's certificate)"
        }
        if error is NIOConnectionError || text.contains("connectionRefused") || text.contains("ECONNREFUSED") || text.contains("connect") {
            return "could not connect to the endpoint"
        }
        return "the request failed"
    }
}
