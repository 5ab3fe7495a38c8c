import Foundation
import IsleCore
import IsleServer
import Testing

/// One wire contract (docs/server.md, "Delivery semantics"): the fields each handler takes (`WireContract`, which the handlers
/// enforce) are exactly the OpenAPI document's, route by route; every request IsleClient sends is
/// checked against the document's schemas in the client tests (OpenAPIConformance.swift), so the
/// three cannot drift apart unnoticed.
@Suite("One wire contract: the handlers' fields are the OpenAPI document's")
struct WireContractTests {
    static func document() throws -> JSONValue {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../Sources/IsleServer/openapi.json")
        return try JSONParser.parse(Array(try Data(contentsOf: url)))
    }

    /// The property names of a schema, through `$ref`s and `allOf`/`oneOf`/`anyOf`.
    static func properties(_ schema: JSONValue, in document: JSONValue) -> Set<String> {
        var s = schema
        while let ref = s["$ref"]?.stringValue, let name = ref.split(separator: "/").last, let target = document["components"]?["schemas"]?[String(name)] { s = target }
        var names = Set(s["properties"]?.objectValue?.keys.map { $0 } ?? [])
        for k in ["allOf", "oneOf", "anyOf"] { for part in s[k]?.arrayValue ?? [] { names.formUnion(properties(part, in: document)) } }
        return names
    }

    @Test("every route with a body: the same fields in the handler and the document, and no other route takes one")
    func requestBodies() throws {
        let document = try Self.document()
        var documented: [String: Set<String>] = [:]
        for (path, operations) in document["paths"]?.objectValue ?? [:] {
            for (method, operation) in operations.objectValue ?? [:] {
                guard let schema = operation["requestBody"]?["content"]?["application/json"]?["schema"] else { continue }
                documented["\(method.uppercased()) \(path)"] = Self.properties(schema, in: document)
            }
        }
        #expect(!documented.isEmpty)
        for (route, fields) in documented.sorted(by: { $0.key < $1.key }) {
            guard let handled = WireContract.requests[route] else {
                Issue.record("\(route) takes a body in the document, but the server lists no fields for it")
                continue
            }
            let server = Set(handled)
            #expect(server == fields, "\(route): only the server takes \(server.subtracting(fields).sorted()); only the document has \(fields.subtracting(server).sorted())")
        }
        for route in WireContract.requests.keys where documented[route] == nil {
            Issue.record("\(route): the server takes a body the document does not describe")
        }
    }
}
