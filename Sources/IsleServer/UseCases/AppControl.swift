import Foundation
import IsleCore
import IsleStore
import IsleDelivery

/// Pausing and resuming an app by hand (the console's buttons), and probing a paused app (`POST
/// /v1/app/resume`, which never lifts an operator's pause). A pause
/// is stored (every instance stops sending within a second, and it survives a restart) with its
/// `app.paused` event; a resume clears it with `app.resumed` and probes an app that the circuit
/// paused (a configuration error) at once.
struct AppControl {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any OperatorPauseRepository & JobIntake

    /// False when an operator had paused it already (the reason is replaced, no new event).
    func pause(bundleID: String, keyID: String, reason: String) async throws -> Bool {
        let now = services.clock.now
        let paused = try await store.pauseApp(OperatorPause(bundleID: bundleID, keyID: keyID, reason: reason, at: now),
                                                      event: NewEvent(bundleID: bundleID, type: .appPaused, data: ["cause": "operator", "reason": .string(reason), "keyID": .string(keyID)], at: now))
        services.engine.circuits.setOperatorPauses(try await store.operatorPauses())
        services.events.ring()
        if paused { services.engine.counters.metrics.appPaused(cause: "operator") }
        return paused
    }

    /// Probes an app the circuit paused or backs off from, at once (`POST /v1/app/resume`).
    func probe(bundleID: String) async throws {
        let now = services.clock.now
        services.engine.circuits.resume(bundleID, now: now)
        try await store.wakeApp(bundleID: bundleID, now: now)
        services.engine.wake()
    }

    /// Whether an operator's pause was lifted.
    @discardableResult
    func resume(bundleID: String, keyID: String?) async throws -> Bool {
        let now = services.clock.now
        var data: JSONObject = ["source": "operator"]
        if let keyID { data["keyID"] = .string(keyID) }
        let lifted = try await store.resumeApp(bundleID: bundleID, event: NewEvent(bundleID: bundleID, type: .appResumed, data: data, at: now)) != nil
        services.engine.circuits.setOperatorPauses(try await store.operatorPauses())
        services.engine.circuits.resume(bundleID, now: now)
        try await store.wakeApp(bundleID: bundleID, now: now)
        services.engine.wake()
        services.events.ring()
        return lifted
    }
}
