public import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension IsleClient {
    /// Sends reports until ``stop()``: at once when one is added, and when a retry is due. Also
    /// follows the app's ``Configuration/lifecycle``: each foreground entry runs ``refresh()``.
    /// Call it once, in a task of the app's.
    public func run() async {
        guard !running, !stopped else { return }
        running = true
        defer { running = false }
        if let entries = foregroundEntries {
            // Subscribed at `init`: an entry before `run()` got going waits in the stream.
            lifecycleTask = Task { [weak self] in
                for await _ in entries { await self?.refresh() }
            }
        }
        if let transport = configuration.backgroundTransport, answersTask == nil {
            let answers = transport.answers()
            answersTask = Task { [weak self] in
                for await answer in answers { await self?.received(answer) }
            }
        }
        // A launch a day (by default) after the server last took the installation sends it again.
        noteInstallation()
        while !Task.isCancelled, !stopped {
            let wait = await flush()
            await holdBackgroundTime()
            await sleep(upTo: wait)
        }
    }

    /// Wakes ``run()`` (a new report, or ``stop()``).
    func wake() {
        if let w = waiter {
            waiter = nil
            w.resume()
        } else {
            wakePending = true
        }
    }

    /// Waits for ``wake()``, or `seconds` (nil: no timer).
    func sleep(upTo seconds: TimeInterval?) async {
        if wakePending || stopped {
            wakePending = false
            return
        }
        let timer = seconds.map { wait in
            Task { [weak self] in
                // `Task.sleep(nanoseconds:)` (iOS 13): the SDK's floor is iOS 16.1.
                try? await Task.sleep(nanoseconds: UInt64(min(3600, max(0.01, wait)) * 1_000_000_000))
                await self?.wake()
            }
        }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in waiter = c }
        timer?.cancel()
        wakePending = false
    }

    /// Keeps a background task open while a report is due soon (so a push-started activity's
    /// registration survives the app's suspension), and gives it back once nothing is.
    func holdBackgroundTime() async {
        guard let lifecycle = configuration.lifecycle else { return }
        // One caller at a time talks to the system; a call that arrives meanwhile makes it look again.
        guard !backgroundBusy else {
            backgroundRecheck = true
            return
        }
        backgroundBusy = true
        defer { backgroundBusy = false }
        repeat {
            backgroundRecheck = false
            let horizon = Date().addingTimeInterval(configuration.backgroundWindow)
            let needed = !stopped && !backgroundExpired && state.outbox.contains { $0.notBefore <= horizon }
            if needed, background == nil {
                let id = await lifecycle.beginBackgroundTask(name: "IsleClient reports") { [weak self] in
                    Task { await self?.backgroundTimeExpired() }
                }
                if let id { background = id }
            } else if !needed, let id = background {
                background = nil
                await lifecycle.endBackgroundTask(id)
            }
        } while backgroundRecheck
    }

    func backgroundTimeExpired() async {
        backgroundExpired = true
        await handOff()
        guard let id = background, let lifecycle = configuration.lifecycle else { return }
        background = nil
        await lifecycle.endBackgroundTask(id)
    }

    /// The background time is up with reports unsent: the next report of each lane (only the
    /// installation's, while it is not registered) goes to the system's background transport, with
    /// its request frozen as for any send. Its answer is applied when it comes (``run()``).
    func handOff() async {
        guard let transport = configuration.backgroundTransport, !stopped else { return }
        var heads: [String: String] = [:]
        for r in state.outbox where heads[r.lane] == nil { heads[r.lane] = r.key }
        if state.secret == nil { heads = heads.filter { $0.key == ClientState.installationLane } }
        for key in heads.values.sorted() {
            guard let i = state.outbox.firstIndex(where: { $0.key == key }), !state.outbox[i].handedOff else { continue }
            if state.outbox[i].request == nil {
                // A registration that needs a ticket from the app waits for the next launch.
                if configuration.ticket != nil, case .register(_, _, _, .some, _) = state.outbox[i].kind, state.tickets[ClientState.local(ofLane: state.outbox[i].lane)] == nil { continue }
                guard case .success(let r) = makeRequest(state.outbox[i]) else { continue }
                state.outbox[i].request = r
            }
            guard let request = urlRequest(state.outbox[i]) else { continue }
            state.outbox[i].handedOff = true
            persist()
            log(Self.name(state.outbox[i].kind), request.httpMethod ?? "", state.outbox[i].request?.path ?? "", nil, "handed to the system")
            await transport.enqueue(request, body: state.outbox[i].request?.body ?? Data(), key: key)
        }
    }

    /// An answer the background transport brought: applied as if this launch had sent it.
    func received(_ answer: BackgroundAnswer) {
        guard let report = state.outbox.first(where: { $0.key == answer.key }), let frozen = report.request else { return }
        guard let status = answer.status, let url = URL(string: configuration.serverURL.absoluteString),
              let response = HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: answer.retryAfter.map { ["Retry-After": $0] } ?? [:]) else {
            // Not sent after all: it goes with the next flush.
            if let i = state.outbox.firstIndex(where: { $0.key == answer.key }) { state.outbox[i].handedOff = false }
            persist()
            return
        }
        let read = ClientWire.Answer.read(answer.body, status: status, installation: report.kind == .installation)
        let outcome = Self.outcome(response, answer: read, report: report, hasSecret: state.secret != nil, canRefetchTicket: configuration.ticket != nil)
        apply(logged(outcome, Self.name(report.kind), frozen.method, frozen.path, status), to: report)
        wake()
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
        case refused(Refusal)
        /// The installation's secret is lost: start over under a new installation id.
        case newInstallation
        /// The registration's ticket was refused as expired or invalid: fetch a new one.
        case newTicket
        /// The server no longer has this installation (pruned, or restored from an older backup):
        /// register it again, under the same id and secret, then its live activities.
        case installationUnknown
        /// The server no longer has this activity: register it again (a token report), or drop
        /// the report (an end or dismissal of an activity the server does not have).
        case activityUnknown
    }

    func send(_ report: Report) async {
        guard !stopped, state.outbox.contains(where: { $0.key == report.key }) else { return }
        // The request is fixed at its first attempt and every retry repeats it exactly: its
        // Idempotency-Key stands for this one request (the server refuses the key with another
        // body), and what changed since goes in a newer report.
        if state.outbox.first(where: { $0.key == report.key })?.request == nil {
            if let why = await fetchTicketIfNeeded(report) {
                reschedule(report.key, after: nil, note: why)
                return
            }
            guard !stopped, let i = state.outbox.firstIndex(where: { $0.key == report.key }) else { return }
            switch makeRequest(state.outbox[i]) {
            case .success(let r): state.outbox[i].request = r
            case .failure(let refusal):
                state.refused.append(refusal.message)
                let kind = state.outbox[i].kind
                state.outbox.remove(at: i)
                if let local = Self.activity(kind) { publishStatus(local) }
                persist()
                return
            }
        }
        guard let i = state.outbox.firstIndex(where: { $0.key == report.key }) else { return }
        state.outbox[i].attempts += 1
        persist()
        let frozen = state.outbox[i]
        let outcome = await perform(frozen)
        apply(outcome, to: frozen)
    }

    /// What the server's answer to `frozen` (sent now, or by the system's background transport)
    /// means for the outbox and the state.
    func apply(_ outcome: Outcome, to frozen: Report) {
        let report = frozen
        // Stopped meanwhile (the app is going away): like a process that died here, the answer is
        // not written; the next launch repeats the request with the same key.
        guard !stopped, let j = state.outbox.firstIndex(where: { $0.key == report.key }) else { return }
        switch outcome {
        case .done(let id, let secret):
            if let secret {
                state.secret = secret
            } else if report.kind == .installation, state.secret == nil {
                // The server took the secret this installation proposed (no secret in the answer).
                state.secret = state.proposedSecret
            }
            state.outbox.remove(at: j)
            if report.kind == .installation {
                state.installationSentAt = configuration.now()
                if let sent = frozen.request?.body, let body = try? JSONDecoder().decode(ClientWire.InstallationReport.self, from: sent),
                   let ticket = body.ticket, ticket == state.userTicket {
                    state.userTicket = nil
                }
                if state.resyncPending {
                    state.resyncPending = false
                    state.reRegisterLiveActivities()
                }
            }
            switch report.kind {
            case .register(let local, _, let token, _, _), .token(let local, let token): state.serverTokens[local] = token
            default: break
            }
            if let local = Self.registration(report.kind) {
                if let id { state.serverIDs[local] = id }
                state.tickets[local] = nil
                publishStatus(local)
            }
        case .retry(let after):
            reschedule(report.key, after: after, note: nil)
        case .newTicket:
            // Made anew under a new key, with a ticket fetched now.
            if let local = Self.registration(report.kind) { state.tickets[local] = nil }
            state.outbox[j].ticketRefreshes += 1
            state.outbox[j].request = nil
            state.outbox[j].key = UUID().uuidString.lowercased()
        case .refused(let why):
            state.refused.append("\(frozen.request?.method ?? "") \(frozen.request?.path ?? ""): \(why)")
            state.outbox.remove(at: j)
            // Nothing after a refused registration can reach the server.
            if let local = Self.registration(report.kind) {
                state.outbox.removeAll { $0.lane == ClientState.lane(local) }
                state.registered.remove(local)
                state.types[local] = nil
                state.tickets[local] = nil
                state.refusals[local] = why
                publishStatus(local)
            }
        case .installationUnknown:
            // Same id, same secret: the server takes the secret a new installation proposes.
            if let secret = state.secret { state.proposedSecret = secret }
            state.secret = nil
            state.resyncPending = true
            state.outbox[j].attempts = 0
            state.outbox[j].key = UUID().uuidString.lowercased()
            state.outbox[j].request = nil
        case .activityUnknown:
            switch report.kind {
            case .token(let local, let token):
                state.serverIDs[local] = nil
                if let r = state.registrations[local] {
                    state.outbox[j].attempts = 0
                    state.outbox[j].key = UUID().uuidString.lowercased()
                    state.outbox[j].request = nil
                    if let known = state.serverTokens[local], known != token {
                        // Registered again with the token the server last took: a server that has
                        // the row after all answers it (no second row), one that lost it makes it;
                        // then this rotation, as before.
                        let again = Report(key: UUID().uuidString.lowercased(), lane: report.lane,
                                           kind: .register(local: local, attributesType: r.attributesType, token: known, externalKey: r.externalKey, topics: r.topics))
                        state.outbox.insert(again, at: j)
                    } else {
                        state.outbox[j].kind = .register(local: local, attributesType: r.attributesType, token: token, externalKey: r.externalKey, topics: r.topics)
                    }
                } else {
                    state.outbox.remove(at: j)
                    state.refused.append("PUT token for \(local): the server no longer has this activity and this SDK's state predates its registration record")
                }
                publishStatus(local)
            default:
                // An end or a dismissal of an activity the server does not have: nothing to tell it.
                if let local = Self.activity(report.kind) { state.serverIDs[local] = nil }
                state.outbox.remove(at: j)
            }
        case .newInstallation:
            state.installationID = UUID().uuidString.lowercased()
            state.secret = nil
            state.proposedSecret = ClientState.makeSecret()
            state.resyncPending = true
            // Every request made for the old id is made anew, under a new key.
            for k in state.outbox.indices where state.outbox[k].request != nil || k == j {
                state.outbox[k].attempts = 0
                state.outbox[k].key = UUID().uuidString.lowercased()
                state.outbox[k].request = nil
            }
        }
        persist()
    }

    func reschedule(_ key: String, after: TimeInterval?, note: String?) {
        guard let j = state.outbox.firstIndex(where: { $0.key == key }) else { return }
        let attempts = max(1, state.outbox[j].attempts)
        let backoff = min(configuration.maximumRetry, configuration.firstRetry * pow(2, Double(attempts - 1)))
        state.outbox[j].notBefore = Date().addingTimeInterval(max(after ?? 0, backoff))
        if note != nil { state.outbox[j].attempts += 1 }
        persist()
    }

    /// The registration's ticket from ``Configuration/ticket``, when it names a key and has none
    /// yet. Answers why it must wait (the provider failed), or nil to go on.
    func fetchTicketIfNeeded(_ report: Report) async -> String? {
        guard let provider = configuration.ticket else { return nil }
        let local: String, type: String, key: String?
        switch report.kind {
        case .register(let l, let t, _, let k, _), .registerChannel(let l, let t, _, let k, _): (local, type, key) = (l, t, k)
        default: return nil
        }
        guard let key, state.tickets[local] == nil else { return nil }
        let request = TicketRequest(externalKey: key, attributesType: type, activityID: local, installationID: state.installationID)
        do {
            if let ticket = try await provider(request) { state.tickets[local] = ticket }
            return nil
        } catch {
            log("ticket", "GET", "(the app's ticket provider)", nil, "retrying")
            return "the ticket provider failed"
        }
    }

    static func registration(_ kind: Report.Kind) -> String? {
        switch kind {
        case .register(let local, _, _, _, _), .registerChannel(let local, _, _, _, _): local
        default: nil
        }
    }

    static func activity(_ kind: Report.Kind) -> String? {
        switch kind {
        case .register(let local, _, _, _, _), .registerChannel(let local, _, _, _, _), .token(let local, _), .state(let local, _): local
        case .installation: nil
        }
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

    /// The report as a request, from the state as it is now.
    func makeRequest(_ report: Report) -> Result<Report.Request, Refusal> {
        switch report.kind {
        case .installation:
            let body = ClientWire.InstallationReport(pushToStartTokens: state.pushToStartTokens.isEmpty ? nil : state.pushToStartTokens, widgetToken: state.widgetToken,
                                                     controlsToken: state.controlsToken, liveActivitiesEnabled: state.liveActivitiesEnabled, frequentPushesEnabled: state.frequentPushesEnabled,
                                                     environment: configuration.environment?.rawValue, ticket: state.userTicket,
                                                     broadcastChannels: configuration.capabilities.broadcastChannels, topics: state.startTopics)
            return .success(Report.Request(method: "PUT", path: "/v1/installations/\(state.installationID)", body: ClientWire.encode(body)))
        case .register(let local, let type, let token, let key, let topics):
            var body = registration(local: local, type: type, key: key, topics: topics)
            body.token = token
            body.environment = configuration.environment?.rawValue
            return .success(Report.Request(method: "POST", path: "/v1/activities", body: ClientWire.encode(body)))
        case .registerChannel(let local, let type, let channel, let key, let topics):
            var body = registration(local: local, type: type, key: key, topics: topics)
            body.channelID = channel
            return .success(Report.Request(method: "POST", path: "/v1/activities", body: ClientWire.encode(body)))
        case .token(let local, let token):
            guard let id = state.serverIDs[local] else { return .failure(Refusal(status: nil, code: "notRegistered", message: "token rotation for activity \(local), which the server never registered")) }
            return .success(Report.Request(method: "PUT", path: "/v1/activities/\(id)/token", body: ClientWire.encode(ClientWire.TokenReport(token: token))))
        case .state(let local, let what):
            guard let id = state.serverIDs[local] else { return .failure(Refusal(status: nil, code: "notRegistered", message: "\(what) for activity \(local), which the server never registered")) }
            // A state report has no body (the document describes none).
            return .success(Report.Request(method: "POST", path: "/v1/activities/\(id)/\(what)", body: Data()))
        }
    }

    /// A registration's body: the activity, its installation, and its key with the ticket for it.
    func registration(local: String, type: String, key: String?, topics: [String]) -> ClientWire.ActivityRegistration {
        ClientWire.ActivityRegistration(attributesType: type, installationID: state.installationID, externalKey: key,
                                        topics: topics.isEmpty ? nil : topics, ticket: key == nil ? nil : state.tickets[local])
    }

    func perform(_ report: Report) async -> Outcome {
        guard let frozen = report.request else { return .retry(after: nil) }
        let method = frozen.method, path = frozen.path
        let name = Self.name(report.kind)
        guard let request = urlRequest(report) else {
            return logged(.refused(Refusal(status: nil, code: "badURL", message: "the server URL cannot take \(path)")), name, method, path, nil)
        }
        let data: Data
        let response: HTTPURLResponse
        do {
            let (d, r) = try await transfer(request)
            guard let http = r as? HTTPURLResponse else { return logged(.retry(after: nil), name, method, path, nil) }
            (data, response) = (d, http)
        } catch {
            // The network, or the server away: try again later.
            return logged(.retry(after: nil), name, method, path, nil)
        }
        let read = ClientWire.Answer.read(data, status: response.statusCode, installation: report.kind == .installation)
        let outcome = Self.outcome(response, answer: read, report: report, hasSecret: state.secret != nil, canRefetchTicket: configuration.ticket != nil)
        return logged(outcome, name, method, path, response.statusCode)
    }

    /// The report's frozen request, with its headers: the key, the device key, the installation's secret.
    func urlRequest(_ report: Report) -> URLRequest? {
        guard let frozen = report.request,
              let url = URL(string: configuration.serverURL.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + frozen.path) else { return nil }
        var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
        request.httpMethod = frozen.method
        request.setValue("Bearer \(configuration.deviceKey)", forHTTPHeaderField: "Authorization")
        request.setValue(report.key, forHTTPHeaderField: "Idempotency-Key")
        if !frozen.body.isEmpty { request.setValue("application/json", forHTTPHeaderField: "Content-Type") }
        request.setValue(state.secret ?? state.proposedSecret, forHTTPHeaderField: "Isle-Installation-Secret")
        request.httpBody = frozen.body.isEmpty ? nil : frozen.body
        return request
    }

    static func name(_ kind: Report.Kind) -> String {
        switch kind {
        case .installation: "installation"
        case .register, .registerChannel: "register"
        case .token: "token"
        case .state(_, let what): what
        }
    }

    func logged(_ outcome: Outcome, _ report: String, _ method: String, _ path: String, _ status: Int?) -> Outcome {
        let text = switch outcome {
        case .done: "sent"
        case .retry, .newTicket: "retrying"
        case .refused: "refused"
        case .newInstallation: "new installation"
        case .installationUnknown: "installation unknown"
        case .activityUnknown: "activity unknown"
        }
        log(report, method, path, status, text)
        return outcome
    }

    static func outcome(_ response: HTTPURLResponse, answer: ClientWire.Answer?, report: Report, hasSecret: Bool, canRefetchTicket: Bool) -> Outcome {
        let error = answer?.error
        let code = error?.code ?? ""
        let field = error?.field
        switch response.statusCode {
        case 200..<300:
            return .done(serverID: answer?.id, secret: answer?.installationSecret)
        case 429, 500..<600:
            // Retry-After in seconds, bounded: a server's odd value never parks the outbox for ever.
            let after = response.value(forHTTPHeaderField: "Retry-After").flatMap(TimeInterval.init).map { $0.isFinite ? min(3600, max(0, $0)) : 60 }
            return .retry(after: after)
        case 403 where report.kind == .installation && !hasSecret:
            // Registered before, but its one-time secret was lost with an answer: a new installation.
            return .newInstallation
        case 403 where (code == "ticketExpired" || code == "invalidTicket") && canRefetchTicket && registration(report.kind) != nil && report.ticketRefreshes < 2:
            return .newTicket
        case 409 where code == "idempotencyKeyInUse":
            return .retry(after: 1)
        // Never stranded: the server lost the installation (retention, a restore) or the activity.
        case 404 where registration(report.kind) != nil && field == "installationID", 403 where code == "installationRequired":
            return .installationUnknown
        case 404 where activity(report.kind) != nil && registration(report.kind) == nil:
            return .activityUnknown
        default:
            return .refused(Refusal(status: response.statusCode, code: code.isEmpty ? "http\(response.statusCode)" : code, message: error?.message ?? ""))
        }
    }
}
