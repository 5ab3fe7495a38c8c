public import IsleCore
public import IsleDelivery
import Foundation

extension API {
    /// What a webhook request carries (docs/events.md), signed in `Isle-Signature`.
    public struct WebhookBatch: Codable, Sendable, WireDocumented {
        public var events: [Event]
        public init(events: [Event]) { self.events = events }
        public static var wireDescription: String? { "The events of one webhook request, oldest first; verify Isle-Signature before trusting them (docs/events.md)." }
    }
}

extension API.Event {
    /// The event as webhooks and `GET /v1/events` carry it. Its data's ids are spelt `…ID`, as
    /// everywhere in the API (events written before 0.11 spelt them `…Id`; they are read either way).
    public init(_ stored: StoredEvent) {
        let e = stored.event
        self.init(id: stored.id, type: e.type, app: e.bundleID, activityID: e.activityID, externalKey: e.externalKey, installationID: e.installationID, userID: e.userID,
                  at: Date(timeIntervalSince1970: e.at.timeIntervalSince1970.rounded(.down)), data: API.EventData(e.data))
    }
}

extension API.EventData {
    /// The stored fields, typed; one the type does not know is dropped (none is written).
    public init(_ data: JSONObject) {
        var fields = JSONObject()
        for (key, value) in data {
            let name = key.hasSuffix("Id") ? String(key.dropLast(2)) + "ID" : key
            fields[name] = value
        }
        let known = Set(API.EventData.wireFieldNames)
        for key in fields.keys where !known.contains(key) { fields[key] = nil }
        self = (try? WireDecoder.decode(API.EventData.self, from: .object(fields))) ?? API.EventData()
    }

    /// The fields an event's data may have.
    public static let wireFieldNames: [String] = {
        var schemas = WireSchemas()
        _ = schemas.schema(API.EventData.self, .answer)
        return schemas.components["EventData"]?["properties"]?.objectValue?.keys ?? []
    }()
}
