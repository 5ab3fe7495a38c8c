import Foundation
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
