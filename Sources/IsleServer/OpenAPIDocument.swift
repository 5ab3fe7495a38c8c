import Foundation
import IsleCore
import IsleWire

/// The API's OpenAPI document, made from the wire types (IsleWire's `APIDocument`) and served at
/// `/openapi.json`; `docs/openapi.json` is a copy kept equal by a test.
enum OpenAPIDocument {
    static let json: String = APIDocument.json.prettyJSONString

    /// Each documented path as segments (`{name}` matches any one segment) with its methods.
    static let routes: [(segments: [String], methods: [String])] = {
        guard let doc = try? JSONParser.parse(Array(json.utf8)), let paths = doc["paths"]?.objectValue else { return [] }
        return paths.map { path, item in
            let methods = Array(item.objectValue?.keys ?? []).filter { ["get", "put", "post", "delete", "patch"].contains($0) }.map { $0.uppercased() }.sorted()
            return (path.split(separator: "/").map(String.init), methods)
        }
    }()

    /// The methods the document lists for a request path, or nil when no documented path matches.
    static func methods(forPath path: String) -> [String]? {
        let segments = path.split(separator: "/").map(String.init)
        var found: Set<String> = []
        var matched = false
        for route in routes where route.segments.count == segments.count {
            if zip(route.segments, segments).allSatisfy({ $0.hasPrefix("{") || $0 == $1 }) {
                matched = true
                found.formUnion(route.methods)
            }
        }
        return matched ? found.sorted() : nil
    }
}
