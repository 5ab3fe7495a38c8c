import Foundation
import IsleClient
import IsleCore
import IsleWire
import Synchronization
import Testing

/// The OpenAPI document (made from IsleWire's types; OpenAPI 3.1 = JSON Schema 2020-12) as a
/// checker of request bodies: the keywords the document uses (`$ref`, `type`, `properties`,
/// `required`, `additionalProperties`, `propertyNames`, `minProperties`/`maxProperties`, `items`, `minItems`/`maxItems`, `enum`,
/// `const`, `minLength`/`maxLength`, `pattern`, the numeric bounds, `oneOf`/`anyOf`/`allOf`). A
/// keyword it does not know is a failure, so the document cannot outgrow the check unnoticed.
struct OpenAPIConformance: Sendable {
    let document: JSONValue

    static let shared = OpenAPIConformance(document: APIDocument.json)

    static let known: Set<String> = [
        "$ref", "type", "properties", "required", "additionalProperties", "propertyNames", "minProperties", "maxProperties", "items", "minItems", "maxItems", "enum", "const",
        "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "oneOf", "anyOf", "allOf",
        "description", "title", "examples", "example", "format", "default", "deprecated",
    ]

    /// The request body schema of `method path` (a concrete path, matched against the document's templates).
    func requestSchema(method: String, path: String) -> JSONValue? {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        // Templates that match; a literal segment wins over a parameter (`/by-key/{key}/update` over `/{activity}/update`).
        let matching = (document["paths"]?.objectValue ?? [:]).compactMap { template, operations -> (literals: Int, operations: JSONValue)? in
            let t = template.split(separator: "/", omittingEmptySubsequences: false)
            guard t.count == parts.count, zip(t, parts).allSatisfy({ $0.hasPrefix("{") || $0 == $1 }) else { return nil }
            return (t.filter { !$0.hasPrefix("{") }.count, operations)
        }
        let best = matching.max { $0.literals < $1.literals }
        return best?.operations[method.lowercased()]?["requestBody"]?["content"]?["application/json"]?["schema"]
    }

    func resolve(_ schema: JSONValue) -> JSONValue {
        var s = schema
        while let ref = s["$ref"]?.stringValue, ref.hasPrefix("#/components/schemas/"),
              let target = document["components"]?["schemas"]?[String(ref.dropFirst("#/components/schemas/".count))] { s = target }
        return s
    }

    /// Every way `value` breaks `schema`, each naming where (empty: it conforms).
    func violations(_ value: JSONValue, _ schema: JSONValue, at path: String = "body") -> [String] {
        let s = resolve(schema)
        if case .bool(let allowed) = s { return allowed ? [] : ["\(path): nothing is allowed here"] }
        guard let keywords = s.objectValue else { return ["\(path): the schema is not an object"] }
        var out: [String] = []
        for k in keywords.keys where !Self.known.contains(k) { out.append("\(path): the checker does not know the keyword \(k)") }
        if let type = s["type"] {
            let types = type.arrayValue?.compactMap(\.stringValue) ?? [type.stringValue ?? ""]
            if !types.contains(where: { Self.isType(value, $0) }) { return out + ["\(path): \(value.kindName), expected \(types.joined(separator: " or "))"] }
        }
        if let e = s["enum"]?.arrayValue, !e.contains(value) { out.append("\(path): \(value) is not one of \(e)") }
        if let c = s["const"], c != value { out.append("\(path): \(value) is not \(c)") }
        if let text = value.stringValue {
            let n = text.unicodeScalars.count
            if let m = s["minLength"]?.numberValue?.int64Value, n < m { out.append("\(path): \(n) characters, at least \(m) expected") }
            if let m = s["maxLength"]?.numberValue?.int64Value, n > m { out.append("\(path): \(n) characters, at most \(m) expected") }
            if let p = s["pattern"]?.stringValue {
                let regex = try? NSRegularExpression(pattern: p)
                if regex?.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)) == nil { out.append("\(path): \"\(text)\" does not match \(p)") }
            }
        }
        if let number = value.numberValue?.doubleValue {
            if let m = s["minimum"]?.numberValue?.doubleValue, number < m { out.append("\(path): \(number) < \(m)") }
            if let m = s["maximum"]?.numberValue?.doubleValue, number > m { out.append("\(path): \(number) > \(m)") }
            if let m = s["exclusiveMinimum"]?.numberValue?.doubleValue, number <= m { out.append("\(path): \(number) ≤ \(m)") }
            if let m = s["exclusiveMaximum"]?.numberValue?.doubleValue, number >= m { out.append("\(path): \(number) ≥ \(m)") }
        }
        if let items = value.arrayValue {
            if let m = s["minItems"]?.numberValue?.int64Value, items.count < m { out.append("\(path): \(items.count) items, at least \(m) expected") }
            if let m = s["maxItems"]?.numberValue?.int64Value, items.count > m { out.append("\(path): \(items.count) items, at most \(m) expected") }
            if let schema = s["items"] { for (i, item) in items.enumerated() { out += violations(item, schema, at: "\(path)[\(i)]") } }
        }
        if let object = value.objectValue {
            let properties = s["properties"]?.objectValue ?? [:]
            if let m = s["minProperties"]?.numberValue?.int64Value, object.count < m { out.append("\(path): \(object.count) members, at least \(m) expected") }
            if let m = s["maxProperties"]?.numberValue?.int64Value, object.count > m { out.append("\(path): \(object.count) members, at most \(m) expected") }
            for name in s["required"]?.arrayValue?.compactMap(\.stringValue) ?? [] where object[name] == nil { out.append("\(path): \(name) is required") }
            for (name, v) in object {
                if let p = properties[name] {
                    out += violations(v, p, at: "\(path).\(name)")
                } else if let extra = s["additionalProperties"] {
                    out += violations(v, extra, at: "\(path).\(name)")
                }
                if let names = s["propertyNames"] { out += violations(.string(name), names, at: "\(path) key \(name)") }
            }
        }
        if let all = s["allOf"]?.arrayValue { for part in all { out += violations(value, part, at: path) } }
        if let any = s["anyOf"]?.arrayValue, !any.contains(where: { violations(value, $0, at: path).isEmpty }) {
            out.append("\(path): matches none of anyOf")
        }
        if let one = s["oneOf"]?.arrayValue {
            let matching = one.filter { violations(value, $0, at: path).isEmpty }.count
            if matching != 1 { out.append("\(path): matches \(matching) of oneOf, exactly one expected") }
        }
        return out
    }

    static func isType(_ value: JSONValue, _ type: String) -> Bool {
        switch (type, value) {
        case ("null", .null), ("boolean", .bool), ("string", .string), ("array", .array), ("object", .object), ("number", .number): true
        case ("integer", .number(let n)): n.exactInt64Value != nil
        default: false
        }
    }
}

/// IsleClient's storage with a check: every request the SDK freezes into its outbox (what it
/// sends, byte for byte, on every try) is checked against the OpenAPI document when it is saved,
/// so the app's side of the wire contract is held to the same document as the server.
final class ConformingStorage: IsleClientStorage {
    let base: FileStorage
    /// Requests checked so far, across every client of the test run.
    static let checked = Mutex<Int>(0)

    init(path: String) { base = FileStorage(path: path) }

    func load() throws -> Data? { try base.load() }

    func save(_ data: Data) throws {
        try base.save(data)
        for request in Self.frozenRequests(in: data) {
            let schema = OpenAPIConformance.shared.requestSchema(method: request.method, path: request.path)
            Self.checked.withLock { $0 += 1 }
            guard let body = request.body else {
                #expect(schema == nil, "IsleClient sends \(request.method) \(request.path) without the body the OpenAPI document describes")
                continue
            }
            guard let schema else {
                Issue.record("IsleClient sends \(request.method) \(request.path) with a body (\(body)), which the OpenAPI document does not describe")
                continue
            }
            let problems = OpenAPIConformance.shared.violations(body, schema)
            #expect(problems.isEmpty, "IsleClient's \(request.method) \(request.path) breaks the OpenAPI document: \(problems)")
        }
    }

    /// The `{"method", "path", "body"}` requests anywhere in the saved state (the outbox's).
    /// A body that is not JSON is reported as such; an empty one is nil.
    static func frozenRequests(in data: Data) -> [(method: String, path: String, body: JSONValue?)] {
        guard let state = try? JSONParser.parse(Array(data)) else { return [] }
        var found: [(String, String, JSONValue?)] = []
        func walk(_ v: JSONValue) {
            if let o = v.objectValue {
                if let m = o["method"]?.stringValue, let p = o["path"]?.stringValue, let b = o["body"]?.stringValue, let bytes = Data(base64Encoded: b) {
                    // (JSONValue is ExpressibleByNilLiteral: `.none` says "no body", not JSON null.)
                    found.append((m, p, bytes.isEmpty ? JSONValue?.none : .some((try? JSONParser.parse(Array(bytes))) ?? .string("not JSON: \(String(decoding: bytes, as: UTF8.self))"))))
                }
                for (_, child) in o { walk(child) }
            } else if let a = v.arrayValue {
                a.forEach(walk)
            }
        }
        walk(state)
        return found
    }
}

@Suite("IsleClient and the OpenAPI document")
struct ClientConformanceTests {
    @Test("the checker finds what breaks the document: a wrong type, an unknown field, a missing required field, a bad pattern")
    func checkerCatches() throws {
        let doc = OpenAPIConformance.shared
        let register = try #require(doc.requestSchema(method: "POST", path: "/v1/activities"))
        #expect(doc.requestSchema(method: "POST", path: "/v1/activities/by-key/order-1/update") != nil)
        #expect(doc.requestSchema(method: "GET", path: "/v1/nowhere") == nil)
        let token = String(repeating: "ab", count: 32)
        let good: JSONValue = ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "installationID": "phone-1"]
        #expect(doc.violations(good, register).isEmpty, "\(doc.violations(good, register))")
        for bad: JSONValue in [
            ["attributesType": 7, "token": .string(token), "installationID": "phone-1"],
            ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "installationID": "phone-1", "colour": "blue"],
            ["token": .string(token), "installationID": "phone-1"],
            ["attributesType": "PizzaDeliveryAttributes", "token": "not hex!", "installationID": "phone-1"],
        ] {
            #expect(!doc.violations(bad, register).isEmpty, "\(bad) passed")
        }
    }
}
