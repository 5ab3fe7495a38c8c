import Foundation
import IsleCore
import IsleWire
import Testing

/// One definition of the wire (docs/server.md, "The API's contract"): the handlers read and write
/// IsleWire's types, and the OpenAPI document is made from the same types. These tests keep the
/// committed copy (`docs/openapi.json`, what generators and readers use) equal to what the server
/// serves, and every answer typed.
@Suite("One wire contract: the document is made from the types the handlers use")
struct WireContractTests {
    static let committedURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/openapi.json")

    @Test("docs/openapi.json is the document the server serves (isle openapi --output docs/openapi.json writes it)")
    func committedCopy() throws {
        let committed = try JSONParser.parse(Array(try Data(contentsOf: Self.committedURL)))
        #expect(committed == APIDocument.json, "docs/openapi.json differs from the types: run swift run isle openapi --output docs/openapi.json")
    }

    @Test("every JSON answer is a typed object (properties, nothing else) or a list of them; every body a type")
    func typedAnswers() throws {
        let doc = APIDocument.json
        let schemas = doc["components"]?["schemas"]?.objectValue ?? [:]
        func resolve(_ s: JSONValue) -> JSONValue {
            var s = s
            while let ref = s["$ref"]?.stringValue, let target = schemas[String(ref.split(separator: "/").last!)] { s = target }
            return s
        }
        func typed(_ s: JSONValue) -> Bool {
            let r = resolve(s)
            if r["type"] == "array", let items = r["items"] { return typed(items) }
            return r["type"] == "object" && r["properties"]?.objectValue?.isEmpty == false && r["additionalProperties"] == false
        }
        var answers = 0
        for (path, item) in doc["paths"]?.objectValue ?? [:] {
            for (method, op) in item.objectValue ?? [:] {
                for (status, answer) in op["responses"]?.objectValue ?? [:] where status.hasPrefix("2") {
                    if status == "204" || path == "/metrics" { continue }
                    let schema = try #require(answer["content"]?["application/json"]?["schema"], "\(method) \(path) \(status) declares no JSON body")
                    #expect(typed(schema), "\(method) \(path) \(status) is not a typed object")
                    answers += 1
                }
                if let body = op["requestBody"]?["content"]?["application/json"]?["schema"] { #expect(typed(body), "\(method) \(path): its body is not a typed object") }
            }
        }
        #expect(answers >= 44)
        // Every component a type: no free-form object but the app's own JSON (attributes, content state) inside one.
        for (name, schema) in schemas where name != "InstallationSecret" {
            #expect(schema["type"] == "object" && schema["properties"] != nil, "\(name)")
        }
    }

    @Test("one spelling: every field naming an id ends in ID, in requests, answers and events")
    func spelling() throws {
        var names: [String] = []
        func walk(_ v: JSONValue) {
            if let o = v.objectValue {
                for (k, child) in o {
                    if k == "properties", let props = child.objectValue { names += props.keys }
                    walk(child)
                }
            } else if let a = v.arrayValue { a.forEach(walk) }
        }
        walk(APIDocument.json)
        let wrong = Set(names.filter { $0.hasSuffix("Id") })
        #expect(wrong.isEmpty, "\(wrong.sorted())")
        #expect(names.contains("activityID") && names.contains("eventID") && names.contains("jobID"))
    }
}
