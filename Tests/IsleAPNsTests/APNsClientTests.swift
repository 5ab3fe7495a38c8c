import Foundation
import IsleAPNs
import IsleCore
import IsleHTTP2Server
import IsleTesting
import Testing

@Suite("APNs client over HTTP/2 + TLS")
struct APNsClientTests {
    @Test("liveactivity push: every header, path and body (docs/protocol.md §2, §2.2)")
    func liveActivityHeaders() async throws {
        let clock = ManualWallClock(Samples.now)
        let key = TestProviderKey()
        try await withSinkAndClient(clock: clock, key: key) { sink, client in
            let id = APNsID.random()
            let payload = Samples.update()
            let response = try await client.send(.liveActivity(payload, token: Samples.token, bundleID: Samples.bundleID, priority: .low,
                                                               expiration: .at(Samples.now.addingTimeInterval(3600)), apnsID: id))
            #expect(response.status == 200)
            #expect(response.apnsID == id)
            let r = try #require(sink.requests.first)
            #expect(r.method == "POST")
            #expect(r.path == "/3/device/\(Samples.token.hex)")
            #expect(r.values("apns-push-type") == ["liveactivity"])
            #expect(r.values("apns-topic") == ["com.example.pizza.push-type.liveactivity"])
            #expect(r.values("apns-priority") == ["5"])
            #expect(r.values("apns-expiration") == ["1767229200"])
            #expect(r.values("apns-id") == [id.text])
            #expect(r.values("apns-collapse-id").isEmpty)
            #expect(r.body == payload.encoded)
            // No header is sent twice.
            let names = r.headers.map(\.name)
            #expect(Set(names).count == names.count, "\(names)")
            let auth = try #require(r.value("authorization"))
            #expect(auth.hasPrefix("bearer "))
            // The JWT, checked independently: exact header, integer iat, raw R‖S signature.
            let jwt = try DecodedJWT(String(auth.dropFirst("bearer ".count)))
            #expect(jwt.headerText == #"{"alg":"ES256","kid":"ABC123DEFG"}"#)
            #expect(jwt.claimsText == #"{"iss":"DEF123GHIJ","iat":1767225600}"#)
            #expect(jwt.signature.count == 64)
            #expect(try jwt.verifies(with: key.publicKeyPEM))
            #expect(try !jwt.verifies(with: TestProviderKey().publicKeyPEM))
        }
    }

    @Test("widgets push (docs/protocol.md §9.1) and collapse id")
    func widgets() async throws {
        try await withSinkAndClient { sink, client in
            var push = APNsPush.widgetsReload(token: Samples.token, bundleID: Samples.bundleID)
            push.collapseID = "fav"
            push.expiration = .immediately
            try await client.send(push)
            let r = try #require(sink.requests.first)
            #expect(r.value("apns-push-type") == "widgets")
            #expect(r.value("apns-topic") == "com.example.pizza.push-type.widgets")
            #expect(r.value("apns-priority") == "10")
            #expect(r.value("apns-expiration") == "0")
            #expect(r.value("apns-collapse-id") == "fav")
            #expect(r.bodyText == #"{"aps":{"content-changed":true}}"#)
        }
    }

    @Test("one JWT shared by all requests; refreshed after 50 minutes, not before (docs/protocol.md, Wire)")
    func jwtSharingAndRefresh() async throws {
        let clock = ManualWallClock(Samples.now)
        try await withSinkAndClient(clock: clock) { sink, client in
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<20 { group.addTask { try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID)) } }
                try await group.waitForAll()
            }
            clock.advance(by: 49 * 60 + 59)
            try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            #expect(Set(sink.requests.compactMap { $0.value("authorization") }).count == 1)
            clock.advance(by: 1)
            try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            let auths = sink.requests.compactMap { $0.value("authorization") }
            #expect(Set(auths).count == 2)
            let last = try DecodedJWT(String(auths.last!.dropFirst(7)))
            #expect(last.claims["iat"] as? Int == 1_767_225_600 + 50 * 60)
            #expect(client.tokens.mintedCount == 2)
        }
    }

    @Test("403 ExpiredProviderToken: a new JWT and one retry once 20 minutes have passed; never sooner")
    func expiredProviderToken() async throws {
        let clock = ManualWallClock(Samples.now)
        try await withSinkAndClient(clock: clock) { sink, client in
            try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            // 10 minutes in: APNs says expired, but replacing now would break the 20-minute rule.
            clock.advance(by: 600)
            sink.enqueueError(status: 403, reason: "ExpiredProviderToken")
            do throws(APNsError) {
                try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
                Issue.record("expected an error")
            } catch {
                #expect(error.code == .rejected)
                #expect(error.response?.reason == .expiredProviderToken)
                #expect(error.remedy == .newProviderToken)
            }
            #expect(client.tokens.mintedCount == 1)
            #expect(sink.requestCount == 2)
            // 25 minutes in: because APNs called the token expired, the next push carries a new one.
            clock.advance(by: 900)
            try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            #expect(client.tokens.mintedCount == 2)
            // A token 25 minutes old rejected as expired: a new JWT and one transparent retry.
            clock.advance(by: 1500)
            sink.enqueueError(status: 403, reason: "ExpiredProviderToken")
            let response = try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            #expect(response.status == 200)
            #expect(client.tokens.mintedCount == 3)
            let auths = sink.requests.suffix(2).compactMap { $0.value("authorization") }
            #expect(auths[0] != auths[1])
            // A second rejection of a fresh token is not retried again: the error reaches the caller.
            sink.enqueueError(status: 403, reason: "ExpiredProviderToken", times: 2)
            await #expect(throws: APNsError.self) {
                try await client.send(.liveActivity(Samples.update(clock.now), token: Samples.token, bundleID: Samples.bundleID))
            }
            #expect(client.tokens.mintedCount == 3)
        }
    }

    struct ReasonCase: Sendable, CustomTestStringConvertible {
        let status: Int
        let reason: String
        let remedy: APNsRemedy
        var testDescription: String { "\(status) \(reason)" }
    }

    static let reasonCases: [ReasonCase] = [
        .init(status: 400, reason: "BadDeviceToken", remedy: .dropToken),
        .init(status: 400, reason: "DeviceTokenNotForTopic", remedy: .dropToken),
        .init(status: 400, reason: "BadTopic", remedy: .fixRequest),
        .init(status: 400, reason: "BadPriority", remedy: .fixRequest),
        .init(status: 400, reason: "IdleTimeout", remedy: .retryLater),
        .init(status: 403, reason: "InvalidProviderToken", remedy: .fixConfiguration),
        .init(status: 403, reason: "UnrelatedKeyIdInToken", remedy: .openNewConnection),
        .init(status: 404, reason: "BadPath", remedy: .fixRequest),
        .init(status: 405, reason: "MethodNotAllowed", remedy: .fixRequest),
        .init(status: 410, reason: "Unregistered", remedy: .dropToken),
        .init(status: 410, reason: "ExpiredToken", remedy: .dropToken),
        .init(status: 413, reason: "PayloadTooLarge", remedy: .fixRequest),
        .init(status: 429, reason: "TooManyRequests", remedy: .retryLater),
        .init(status: 429, reason: "TooManyProviderTokenUpdates", remedy: .openNewConnection),
        .init(status: 500, reason: "InternalServerError", remedy: .retryLater),
        .init(status: 503, reason: "ServiceUnavailable", remedy: .retryLater),
        .init(status: 503, reason: "Shutdown", remedy: .retryLater),
        .init(status: 503, reason: "BrandNewReason", remedy: .retryLater),
    ]

    @Test("each error reason is parsed and mapped to what to do", arguments: reasonCases)
    func reasons(_ c: ReasonCase) async throws {
        try await withSinkAndClient { sink, client in
            let invalidSince = Date(timeIntervalSince1970: 1_767_225_000.123)
            sink.enqueueError(status: c.status, reason: c.reason, timestamp: c.status == 410 ? invalidSince : nil)
            do throws(APNsError) {
                try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID))
                Issue.record("expected an error")
            } catch {
                #expect(error.code == .rejected)
                let response = try #require(error.response)
                #expect(response.status == c.status)
                #expect(response.reason?.rawValue == c.reason)
                #expect(error.remedy == c.remedy)
                #expect(response.apnsID != nil)
                if c.status == 410 {
                    #expect(abs(response.invalidSince!.timeIntervalSince1970 - 1_767_225_000.123) < 0.001)
                }
                // Errors never reveal the token or the JWT.
                #expect(!error.description.contains(Samples.token.hex))
                #expect(!error.description.contains("eyJ"))
                #expect(error.description.contains(c.reason))
            }
            #expect(sink.requestCount == 1, "no retries for \(c.reason)")
        }
    }

    @Test("apns-unique-id is read from the response (sandbox)")
    func uniqueID() async throws {
        try await withSinkAndClient { sink, client in
            sink.enqueue(HTTP2ServerResponse(status: 200, headers: [("apns-unique-id", "2b5f3a0c-1111-2222-3333-444455556666")]))
            let r = try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID))
            #expect(r.apnsUniqueID == "2b5f3a0c-1111-2222-3333-444455556666")
        }
    }

    struct Refusal: Sendable, CustomTestStringConvertible {
        let name: String
        let push: @Sendable () -> APNsPush
        let mentions: String
        var testDescription: String { name }
    }

    static let refusals: [Refusal] = [
        Refusal(name: "start without alert", push: {
            .liveActivity(LiveActivityPayload(event: .start, timestamp: Samples.now, contentState: [:], attributesType: "P", attributes: [:]), token: Samples.token, bundleID: Samples.bundleID)
        }, mentions: "alert"),
        Refusal(name: "payload over 4096 bytes", push: {
            .liveActivity(LiveActivityPayload(event: .update, timestamp: Samples.now, contentState: ["x": .string(String(repeating: "x", count: 5000))]), token: Samples.token, bundleID: Samples.bundleID)
        }, mentions: "4096"),
        Refusal(name: "collapse id over 64 bytes", push: {
            var p = APNsPush.widgetsReload(token: Samples.token, bundleID: Samples.bundleID)
            p.collapseID = String(repeating: "c", count: 65)
            return p
        }, mentions: "64"),
        Refusal(name: "background at priority 10", push: {
            APNsPush(deviceToken: Samples.token, bundleID: Samples.bundleID, pushType: .background, payload: Array(#"{"aps":{"content-available":1}}"#.utf8), priority: .high)
        }, mentions: "priority 5"),
        Refusal(name: "bundle id with topic suffix", push: {
            .liveActivity(Samples.update(), token: Samples.token, bundleID: "com.example.pizza.push-type.liveactivity")
        }, mentions: "bare bundle id"),
        Refusal(name: "liveactivity at priority 1", push: {
            .liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID, priority: .powerConsiderate)
        }, mentions: "5 or 10"),
        Refusal(name: "content-state that does not decode", push: {
            let schema = try! ActivitySchema(jsonText: #"{"attributesType":"P","contentState":{"driverName":"string","eta":"date"}}"#)
            return .liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID, schema: schema)
        }, mentions: "$.aps.content-state.eta"),
    ]

    @Test("refuses to send what APNs or the device would reject, and sends nothing", arguments: refusals)
    func refuses(_ r: Refusal) async throws {
        try await withSinkAndClient { sink, client in
            do throws(APNsError) {
                try await client.send(r.push())
                Issue.record("sent")
            } catch {
                #expect(error.code == .invalidRequest)
                #expect(error.description.contains(r.mentions), "\(error)")
            }
            #expect(sink.requestCount == 0)
        }
    }

    @Test("many requests in flight on pooled HTTP/2 connections")
    func concurrency() async throws {
        try await withSinkAndClient { sink, client in
            let ids = try await withThrowingTaskGroup(of: APNsID?.self) { group in
                for _ in 0..<300 {
                    group.addTask { try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID)).apnsID }
                }
                return try await group.reduce(into: Set<APNsID>()) { if let id = $1 { $0.insert(id) } }
            }
            #expect(ids.count == 300)
            #expect(sink.requestCount == 300)
            // HTTP/2 multiplexing: far fewer connections than requests.
            #expect(Set(sink.requests.map(\.connectionID)).count < 10)
        }
    }

    @Test("per-request deadline")
    func deadline() async throws {
        try await withSinkAndClient(requestTimeout: .milliseconds(300)) { sink, client in
            sink.enqueue(HTTP2ServerResponse(status: 200, delay: .seconds(30)))
            let start = ContinuousClock.now
            do throws(APNsError) {
                try await client.send(.liveActivity(Samples.update(), token: Samples.token, bundleID: Samples.bundleID))
                Issue.record("expected a timeout")
            } catch {
                #expect(error.code == .transport)
                #expect(error.transport?.kind == .timedOut)
                #expect(error.remedy == .retryLater)
            }
            // At the 300 ms deadline, not when the server answers (30 s); generous for a loaded machine.
            #expect(ContinuousClock.now - start < .seconds(10))
        }
    }

    @Test("trust roots: several CA certificates, as `cat` joins them (even without a final newline), on both transports", arguments: APNsTransportKind.allCases)
    func severalTrustRoots(_ kind: APNsTransportKind) async throws {
        try await RecordingAPNsServer.withServer { sink in
            let other = try CertificateAuthority()
            let trimmed = other.certificatePEM.trimmingCharacters(in: .whitespacesAndNewlines)
            let key = TestProviderKey()
            let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
            let client = try APNsClient(configuration: .init(environment: .custom(url: sink.baseURL, trustRootsPEM: trimmed + sink.caCertificatePEM), credentials: credentials,
                                                             transport: kind), logger: .init(label: "t"))
            let response = try await client.send(.liveActivity(Samples.update(Date()), token: Samples.token, bundleID: Samples.bundleID))
            #expect(response.status == 200)
            try await client.shutdown()
        }
    }

    @Test("one trust file for two fake APNs (a sandbox and a production simulator): each server's certificate checks against its own CA", arguments: APNsTransportKind.allCases)
    func twoServersOneTrustFile(_ kind: APNsTransportKind) async throws {
        try await RecordingAPNsServer.withServer { first in
            try await RecordingAPNsServer.withServer { second in
                let roots = first.caCertificatePEM + second.caCertificatePEM
                let key = TestProviderKey()
                let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
                for sink in [first, second] {
                    let client = try APNsClient(configuration: .init(environment: .custom(url: sink.baseURL, trustRootsPEM: roots), credentials: credentials, transport: kind),
                                                logger: .init(label: "t"))
                    let response = try await client.send(.liveActivity(Samples.update(Date()), token: Samples.token, bundleID: Samples.bundleID))
                    #expect(response.status == 200)
                    try await client.shutdown()
                }
            }
        }
    }

    @Test("a server whose certificate is not trusted is refused")
    func untrustedServer() async throws {
        try await RecordingAPNsServer.withServer { sink in
            let other = try CertificateAuthority()
            let key = TestProviderKey()
            let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
            let client = try APNsClient(configuration: .init(environment: .custom(url: sink.baseURL, trustRootsPEM: other.certificatePEM), credentials: credentials, connectTimeout: .seconds(2)),
                                        logger: .init(label: "t"))
            do throws(APNsError) {
                try await client.send(.liveActivity(Samples.update(Date()), token: Samples.token, bundleID: Samples.bundleID))
                Issue.record("sent to an untrusted server")
            } catch {
                #expect(error.code == .transport)
            }
            try await client.shutdown()
            #expect(sink.requestCount == 0)
        }
    }

    @Test("nothing listening: a transport error, not a crash")
    func noServer() async throws {
        let key = TestProviderKey()
        let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
        let client = try APNsClient(configuration: .init(environment: .custom(url: "https://127.0.0.1:1", trustRootsPEM: nil), credentials: credentials, connectTimeout: .seconds(2)), logger: .init(label: "t"))
        await #expect(throws: APNsError.self) {
            try await client.send(.liveActivity(Samples.update(Date()), token: Samples.token, bundleID: Samples.bundleID))
        }
        try await client.shutdown()
    }
}
