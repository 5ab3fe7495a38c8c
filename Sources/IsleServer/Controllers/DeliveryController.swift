import Hummingbird
import IsleAPNs
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery

/// `GET /v1/deliveries/{apns-id}`: one APNs answer, the caller's own only.
struct DeliveryController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any DeliveryHistory & JobOperations

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.get("deliveries/:apnsID") { _, context in
            let caller = try context.caller(.backend)
            let text = try context.parameters.decoded("apnsID")
            // Not a UUID: no delivery can have it.
            guard let id = APNsID(text), let d = try await store.delivery(apnsID: id) else { throw APIError.notFound("delivery \(text.prefix(40))") }
            if let aid = d.activityID {
                _ = try await services.ownActivity(caller, aid)
            } else {
                // Widget and broadcast deliveries: the job says whose they are.
                guard let job = try await store.job(id: d.jobID), job.bundleID == caller.bundleID else { throw APIError.notFound("delivery \(id)") }
            }
            return JSONResponse.make(Views.delivery(d))
        }
    }
}
