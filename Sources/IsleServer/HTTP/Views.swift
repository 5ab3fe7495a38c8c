import Foundation
import Hummingbird
import HTTPTypes
import IsleCore
import IsleDelivery
import IsleHTTPAPI
import IsleStore
import IsleWire

/// The API's answers made from stored records: the wire types (IsleWire's `API`) the OpenAPI
/// document states.
enum Views {
    static func app(bundleID: String, _ c: AppCircuit, pause: OperatorPause? = nil, retrying: [RetryingPush] = []) -> API.AppStatus {
        let r = retrying.first.map { API.Retrying(pushes: Int64(retrying.count), since: $0.since, jobIDs: retrying.prefix(20).map(\.jobID), lastAnswer: $0.lastAnswer, reason: $0.reason) }
        if let pause {
            // Paused by hand: until an operator resumes it (POST /v1/app/resume or the console).
            return API.AppStatus(bundleID: bundleID, delivery: API.AppDelivery(state: .paused, reason: "paused by an operator (key \(pause.keyID)): \(pause.reason)", since: pause.at, retrying: r))
        }
        let d: API.AppDelivery = switch c.mode {
        case .running: API.AppDelivery(state: .running, retrying: r)
        case .backingOff(let until, let reason): API.AppDelivery(state: .backingOff, reason: reason, retryAt: until, retrying: r)
        case .paused(let until, let reason, let since): API.AppDelivery(state: .paused, reason: reason, since: since, retryAt: until, retrying: r)
        }
        return API.AppStatus(bundleID: bundleID, delivery: d)
    }

    /// The app's status as this instance knows it: its circuit, an operator's pause, the pushes it retries.
    static func app(bundleID: String, circuits: AppCircuits, now: Date) -> API.AppStatus {
        app(bundleID: bundleID, circuits.circuit(bundleID), pause: circuits.operatorPause(bundleID), retrying: circuits.retrying(bundleID, now: now))
    }

    static func installation(_ i: InstallationRecord) -> API.Installation {
        API.Installation(id: i.id, bundleID: i.bundleID, userID: i.userID, pushToStartTypes: i.pushToStartTokens.keys.sorted(), hasWidgetToken: i.widgetToken != nil,
                         hasControlsToken: i.controlsToken != nil,
                         liveActivitiesEnabled: i.liveActivitiesEnabled, frequentPushesEnabled: i.frequentPushesEnabled, updatedAt: i.updatedAt, environment: i.environment,
                         broadcastChannels: i.broadcastChannels, topics: i.topics)
    }

    static func activity(_ a: ActivityRecord) -> API.Activity {
        API.Activity(id: a.id, externalKey: a.externalKey, installationID: a.installationID, attributesType: a.attributesType, attributes: a.attributes?.objectValue,
                     contentState: a.content?.objectValue, state: a.state, stateReason: a.stateReason, hasToken: a.updateToken != nil, topics: a.topics,
                     relevanceScore: a.relevanceScore, staleDate: a.staleDate, startedAt: a.startedAt, endedAt: a.endedAt, dismissedAt: a.dismissedAt, environment: a.environment)
    }

    static func delivery(_ d: DeliveryRecord) -> API.Delivery {
        API.Delivery(id: d.id, jobID: d.jobID, activityID: d.activityID, apnsID: d.apnsID?.text, apnsUniqueID: d.apnsUniqueID, status: Int64(d.status), reason: d.reason,
                     latencyMS: d.latencyMS, priority: d.priority.rawValue, downgraded: d.downgraded, at: d.at)
    }

    static func channel(_ c: ChannelRecord) -> API.Channel { API.Channel(id: c.id, storagePolicy: Int64(c.storagePolicy), environment: c.environment) }

    /// The validator's findings, typed.
    static func findings(_ warnings: [JSONValue]) -> [API.Finding]? {
        warnings.isEmpty ? nil : warnings.map {
            API.Finding(code: $0["code"]?.stringValue ?? "", field: $0["field"]?.stringValue, message: $0["message"]?.stringValue ?? "", fix: $0["fix"]?.stringValue ?? "")
        }
    }
}

extension JSONResponse {
    /// An answer of one of the API's types.
    static func make<T: Encodable>(_ value: T, status: HTTPResponse.Status = .ok) -> Response {
        make(WireEncoder.encode(value), status: status)
    }
}

extension IsleRequestContext {
    /// The idempotency record of a write whose answer (of an API type) is made from what it wrote.
    func idempotentAnswer<Record, T: Encodable & Sendable>(_ status: HTTPResponse.Status, _ view: @escaping @Sendable (Record) -> T) -> IdempotentAnswer<Record>? {
        idempotentAnswer(status) { WireEncoder.encode(view($0)) }
    }

    func idempotencyRecord<T: Encodable>(_ status: HTTPResponse.Status, _ value: T, jobs: Bool = false) -> IdempotencyRecord? {
        idempotencyRecord(status, WireEncoder.encode(value), jobs: jobs)
    }
}
