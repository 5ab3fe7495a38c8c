import Crypto
import Foundation
import Hummingbird
import HTTPTypes
import IsleCore
import IsleStore
import NIOCore

/// Errors the API answers with: one shape, `{"error":{"code","message","field"?}}`.
struct APIError: HTTPResponseError {
    var status: HTTPResponse.Status
    var code: String
    var message: String
    var field: String?
    /// Seconds, sent as `Retry-After` (503s).
    var retryAfter: Int?
    /// Sent as `Allow` (405s).
    var allow: String?

    init(_ status: HTTPResponse.Status, _ code: String, _ message: String, field: String? = nil, retryAfter: Int? = nil, allow: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retryAfter = retryAfter
        self.allow = allow
    }

    static func invalid(_ field: String, _ message: String) -> APIError { APIError(.badRequest, "invalidField", message, field: field) }
    static func notFound(_ what: String) -> APIError { APIError(.notFound, "notFound", "\(what) was not found") }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var e: JSONObject = ["code": .string(code), "message": .string(message)]
        if let field { e["field"] = .string(field) }
        var headers: HTTPFields = [.contentType: "application/json"]
        if let retryAfter { headers[.retryAfter] = "\(retryAfter)" }
        if let allow { headers[.allow] = allow }
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: JSONValue.object(["error": .object(e)]).jsonBytes)))
    }
}

/// Who is calling: the app and the key's scope.
struct Caller: Sendable {
    var bundleID: String
    var scope: APIKeyScope
    var keyID: String
}

enum APIKeys {
    /// A new secret: `isle_<scope>_<40 hex>`; only its hash is stored.
    static func newSecret(scope: APIKeyScope) -> String {
        "isle_\(scope.rawValue)_" + Hex.encode((0..<20).map { _ in UInt8.random(in: 0...255) })
    }

    static func hash(_ secret: String) -> String {
        Hex.encode(SHA256.hash(data: Array(secret.utf8)))
    }
}

/// Reading request bodies with errors that name the field.
struct Body {
    let object: JSONObject

    static func read(_ request: Request) async throws -> (Body, [UInt8]) {
        var request = request
        let buffer: ByteBuffer
        do { buffer = try await request.collectBody(upTo: 1 << 20) } catch {
            throw APIError(.contentTooLarge, "bodyTooLarge", "the request body is over 1 MiB")
        }
        let bytes = Array(buffer: buffer)
        if bytes.isEmpty { return (Body(object: [:]), bytes) }
        let value: JSONValue
        do { value = try JSONParser.parse(bytes) } catch { throw APIError(.badRequest, "invalidJSON", "the body is not JSON: \(error)") }
        guard let o = value.objectValue else { throw APIError(.badRequest, "invalidJSON", "the body must be a JSON object") }
        return (Body(object: o), bytes)
    }

    func string(_ k: String, required: Bool = false) throws -> String? {
        switch object[k] {
        case nil, .null?:
            if required { throw APIError.invalid(k, "\(k) is required: a non-empty string") }
            return nil
        case .string(let s)?:
            if s.isEmpty { throw APIError.invalid(k, "\(k) must not be empty") }
            if s.count > 512 { throw APIError.invalid(k, "\(k) is longer than 512 characters") }
            return s
        default: throw APIError.invalid(k, "\(k) must be a string")
        }
    }

    func bool(_ k: String) throws -> Bool? {
        switch object[k] {
        case nil: return nil
        case .bool(let b)?: return b
        default: throw APIError.invalid(k, "\(k) must be true or false")
        }
    }

    func number(_ k: String) throws -> Double? {
        switch object[k] {
        case nil, .null?: return nil
        case .number(let n)?: return n.doubleValue
        default: throw APIError.invalid(k, "\(k) must be a number")
        }
    }

    func date(_ k: String) throws -> Date? {
        guard let d = try number(k) else { return nil }
        guard d > 1_000_000_000, d < 100_000_000_000 else { throw APIError.invalid(k, "\(k) must be Unix seconds (e.g. \(Int(Date().timeIntervalSince1970)))") }
        return Date(timeIntervalSince1970: d)
    }

    func object(_ k: String, required: Bool = false) throws -> JSONValue? {
        switch object[k] {
        case nil, .null?:
            if required { throw APIError.invalid(k, "\(k) is required: an object") }
            return nil
        case .object?: return object[k]
        default: throw APIError.invalid(k, "\(k) must be an object")
        }
    }

    func strings(_ k: String) throws -> [String]? {
        guard let v = object[k] else { return nil }
        guard let a = v.arrayValue, a.allSatisfy({ ($0.stringValue ?? "").isEmpty == false }) else { throw APIError.invalid(k, "\(k) must be an array of non-empty strings") }
        guard a.count <= 64 else { throw APIError.invalid(k, "\(k) has more than 64 entries") }
        return a.compactMap(\.stringValue)
    }

    func token(_ k: String, required: Bool) throws -> String? {
        guard let s = try string(k, required: required) else { return nil }
        do { return try DeviceToken(hex: s).hex } catch { throw APIError.invalid(k, "\(k): \(error.reason)") }
    }

    func priority() throws -> Int? {
        guard let p = try number("priority") else { return nil }
        guard p == 5 || p == 10 else { throw APIError.invalid("priority", "priority must be 5 or 10") }
        return Int(p)
    }

    /// `alert`: `{"title": "…"|{"loc-key","loc-args"}, "body": …, "sound"?: "default"|"<file>"}`.
    func alert() throws -> JSONValue? {
        guard let a = object["alert"] else { return nil }
        guard let o = a.objectValue else { throw APIError.invalid("alert", "alert must be an object with title and body") }
        for k in ["title", "body"] {
            switch o[k] {
            case .string(let s)? where !s.isEmpty: continue
            case .object(let loc)? where !(loc["loc-key"]?.stringValue ?? "").isEmpty:
                if let unknown = loc.keys.first(where: { $0 != "loc-key" && $0 != "loc-args" }) {
                    throw APIError.invalid("alert.\(k).\(unknown)", "unknown key \(unknown) in alert.\(k); use loc-key and loc-args")
                }
                if let args = loc["loc-args"], !(args.arrayValue?.allSatisfy { $0.stringValue != nil } ?? false) {
                    throw APIError.invalid("alert.\(k).loc-args", "loc-args must be an array of strings")
                }
            default: throw APIError.invalid("alert.\(k)", "alert.\(k) is required: a string, or {\"loc-key\": …, \"loc-args\": […]}")
            }
        }
        if let s = o["sound"], s.stringValue == nil { throw APIError.invalid("alert.sound", "alert.sound must be a string") }
        for k in o.keys where !["title", "body", "sound"].contains(k) { throw APIError.invalid("alert.\(k)", "unknown alert key \(k); use title, body and sound") }
        return a
    }
}

extension HTTPResponse.Status {
    static let contentTooLarge = HTTPResponse.Status(code: 413, reasonPhrase: "Content Too Large")
}

extension Parameters {
    /// A path parameter with its percent-encoding removed: ids such as broadcast channel ids
    /// (base64, so they may hold `/`, `+` and `=`) or a backend's own keys travel percent-encoded.
    func decoded(_ name: String) throws -> String {
        let raw = try require(name)
        guard let value = raw.removingPercentEncoding else { throw APIError.invalid(name, "\(name) in the path is not valid percent-encoding") }
        return value
    }
}
