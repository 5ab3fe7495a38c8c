import Foundation
import IsleCore
import IsleTesting
import Testing

/// Apple's sample type from the ActivityKit documentation (docs/protocol.md §5.2).
struct PizzaDeliveryAttributes: Codable {
    struct ContentState: Codable, Hashable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
    }
    var numberOfPizzas: Int
    var totalAmount: String
    var orderNumber: String
}

/// The WWDC23 10185 sample type (Tests/Fixtures/wwdc23).
struct AdventureAttributes: Codable {
    struct ContentState: Codable, Hashable {
        var currentHealthLevel: Double
        var eventDescription: String
    }
    var hero: String
}

@Suite("Payload encoding (docs/protocol.md, Wire)")
struct PayloadEncodingTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01T00:00:00Z

    @Test("push-to-start payload, exact bytes")
    func startGolden() throws {
        let state = PizzaDeliveryAttributes.ContentState(driverName: "Bill James", deliveryTimer: Self.now...Self.now.addingTimeInterval(1500))
        let payload = try LiveActivityPayload.start(
            attributes: PizzaDeliveryAttributes(numberOfPizzas: 3, totalAmount: "$42.00", orderNumber: "12345"),
            contentState: state, timestamp: Self.now,
            alert: LiveActivityAlert(title: "Delivery Update", body: "Your pizza order will arrive in 25 minutes", sound: .default),
            staleDate: Self.now.addingTimeInterval(1800), relevanceScore: 100, inputPushToken: true
        )
        let expected = #"{"aps":{"timestamp":1767225600,"event":"start","content-state":{"deliveryTimer":[788918400,788919900],"driverName":"Bill James"},"attributes-type":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":3,"orderNumber":"12345","totalAmount":"$42.00"},"alert":{"title":"Delivery Update","body":"Your pizza order will arrive in 25 minutes","sound":"default"},"stale-date":1767227400,"relevance-score":100,"input-push-token":1}}"#
        #expect(payload.jsonValue.jsonString == expected)
        #expect(String(decoding: payload.encoded, as: UTF8.self) == expected)
        #expect(payload.encoded.count == expected.utf8.count)
    }

    @Test("dates inside content-state are seconds since 2001, aps dates integer Unix seconds")
    func dateForms() throws {
        let t = Date(timeIntervalSince1970: 1_767_225_600.75)
        let payload = try LiveActivityPayload.update(
            contentState: PizzaDeliveryAttributes.ContentState(driverName: "A", deliveryTimer: t...t), timestamp: t, staleDate: t
        )
        let aps = try #require(payload.jsonValue["aps"])
        #expect(aps["timestamp"] == .int(1_767_225_600))
        #expect(aps["timestamp"]?.numberValue?.isIntegerLiteral == true)
        #expect(aps["stale-date"] == .int(1_767_225_600))
        // 1767225600.75 − 978307200 = 788918400.75: the fraction survives inside content-state.
        #expect(aps["content-state"]?["deliveryTimer"] == [.double(788_918_400.75), .double(788_918_400.75)])
        // What ActivityKit does with it: JSONDecoder with default strategies gets the date back.
        let data = Data(aps["content-state"]!.jsonBytes)
        let decoded = try JSONDecoder().decode(PizzaDeliveryAttributes.ContentState.self, from: data)
        #expect(decoded.deliveryTimer.lowerBound == t)
    }

    @Test("update with localized alert and named sound")
    func localizedAlert() throws {
        let payload = try LiveActivityPayload.update(
            contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.0, eventDescription: "Power Panda has been knocked down!"),
            timestamp: Date(timeIntervalSince1970: 1_685_952_000),
            alert: LiveActivityAlert(
                title: .localized(key: "%@ is knocked down!", arguments: ["Power Panda"]),
                body: .localized(key: "Use a potion to heal %@!", arguments: ["Power Panda"]),
                sound: .named("HeroDown.mp4"))
        )
        #expect(payload.jsonValue.jsonString == #"{"aps":{"timestamp":1685952000,"event":"update","content-state":{"currentHealthLevel":0,"eventDescription":"Power Panda has been knocked down!"},"alert":{"title":{"loc-key":"%@ is knocked down!","loc-args":["Power Panda"]},"body":{"loc-key":"Use a potion to heal %@!","loc-args":["Power Panda"]},"sound":"HeroDown.mp4"}}}"#)
    }

    @Test("end without final state, with dismissal date; custom keys beside aps")
    func endGolden() throws {
        var payload = try LiveActivityPayload.end(
            contentState: Optional<AdventureAttributes.ContentState>.none, timestamp: Self.now, dismissalDate: Self.now.addingTimeInterval(1800))
        payload.customKeys = ["orderId": "42"]
        #expect(payload.jsonValue.jsonString == #"{"aps":{"timestamp":1767225600,"event":"end","dismissal-date":1767227400},"orderId":"42"}"#)
    }

    @Test("widget payload")
    func widget() {
        #expect(WidgetPayload().jsonValue.jsonString == #"{"aps":{"content-changed":true}}"#)
    }

    @Test("raw JSON content-state is sent as given")
    func raw() throws {
        let state = try JSONParser.parse(#"{"home":2,"away":1}"#)
        let payload = LiveActivityPayload(event: .update, timestamp: Self.now, contentState: state)
        #expect(payload.jsonValue.jsonString == #"{"aps":{"timestamp":1767225600,"event":"update","content-state":{"home":2,"away":1}}}"#)
    }

    // The WWDC23 session payloads, rebuilt with the typed API, equal the fixtures value for value.
    struct FixtureCase: Sendable, CustomTestStringConvertible {
        let file: String
        let build: @Sendable () throws -> LiveActivityPayload
        var testDescription: String { file }
    }

    static let t2023 = Date(timeIntervalSince1970: 1_685_952_000)
    static let fixtureCases: [FixtureCase] = [
        FixtureCase(file: "update.json") {
            try .update(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.941, eventDescription: "Power Panda found a sword!"), timestamp: t2023)
        },
        FixtureCase(file: "update-relevance.json") {
            try .update(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.941, eventDescription: "Power Panda found a sword!"), timestamp: t2023, relevanceScore: 100)
        },
        FixtureCase(file: "update-stale-date.json") {
            try .update(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.79, eventDescription: "Egghead is in the woods and lost connection."), timestamp: t2023, staleDate: t2023.addingTimeInterval(7200))
        },
        FixtureCase(file: "update-alert.json") {
            try .update(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.0, eventDescription: "Power Panda has been knocked down!"), timestamp: t2023,
                        alert: LiveActivityAlert(title: "Power Panda is knocked down!", body: "Use a potion to heal Power Panda!", sound: .default))
        },
        FixtureCase(file: "update-alert-localized.json") {
            try .update(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.0, eventDescription: "Power Panda has been knocked down!"), timestamp: t2023,
                        alert: LiveActivityAlert(title: .localized(key: "%@ is knocked down!", arguments: ["Power Panda"]), body: .localized(key: "Use a potion to heal %@!", arguments: ["Power Panda"]), sound: .named("HeroDown.mp4")))
        },
        FixtureCase(file: "end-dismissal.json") {
            try .end(contentState: AdventureAttributes.ContentState(currentHealthLevel: 0.23, eventDescription: "Adventure over! Power Panda is taking a nap."), timestamp: t2023, dismissalDate: t2023.addingTimeInterval(7200))
        },
    ]

    @Test("typed API reproduces the WWDC23 payloads", arguments: fixtureCases)
    func fixtures(_ c: FixtureCase) throws {
        let fixture = try JSONParser.parse(Fixtures.data("wwdc23/\(c.file)"))
        let ours = try c.build()
        #expect(ours.jsonValue == fixture)
        // And every fixture is valid against the session's schema, without warnings.
        let schema = try ActivitySchema(jsonText: Fixtures.text("wwdc23/AdventureAttributes.schema.json"))
        let report = PayloadValidator(options: .init(schema: schema, now: Self.t2023)).validate(bytes: Array(try Fixtures.data("wwdc23/\(c.file)")))
        #expect(report.issues.isEmpty, "\(report.issues)")
    }

    @Test("schema file format round-trips")
    func schemaRoundTrip() throws {
        let text = #"{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":"int"},"contentState":{"driverName":"string","deliveryTimer":"dateRange","note":"string?","status":{"enum":["preparing","onTheWay"]},"stops":{"array":"string"},"driver":{"object":{"name":"string"},"optional":true}}}"#
        let schema = try ActivitySchema(jsonText: text)
        #expect(schema.contentState["driver"]?.isOptional == true)
        #expect(try ActivitySchema(json: schema.jsonValue) == schema)
    }

    @Test("schema format errors name the place", arguments: [
        (#"{"contentState":{}}"#, "$.attributesType"),
        (#"{"attributesType":"A"}"#, "$.contentState"),
        (#"{"attributesType":"A","contentState":{"x":"float"}}"#, "$.contentState.x"),
        (#"{"attributesType":"A","contentState":{"x":{"enum":[1]}}}"#, "$.contentState.x.enum[0]"),
        (#"{"attributesType":"A","contentState":{"x":{"array":"int","object":{}}}}"#, "$.contentState.x"),
        (#"{"attributesType":"A","contentState":{},"extra":1}"#, "$.extra"),
    ])
    func schemaErrors(_ text: String, _ path: String) {
        #expect(throws: SchemaFormatError.self) { try ActivitySchema(jsonText: text) }
        do { _ = try ActivitySchema(jsonText: text) } catch { #expect(error.path == path) }
    }

    @Test("a stored aps (wire order, no timestamp) spliced with a timestamp is byte for byte the encoded payload; what is not an object is refused")
    func encodedOnce() throws {
        let aps: JSONObject = ["alert": ["title": "Goal"], "content-state": ["home": 1], "event": "update", "relevance-score": 50, "stale-date": 1_790_000_600, "custom": true]
        let stored = JSONValue.object(LiveActivityPayload.wireOrdered(aps)).jsonBytes
        #expect(LiveActivityPayload.wireBytes(encodedAPS: stored, timestamp: 1_790_000_000) == LiveActivityPayload.wireBytes(aps: aps, timestamp: 1_790_000_000))
        #expect(LiveActivityPayload.wireBytes(encodedAPS: Array("{}".utf8), timestamp: 7) == Array(#"{"aps":{"timestamp":7}}"#.utf8))
        #expect(LiveActivityPayload.wireBytes(encodedAPS: Array("[1]".utf8), timestamp: 7) == nil)
        let parsed = try JSONParser.parse(LiveActivityPayload.wireBytes(encodedAPS: stored, timestamp: 42)!)
        #expect(parsed["aps"]?["timestamp"] == 42 && parsed["aps"]?["custom"] == true)
    }
}
