public import HTTPTypes
public import Hummingbird
public import IsleCore
import NIOCore

/// The one error shape of Isle's HTTP APIs — the server's and the simulator's control API alike:
/// `{"error":{"code","message","field"?}}`, with `Retry-After` (429, 503) and `Allow` (405) when
/// they apply. `message` says what was expected; `field` names the request field (or header) at fault.
public struct APIError: HTTPResponseError, Sendable, CustomStringConvertible {
    public var status: HTTPResponse.Status
    /// A stable, machine-readable code (`invalidField`, `notFound`, `rateLimited`, …).
    public var code: String
    public var message: String
    public var field: String?
    /// Seconds, sent as `Retry-After`.
    public var retryAfter: Int?
    /// Sent as `Allow` (405s).
    public var allow: String?
    /// Each finding when there are several (a strict request's warnings): `{code, field, message, fix}`.
    public var findings: [JSONValue]?

    public init(_ status: HTTPResponse.Status, _ code: String, _ message: String, field: String? = nil, retryAfter: Int? = nil, allow: String? = nil,
                findings: [JSONValue]? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retryAfter = retryAfter
        self.allow = allow
        self.findings = findings
    }

    /// A 400 naming the field and what it must be.
    public static func invalid(_ field: String, _ message: String, code: String = "invalidField") -> APIError {
        APIError(.badRequest, code, message, field: field)
    }

    public static func notFound(_ what: String) -> APIError { APIError(.notFound, "notFound", "\(what) was not found") }

    public var description: String { "\(status.code) \(code): \(message)" }

    /// The envelope as JSON.
    public var json: JSONValue {
        var e: JSONObject = ["code": .string(code), "message": .string(message)]
        if let field { e["field"] = .string(field) }
        if let findings { e["findings"] = .array(findings) }
        return .object(["error": .object(e)])
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let retryAfter { headers[.retryAfter] = "\(retryAfter)" }
        if let allow { headers[.allow] = allow }
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: json.jsonBytes)))
    }
}

/// JSON answers.
public enum JSONResponse {
    public static func make(_ value: JSONValue, status: HTTPResponse.Status = .ok, pretty: Bool = false) -> Response {
        let bytes: [UInt8] = pretty ? Array(value.prettyJSONString.utf8) : value.jsonBytes
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}
