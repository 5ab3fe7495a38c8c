public import Hummingbird
public import IsleCore
import NIOCore

/// A request body read once as a JSON object, with its bytes (for request hashes).
public struct JSONBody: Sendable {
    public var object: JSONObject
    public var bytes: [UInt8]

    public init(object: JSONObject, bytes: [UInt8]) {
        self.object = object
        self.bytes = bytes
    }

    /// Collects at most `limit` bytes (413 past it) and parses them; an empty body is `{}`.
    /// Anything but a JSON object is a 400 that says what was wrong.
    public static func read(_ request: inout Request, limit: Int) async throws -> JSONBody {
        let buffer: ByteBuffer
        do { buffer = try await request.collectBody(upTo: limit) } catch is NIOTooManyBytesError {
            throw APIError(.contentTooLarge, "bodyTooLarge", "the request body is over \(limit >= 1 << 20 ? "\(limit >> 20) MiB" : "\(limit) bytes")")
        } catch {
            // The connection ended, or its body deadline passed, before the body did.
            throw APIError(.badRequest, "incompleteBody", "the request body ended before it was complete")
        }
        let bytes = Array(buffer: buffer)
        if bytes.isEmpty { return JSONBody(object: [:], bytes: bytes) }
        let value: JSONValue
        do { value = try JSONParser.parse(bytes) } catch { throw APIError(.badRequest, "invalidJSON", "the body is not JSON: \(error)") }
        guard let o = value.objectValue else { throw APIError(.badRequest, "invalidJSON", "the body must be a JSON object") }
        return JSONBody(object: o, bytes: bytes)
    }
}
