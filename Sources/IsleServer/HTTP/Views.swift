import Foundation
import IsleCore
import IsleStore
import IsleDelivery

/// The API's JSON views of stored records (the shapes `openapi.json` documents).
enum Views {
    static func date(_ d: Date?) -> JSONValue { d.map { .int(Int64($0.timeIntervalSince1970)) } ?? .null }

    static func app(bundleID: String, _ c: AppCircuit, pause: OperatorPause? = nil) -> JSONValue {
        var d: JSONObject
        if let pause {
            // Paused by hand: until an operator resumes it (POST /v1/app/resume or the console).
            return ["bundleID": .string(bundleID), "delivery": ["state": "paused", "reason": .string("paused by an operator (key \(pause.keyID)): \(pause.reason)"), "since": date(pause.at)]]
        }
        switch c.mode {
        case .running: d = ["state": "running"]
        case .backingOff(let until, let reason): d = ["state": "backingOff", "reason": .string(reason), "retryAt": date(until)]
        case .paused(let until, let reason, let since): d = ["state": "paused", "reason": .string(reason), "since": date(since), "retryAt": date(until)]
        }
        return ["bundleID": .string(bundleID), "delivery": .object(d)]
    }

    static func installation(_ i: InstallationRecord) -> JSONValue {
        ["id": .string(i.id), "bundleID": .string(i.bundleID), "userID": i.userID.map(JSONValue.string) ?? .null,
         "pushToStartTypes": .array(i.pushToStartTokens.keys.sorted().map(JSONValue.string)), "hasWidgetToken": .bool(i.widgetToken != nil),
         "liveActivitiesEnabled": .bool(i.liveActivitiesEnabled), "frequentPushesEnabled": .bool(i.frequentPushesEnabled), "updatedAt": date(i.updatedAt), "environment": environment(i.environment)]
    }

    static func activity(_ a: ActivityRecord) -> JSONValue {
        ["id": .string(a.id), "externalKey": a.externalKey.map(JSONValue.string) ?? .null, "installationID": a.installationID.map(JSONValue.string) ?? .null,
         "attributesType": .string(a.attributesType), "attributes": a.attributes ?? .null, "contentState": a.content ?? .null, "state": .string(a.state.rawValue),
         "stateReason": a.stateReason.map(JSONValue.string) ?? .null, "hasToken": .bool(a.updateToken != nil), "topics": .array(a.topics.map(JSONValue.string)),
         "relevanceScore": a.relevanceScore.map(JSONValue.double) ?? .null, "staleDate": date(a.staleDate), "startedAt": date(a.startedAt), "endedAt": date(a.endedAt),
         "dismissedAt": date(a.dismissedAt), "environment": environment(a.environment)]
    }

    static func delivery(_ d: DeliveryRecord) -> JSONValue {
        ["id": d.id.map { .int($0) } ?? .null, "jobID": .int(d.jobID), "activityID": d.activityID.map(JSONValue.string) ?? .null, "apnsID": d.apnsID.map { .string($0.text) } ?? .null,
         "apnsUniqueID": d.apnsUniqueID.map(JSONValue.string) ?? .null, "status": .int(d.status), "reason": d.reason.map(JSONValue.string) ?? .null,
         "latencyMS": .double(d.latencyMS), "priority": .int(Int64(d.priority.rawValue)), "downgraded": .bool(d.downgraded), "at": date(d.at)]
    }

    static func channel(_ c: ChannelRecord) -> JSONValue { ["id": .string(c.id), "storagePolicy": .int(c.storagePolicy), "environment": environment(c.environment)] }

    /// `sandbox`, `production`, or null: the server's default (`isle serve --sandbox/--production`).
    static func environment(_ e: PushEnvironment?) -> JSONValue { e.map { .string($0.rawValue) } ?? .null }
}
