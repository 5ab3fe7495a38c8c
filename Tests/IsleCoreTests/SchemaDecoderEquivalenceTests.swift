import Foundation
import IsleCore
import Testing

// docs/protocol.md, "Content-state schema": the validator and the simulator must judge a value
// exactly as JSONDecoder with default strategies. These tests prove it against the real
// JSONDecoder for Swift Codable types: every mutation of a valid value gets the same verdict.

struct PizzaDeliveryState: Codable {
    enum Status: String, Codable { case preparing, onTheWay, delivered }
    struct Driver: Codable { var name: String }
    var driverName: String
    var deliveryTimer: ClosedRange<Date>
    var note: String?
    var status: Status
    var stops: [String]
    var driver: Driver
}

struct NumericState: Codable {
    var count: Int
    var level: Double
    var flag: Bool
    var maybeCount: Int?
    var maybeLevel: Double?
    var eta: Date
    var maybeEta: Date?
    var history: [Date]
    var optionalNames: [String?]
    var window: ClosedRange<Date>?
}

enum EquivalenceFixtures {
    static let pizzaSchema = try! ActivitySchema(jsonText: """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes":   { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange", "note": "string?",
                            "status": { "enum": ["preparing", "onTheWay", "delivered"] },
                            "stops": { "array": "string" }, "driver": { "object": { "name": "string" } } } }
        """)

    static let numericSchema = try! ActivitySchema(jsonText: """
        { "attributesType": "NumericAttributes",
          "contentState": { "count": "int", "level": "double", "flag": "bool", "maybeCount": "int?",
                            "maybeLevel": "double?", "eta": "date", "maybeEta": "date?",
                            "history": { "array": "date" }, "optionalNames": { "array": "string?" },
                            "window": "dateRange?" } }
        """)

    static let pizzaBase: JSONValue = [
        "driverName": "Bill James", "deliveryTimer": [788918400, 788919900], "note": "ring twice",
        "status": "onTheWay", "stops": ["a", "b"], "driver": ["name": "Bill"],
    ]

    static let numericBase: JSONValue = [
        "count": 3, "level": 0.5, "flag": true, "maybeCount": 1, "maybeLevel": 2.5, "eta": 788918400,
        "maybeEta": 788918401.5, "history": [788918400, 1], "optionalNames": ["x", nil], "window": [1, 2],
    ]

    /// Values every field is replaced with, written as JSON text so literal forms survive.
    static let candidates: [String] = [
        "null", "\"x\"", "\"\"", "\"2026-01-01T00:00:00Z\"", "\"12\"", "0", "1", "-1", "1.5", "1.0", "-0", "1e2", "1E-2", "2.5e0",
        "9223372036854775807", "9223372036854775808", "-9223372036854775809", "1e19", "true", "false",
        "[]", "[1]", "[1,2]", "[2,1]", "[1,2,3]", "[1.5,1.5]", "[\"a\"]", "[null]", "[\"a\",null]", "[1,\"2\"]",
        "{}", "{\"name\":\"x\"}", "{\"name\":1}", "\"preparing\"", "\"Preparing\"", "\"delivered\"", "1767225600",
    ]

    struct Case: Sendable, CustomTestStringConvertible {
        let type: String
        let json: String
        var testDescription: String { "\(type): \(json)" }
    }

    static func mutations(of base: JSONValue, type: String) -> [Case] {
        var out: [Case] = [Case(type: type, json: base.jsonString)]
        guard case .object(let object) = base else { return out }
        for key in object.keys {
            var removed = object
            removed[key] = nil
            out.append(Case(type: type, json: JSONValue.object(removed).jsonString))
            for candidate in candidates {
                var changed = object
                changed[key] = try! JSONParser.parse(candidate)
                out.append(Case(type: type, json: JSONValue.object(changed).jsonString))
            }
            // One level down, for nested objects.
            if case .object(let inner)? = object[key] {
                for innerKey in inner.keys {
                    for candidate in candidates {
                        var nested = inner
                        nested[innerKey] = try! JSONParser.parse(candidate)
                        var changed = object
                        changed[key] = .object(nested)
                        out.append(Case(type: type, json: JSONValue.object(changed).jsonString))
                    }
                }
            }
        }
        // Whole-value shapes.
        for whole in ["[]", "1", "\"x\"", "null", "{}"] { out.append(Case(type: type, json: whole)) }
        return out
    }

    static let all: [Case] = mutations(of: pizzaBase, type: "PizzaDeliveryState") + mutations(of: numericBase, type: "NumericState")
}

@Suite("Schema verdicts equal JSONDecoder's")
struct SchemaDecoderEquivalenceTests {
    @Test("mutation corpus is large", .tags(.schema))
    func corpusSize() {
        #expect(EquivalenceFixtures.all.count > 500)
        // Both verdicts must be well represented, or agreement proves little.
        let accepted = EquivalenceFixtures.all.filter { c in
            let data = Data(c.json.utf8)
            return c.type == "PizzaDeliveryState"
                ? (try? JSONDecoder().decode(PizzaDeliveryState.self, from: data)) != nil
                : (try? JSONDecoder().decode(NumericState.self, from: data)) != nil
        }.count
        #expect(accepted > 100)
        #expect(EquivalenceFixtures.all.count - accepted > 100)
    }

    @Test("verdict equals JSONDecoder", .tags(.schema), arguments: EquivalenceFixtures.all)
    func verdictMatches(_ testCase: EquivalenceFixtures.Case) throws {
        let data = Data(testCase.json.utf8)
        let decoderAccepts: Bool
        let schema: ObjectSchema
        switch testCase.type {
        case "PizzaDeliveryState":
            decoderAccepts = (try? JSONDecoder().decode(PizzaDeliveryState.self, from: data)) != nil
            schema = EquivalenceFixtures.pizzaSchema.contentState
        default:
            decoderAccepts = (try? JSONDecoder().decode(NumericState.self, from: data)) != nil
            schema = EquivalenceFixtures.numericSchema.contentState
        }
        let result = schema.decode(try JSONParser.parse(testCase.json))
        #expect(result.decodes == decoderAccepts, "JSONDecoder \(decoderAccepts ? "accepts" : "rejects") it; the schema says \(result.mismatches)")
    }
}

extension Tag {
    @Tag static var schema: Self
}
