import Foundation
import HTTPTypes
import Hummingbird
import IsleCore
import IsleDelivery
import IsleHTTPAPI

/// Validates the payload Isle will send (IsleCore's validator, the registered schema, the size
/// limit) before anything is queued. Errors become a 422 naming the request field; warnings are
/// returned to the caller.
struct PayloadCheck {
    var now: Date

    /// Checks `job`'s payload as it will go out: its tree, and its size from the encoding the
    /// job already holds (the payload is encoded once, when it is accepted).
    func validate(_ job: NewPushJob, schema: ActivitySchema? = nil, broadcast: Bool = false) throws -> [JSONValue] {
        guard case .liveActivity(var push) = job.payload else { return [] }
        push.timestamp = now
        let timestamp = ActivityKitEncoding.unixSeconds(now)
        let size = LiveActivityPayload.wireSize(encodedAPSCount: job.apsText.utf8.count, timestamp: timestamp)
        let report = PayloadValidator(options: .init(pushType: .liveactivity, broadcast: broadcast, priority: job.requestedPriority, schema: schema, now: now))
            .validate(value: push.jsonValue, size: size)
        if let e = report.errors.first {
            throw APIError(.unprocessableContent, e.code.rawValue, "\(e.message) \(e.fix)", field: Self.field(e.path))
        }
        return report.warnings.map { ["code": .string($0.code.rawValue), "field": Self.field($0.path).map(JSONValue.string) ?? .null, "message": .string($0.message), "fix": .string($0.fix)] }
    }

    /// `$.aps.content-state.driverName` → `contentState.driverName`.
    static func field(_ path: String) -> String? {
        for (wire, api) in [("$.aps.content-state", "contentState"), ("$.aps.attributes-type", "attributesType"), ("$.aps.attributes", "attributes"),
                            ("$.aps.stale-date", "staleDate"), ("$.aps.dismissal-date", "dismissalDate"), ("$.aps.relevance-score", "relevanceScore"), ("$.aps.alert", "alert")] where path.hasPrefix(wire) {
            return api + path.dropFirst(wire.count)
        }
        return path == "$" || path == "$.aps" ? nil : path
    }
}

/// `Isle-Strict: true` on a request that queues a push: the validator's warnings refuse it (422
/// `validationWarnings`, each finding with its field and fix) instead of riding along on a 202, so
/// a backend can make a Unix time in a date field, a stale date already past or an alert that will
/// not show a bug it sees at once (docs/server.md, "Strict requests").
enum Strictness {
    static let header = HTTPField.Name("Isle-Strict")!

    /// Whether the request asks for it; anything but true/false (1/0) is a 400 naming the header.
    static func requested(_ request: Request) throws -> Bool {
        guard let value = request.headers[header] else { return false }
        switch value.lowercased() {
        case "true", "1": return true
        case "false", "0": return false
        default: throw APIError.invalid("Isle-Strict", "Isle-Strict must be true or false (true: the validator's warnings refuse the request with a 422; nothing is queued)")
        }
    }

    /// Refuses the request when it is strict and the validator warned: nothing was queued.
    static func enforce(_ warnings: [JSONValue], strict: Bool) throws {
        guard strict, !warnings.isEmpty else { return }
        let each = warnings.map { w -> String in
            let field = w["field"]?.stringValue.map { "\($0): " } ?? ""
            return field + (w["message"]?.stringValue ?? "") + " " + (w["fix"]?.stringValue ?? "")
        }
        throw APIError(.unprocessableContent, "validationWarnings",
                       "Isle-Strict: the validator found \(warnings.count) problem\(warnings.count == 1 ? "" : "s") and nothing was queued: " + each.joined(separator: "; "),
                       field: warnings.count == 1 ? warnings[0]["field"]?.stringValue : nil, findings: warnings)
    }
}
