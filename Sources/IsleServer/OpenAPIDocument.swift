import Foundation

/// The API's OpenAPI document (`Sources/IsleServer/openapi.json`, served at `/openapi.json`).
enum OpenAPIDocument {
    static let json: String = {
        guard let url = Bundle.module.url(forResource: "openapi", withExtension: "json"), let text = try? String(contentsOf: url, encoding: .utf8) else {
            return #"{"error":"the OpenAPI document is missing from the build"}"#
        }
        return text
    }()
}
