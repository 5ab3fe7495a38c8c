import Foundation
import IsleCore
import Testing

// Every rule in docs/protocol.md, "Validation" has a case here; `everyCodeIsCovered` fails when
// a code is added without one.

struct ValidatorCase: Sendable, CustomTestStringConvertible {
    let code: ValidationCode
    let payload: String
    var pushType: PushType = .liveactivity
    var broadcast = false
    var priority: PushPriority? = nil
    var useSchema = false
    /// Text the message or fix must contain (e.g. the corrected number).
    var mentions: String? = nil
    var path: String? = nil
    var testDescription: String { "\(code.rawValue)" }
}

enum ValidatorFixtures {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)
    static let schema = try! ActivitySchema(jsonText: """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes": { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange", "note": "string?" } }
        """)
    static let state = #"{"driverName":"Bill","deliveryTimer":[788918400,788919900]}"#
    static let attrs = #"{"numberOfPizzas":3,"totalAmount":"$42.00","orderNumber":"12345"}"#
    static let alert = #"{"title":"T","body":"B"}"#
    static func update(_ extra: String = "", state: String = ValidatorFixtures.state) -> String {
        #"{"aps":{"timestamp":1767225600,"event":"update","content-state":\#(state)\#(extra)}}"#
    }

    static let cases: [ValidatorCase] = [
        // Errors
        ValidatorCase(code: .notJSON, payload: #"{"aps": }"#, mentions: "line 1, column 9"),
        ValidatorCase(code: .emptyPayload, payload: ""),
        ValidatorCase(code: .notAnObject, payload: "[1]"),
        ValidatorCase(code: .missingAps, payload: #"{"event":"update"}"#, path: "$.aps"),
        ValidatorCase(code: .apsNotObject, payload: #"{"aps":"update"}"#),
        ValidatorCase(code: .missingEvent, payload: #"{"aps":{"timestamp":1767225600,"content-state":{}}}"#),
        ValidatorCase(code: .unknownEvent, payload: #"{"aps":{"timestamp":1767225600,"event":"Update","content-state":{}}}"#, mentions: "case-sensitive"),
        ValidatorCase(code: .missingTimestamp, payload: #"{"aps":{"event":"update","content-state":{}}}"#, mentions: "1767225600"),
        ValidatorCase(code: .timestampNotInteger, payload: #"{"aps":{"timestamp":"1767225600","event":"update","content-state":{}}}"#, mentions: "1767225600"),
        ValidatorCase(code: .fractionalSeconds, payload: #"{"aps":{"timestamp":1767225600.5,"event":"update","content-state":{}}}"#, mentions: "1767225600"),
        ValidatorCase(code: .startMissingAlert, payload: #"{"aps":{"timestamp":1767225600,"event":"start","attributes-type":"PizzaDeliveryAttributes","attributes":\#(attrs),"content-state":\#(state)}}"#),
        ValidatorCase(code: .startMissingAttributesType, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes":\#(attrs),"content-state":\#(state)}}"#),
        ValidatorCase(code: .startMissingAttributes, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"PizzaDeliveryAttributes","content-state":\#(state)}}"#),
        ValidatorCase(code: .missingContentState, payload: #"{"aps":{"timestamp":1767225600,"event":"update"}}"#),
        ValidatorCase(code: .contentStateNotObject, payload: #"{"aps":{"timestamp":1767225600,"event":"update","content-state":[1]}}"#),
        ValidatorCase(code: .attributesNotObject, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"P","attributes":"x","content-state":{}}}"#),
        ValidatorCase(code: .payloadTooLarge, payload: update(state: #"{"driverName":"\#(String(repeating: "x", count: 4100))","deliveryTimer":[1,2]}"#), mentions: "over the 4096-byte limit"),
        ValidatorCase(code: .relevanceScoreNotNumber, payload: update(#","relevance-score":"high""#)),
        ValidatorCase(code: .dismissalDateOnNonEnd, payload: update(#","dismissal-date":1767227400"#)),
        ValidatorCase(code: .dateNotInteger, payload: update(#","stale-date":"2026-01-01""#), path: "$.aps.stale-date"),
        ValidatorCase(code: .invalidAlert, payload: update(#","alert":{"title":{"loc-args":["x"]},"body":"b"}"#), path: "$.aps.alert.title.loc-key"),
        ValidatorCase(code: .contentStateMismatch, payload: update(state: #"{"driverName":7,"deliveryTimer":[1,2]}"#), useSchema: true, mentions: "expected a string, found an integer 7", path: "$.aps.content-state.driverName"),
        ValidatorCase(code: .attributesMismatch, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":"3","totalAmount":"$1","orderNumber":"1"},"content-state":\#(state)}}"#, useSchema: true, path: "$.aps.attributes.numberOfPizzas"),
        ValidatorCase(code: .attributesTypeMismatch, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"pizzaDeliveryAttributes","attributes":\#(attrs),"content-state":\#(state)}}"#, useSchema: true, mentions: "PizzaDeliveryAttributes"),
        ValidatorCase(code: .invalidInputPushToken, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"P","attributes":{},"content-state":{},"input-push-token":true}}"#),
        ValidatorCase(code: .invalidInputPushChannel, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"P","attributes":{},"content-state":{},"input-push-channel":""}}"#),
        ValidatorCase(code: .broadcastCannotStart, payload: #"{"aps":{"timestamp":1767225600,"event":"start","alert":\#(alert),"attributes-type":"P","attributes":{},"content-state":{}}}"#, broadcast: true),
        ValidatorCase(code: .widgetsNotContentChanged, payload: #"{"aps":{"content-changed":false}}"#, pushType: .widgets),
        // Warnings
        ValidatorCase(code: .timestampInMilliseconds, payload: #"{"aps":{"timestamp":1767225600000,"event":"update","content-state":{}}}"#, mentions: "1767225600"),
        ValidatorCase(code: .timestampFarFromNow, payload: #"{"aps":{"timestamp":1767232800,"event":"update","content-state":{}}}"#, mentions: "2 h 0 min in the future"),
        ValidatorCase(code: .dateInMilliseconds, payload: update(#","stale-date":1767227400000"#), mentions: "1767227400"),
        ValidatorCase(code: .unixTimeInDateField, payload: update(state: #"{"driverName":"Bill","deliveryTimer":[1767225600,1767227100]}"#), useSchema: true, mentions: "788918400", path: "$.aps.content-state.deliveryTimer[0]"),
        ValidatorCase(code: .isoStringInDateField, payload: update(state: #"{"driverName":"Bill","deliveryTimer":["2026-01-01T00:00:00Z",1]}"#), useSchema: true, mentions: "Send 788918400"),
        ValidatorCase(code: .nullValue, payload: update(state: #"{"driverName":"Bill","deliveryTimer":[1,2],"note":null}"#), useSchema: true, path: "$.aps.content-state.note"),
        ValidatorCase(code: .customKeyInAps, payload: update(#","orderId":"42""#), path: "$.aps.orderId"),
        ValidatorCase(code: .duplicateKey, payload: #"{"aps":{"timestamp":1767225600,"event":"update","event":"update","content-state":{}}}"#, path: "$.aps.event"),
        ValidatorCase(code: .dismissalDateTooFar, payload: #"{"aps":{"timestamp":1767225600,"event":"end","dismissal-date":1767243600}}"#, mentions: "5 h 0 min"),
        ValidatorCase(code: .staleDateInPast, payload: update(#","stale-date":1767225000"#), mentions: "10 min"),
        ValidatorCase(code: .highPriorityWithoutAlert, payload: update(), priority: .high),
        ValidatorCase(code: .startKeyOnNonStart, payload: update(#","attributes-type":"P""#)),
        ValidatorCase(code: .activityDataTooLarge, payload: update(state: #"{"driverName":"\#(String(repeating: "x", count: 4200))","deliveryTimer":[1,2]}"#), broadcast: true),
    ]
}

@Suite("Payload validator (docs/protocol.md, Validation)")
struct PayloadValidatorTests {
    func report(_ c: ValidatorCase) -> ValidationReport {
        let options = PayloadValidator.Options(pushType: c.pushType, broadcast: c.broadcast, priority: c.priority, schema: c.useSchema ? ValidatorFixtures.schema : nil, now: ValidatorFixtures.now)
        return PayloadValidator(options: options).validate(bytes: Array(c.payload.utf8))
    }

    @Test("each rule fires with its code, path and a fix", arguments: ValidatorFixtures.cases)
    func rule(_ c: ValidatorCase) throws {
        let report = report(c)
        let issue = try #require(report.issues.first { $0.code == c.code }, "got \(report.issues.map(\.code))")
        #expect(issue.severity == c.code.severity)
        #expect(report.isValid == report.errors.isEmpty)
        if c.code.severity == .error { #expect(!report.isValid) }
        #expect(!issue.message.isEmpty && !issue.fix.isEmpty)
        if let mentions = c.mentions { #expect((issue.message + " " + issue.fix).contains(mentions), "\(issue)") }
        if let path = c.path { #expect(issue.path == path) }
    }

    @Test("every validation code has a case")
    func everyCodeIsCovered() {
        let covered = Set(ValidatorFixtures.cases.map(\.code))
        let missing = ValidationCode.allCases.filter { !covered.contains($0) }
        #expect(missing.isEmpty, "no test for \(missing)")
    }

    @Test("a correct payload has no findings at all")
    func clean() {
        let report = PayloadValidator(options: .init(priority: .low, schema: ValidatorFixtures.schema, now: ValidatorFixtures.now))
            .validate(bytes: Array(ValidatorFixtures.update().utf8))
        #expect(report.issues.isEmpty, "\(report.issues)")
        #expect(report.size == ValidatorFixtures.update().utf8.count)
    }

    @Test("size is measured on exact bytes: 4096 passes, 4097 fails; broadcast allows 5120")
    func sizeBoundary() {
        func payload(size: Int) -> [UInt8] {
            let base = ValidatorFixtures.update(#","x":"""#)  // ends with "}}
            let filler = String(repeating: "a", count: size - base.utf8.count)
            return Array(ValidatorFixtures.update(#","x":"\#(filler)""#).utf8)
        }
        let options = PayloadValidator.Options(now: ValidatorFixtures.now)
        #expect(payload(size: 4096).count == 4096)
        #expect(!PayloadValidator(options: options).validate(bytes: payload(size: 4096)).has(.payloadTooLarge))
        #expect(PayloadValidator(options: options).validate(bytes: payload(size: 4097)).has(.payloadTooLarge))
        var b = options
        b.broadcast = true
        #expect(!PayloadValidator(options: b).validate(bytes: payload(size: 5120)).has(.payloadTooLarge))
        #expect(PayloadValidator(options: b).validate(bytes: payload(size: 5121)).has(.payloadTooLarge))
    }

    @Test("an end push may omit content-state; start and update may not")
    func endWithoutState() {
        let end = PayloadValidator(options: .init(now: ValidatorFixtures.now)).validate(bytes: Array(#"{"aps":{"timestamp":1767225600,"event":"end"}}"#.utf8))
        #expect(end.issues.isEmpty)
    }

    @Test("the Unix-time warning prints the corrected value and the date it would show")
    func unixTimeMessage() throws {
        let c = ValidatorFixtures.cases.first { $0.code == .unixTimeInDateField }!
        let issue = try #require(report(c).issues.first { $0.code == .unixTimeInDateField })
        #expect(issue.fix.contains("Send 788918400"))
        #expect(issue.message.contains("2057-01-01"))
    }

    @Test("report encodes to JSON for --json")
    func codable() throws {
        let r = report(ValidatorFixtures.cases[0])
        let data = try JSONEncoder().encode(r)
        #expect(try JSONDecoder().decode(ValidationReport.self, from: data) == r)
    }
}
