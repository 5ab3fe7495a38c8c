import IsleCore
import Testing

@Suite("APNs reasons (docs/protocol.md §3.4, §7.4)")
struct APNsReasonTests {
    // The device table and the broadcast table from docs/protocol.md, status by status.
    static let deviceTable: [(String, Int)] = [
        ("BadCollapseId", 400), ("BadDeviceToken", 400), ("BadExpirationDate", 400), ("BadMessageId", 400), ("BadPriority", 400),
        ("BadTopic", 400), ("DeviceTokenNotForTopic", 400), ("DuplicateHeaders", 400), ("IdleTimeout", 400), ("InvalidPushType", 400),
        ("MissingDeviceToken", 400), ("MissingTopic", 400), ("PayloadEmpty", 400), ("TopicDisallowed", 400), ("BadCertificate", 403),
        ("BadCertificateEnvironment", 403), ("ExpiredProviderToken", 403), ("Forbidden", 403), ("InvalidProviderToken", 403),
        ("MissingProviderToken", 403), ("UnrelatedKeyIdInToken", 403), ("BadEnvironmentKeyIdInToken", 403), ("BadPath", 404),
        ("MethodNotAllowed", 405), ("ExpiredToken", 410), ("Unregistered", 410), ("PayloadTooLarge", 413),
        ("TooManyProviderTokenUpdates", 429), ("TooManyRequests", 429), ("InternalServerError", 500), ("ServiceUnavailable", 503), ("Shutdown", 503),
    ]
    static let broadcastTable: [(String, Int)] = [
        ("FeatureNotEnabled", 400), ("MissingChannelId", 400), ("BadChannelId", 400), ("ChannelNotRegistered", 400), ("BadRequestParams", 400),
        ("BadRequestPayload", 400), ("PayloadEmpty", 400), ("BadMessageId", 400), ("MissingPushType", 400), ("InvalidPushType", 400),
        ("CannotCreateChannelConfig", 400), ("BadExpirationDate", 400), ("TopicDisallowed", 400), ("BadPriority", 400), ("BadCertificate", 403),
        ("BadCertificateEnvironment", 403), ("TopicMismatch", 403), ("MissingProviderToken", 403), ("ExpiredProviderToken", 403),
        ("InvalidProviderToken", 403), ("BadPath", 404), ("MethodNotAllowed", 405), ("PayloadTooLarge", 413), ("TooManyRequests", 429),
        ("TooManyProviderTokenUpdates", 429), ("InternalServerError", 500), ("Service Unavailable", 503), ("ServiceUnavailable", 503), ("Shutdown", 503),
    ]

    @Test("every documented reason is known with its status", arguments: deviceTable + broadcastTable)
    func known(_ reason: String, _ status: Int) throws {
        let info = try #require(APNsReason(reason).info)
        #expect(info.status == status)
        #expect(!info.meaning.isEmpty)
    }

    // What a sender must do, per docs/protocol.md §3.5 and §11.
    @Test("remedies", arguments: [
        ("BadDeviceToken", APNsRemedy.dropToken), ("DeviceTokenNotForTopic", .dropToken), ("Unregistered", .dropToken), ("ExpiredToken", .dropToken),
        ("ExpiredProviderToken", .newProviderToken), ("TooManyRequests", .retryLater), ("InternalServerError", .retryLater),
        ("ServiceUnavailable", .retryLater), ("Shutdown", .retryLater), ("PayloadTooLarge", .fixRequest), ("BadTopic", .fixRequest),
        ("UnrelatedKeyIdInToken", .openNewConnection), ("TooManyProviderTokenUpdates", .openNewConnection),
        ("InvalidProviderToken", .fixConfiguration), ("FeatureNotEnabled", .fixConfiguration), ("Forbidden", .fixConfiguration),
        ("IdleTimeout", .retryLater), ("MissingProviderToken", .fixRequest),
    ])
    func remedy(_ reason: String, _ remedy: APNsRemedy) {
        let r = APNsReason(reason)
        #expect(r.remedy(status: r.info!.status) == remedy)
    }

    @Test("unknown reasons are preserved and judged by status", arguments: [
        (500, APNsRemedy.retryLater), (503, .retryLater), (429, .retryLater), (410, .dropToken), (403, .newProviderToken), (400, .fixRequest), (404, .fixRequest),
    ])
    func unknown(_ status: Int, _ remedy: APNsRemedy) {
        let r = APNsReason("SomethingNew2027")
        #expect(!r.isKnown)
        #expect(r.rawValue == "SomethingNew2027")
        #expect(r.remedy(status: status) == remedy)
        #expect(r.explanation(status: status).contains("SomethingNew2027"))
    }

    @Test("every table entry is in one of the spec tables")
    func noInventions() {
        let documented = Set((Self.deviceTable + Self.broadcastTable).map(\.0))
        for reason in APNsReason.allKnown { #expect(documented.contains(reason.rawValue), "\(reason)") }
    }
}

@Suite("Device tokens (docs/protocol.md, Wire)")
struct DeviceTokenTests {
    @Test("accepts any even hex length of 16 bytes or more, lowercased")
    func accepts() throws {
        let long = String(repeating: "AB", count: 80)
        #expect(try DeviceToken(hex: long).hex == long.lowercased())
        #expect(try DeviceToken(hex: " " + String(repeating: "0f", count: 16) + "\n").hex.count == 32)
        #expect(try DeviceToken(bytes: [0x0a, 0xff] + Array(repeating: 1, count: 14)).hex.hasPrefix("0aff"))
    }

    @Test("rejects with a reason", arguments: [("", "empty"), ("zz" + String(repeating: "0", count: 40), "hexadecimal"), (String(repeating: "a", count: 33), "odd"), (String(repeating: "a", count: 30), "at least 16")])
    func rejects(_ text: String, _ reason: String) {
        do { _ = try DeviceToken(hex: text); Issue.record("accepted") } catch { #expect(error.reason.contains(reason)) }
    }

    @Test("description never shows the whole token")
    func redacted() throws {
        let t = try DeviceToken(hex: String(repeating: "ab", count: 32))
        #expect("\(t)" == "abab…abab")
        #expect(try DeviceToken(bytes: t.bytes) == t)
    }

    @Test("topics per push type (docs/protocol.md §2.1)")
    func topics() {
        #expect(PushType.liveactivity.topic(bundleID: "com.example.app") == "com.example.app.push-type.liveactivity")
        #expect(PushType.widgets.topic(bundleID: "com.example.app") == "com.example.app.push-type.widgets")
        #expect(PushType.controls.topic(bundleID: "a") == "a.push-type.controls")
        #expect(PushType.alert.topic(bundleID: "a") == "a")
        #expect(PushType.voip.maximumPayloadSize == 5120)
        #expect(PushType.liveactivity.maximumPayloadSize == 4096)
    }
}
