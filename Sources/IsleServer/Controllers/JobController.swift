import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleWire
import IsleDelivery

/// The app's queue for its backend: unfinished pushes (`GET /v1/jobs`), cancel one that is not in
/// flight (`DELETE /v1/jobs/{id}`), send one waiting for its retry now (`POST /v1/jobs/{id}/retry`).
/// The console's queue actions, over the API.
struct JobController {
    let services: APIServices
    /// The store as this needs it, and no more.
    let store: any JobOperations

    func addRoutes(to v1: RouterGroup<IsleRequestContext>) {
        v1.get("jobs") { request, context in
            let caller = try context.caller(.backend)
            let query = request.uri.queryParameters
            let limit = try Limits.pageSize(request, "limit")
            var activity: String?
            if let text = query["activity"].map(String.init) {
                guard !text.unicodeScalars.contains("\u{0}") else { throw APIError.invalid("activity", "activity holds U+0000, which no activity id holds") }
                activity = try Limits.pathID(text, "activity")
            }
            let jobs = try await store.openJobs(bundleID: caller.bundleID, activityID: activity, limit: limit)
            return JSONResponse.make(API.JobList(jobs: jobs.map { Self.view($0, now: services.clock.now) }))
        }
        v1.delete("jobs/:job") { _, context in
            let caller = try context.caller(.backend)
            let id = try Self.id(context)
            guard let job = try await store.cancelJob(id: id, bundleID: caller.bundleID, reason: "cancelled by the backend (key \(caller.keyID))") else {
                throw try await Self.refusal(id, caller: caller, store: store, what: "cancelled")
            }
            services.engine.wake()
            return JSONResponse.make(API.JobCancellation(id: job.id))
        }
        v1.post("jobs/:job/retry") { _, context in
            let caller = try context.caller(.backend)
            let id = try Self.id(context)
            guard try await store.retryJobNow(id: id, bundleID: caller.bundleID, now: services.clock.now) else {
                throw try await Self.refusal(id, caller: caller, store: store, what: "sent now")
            }
            services.engine.wake()
            return JSONResponse.make(API.JobRetry(id: id))
        }
    }

    static func id(_ context: IsleRequestContext) throws -> Int64 {
        guard let id = Int64(try context.parameters.require("job")), id > 0 else { throw APIError.invalid("job", "job must be a job id (a positive whole number)") }
        return id
    }

    /// 404 for another app's or a missing job; 409 naming the state that refused it.
    static func refusal(_ id: Int64, caller: Caller, store: any JobOperations, what: String) async throws -> APIError {
        guard let job = try await store.job(id: id), job.bundleID == caller.bundleID else { return APIError.notFound("job \(id)") }
        let state = job.state == .claimed ? "in flight" : job.state.rawValue
        return APIError(.conflict, "jobNotWaiting", "job \(id) is \(state); only a \(what == "cancelled" ? "scheduled or queued" : "queued") job can be \(what)")
    }

    static func view(_ j: PushJob, now: Date) -> API.Job {
        let waiting: API.Job.State = switch j.state {
        case .scheduled: .scheduled
        case .claimed: .inFlight
        default: j.runAt > now ? (j.attempts > 0 ? .waitingForRetry : .waiting) : .due
        }
        var o = API.Job(id: j.id, kind: j.kind.rawValue, state: waiting, dueAt: j.runAt, attempts: Int64(j.attempts), createdAt: j.createdAt)
        o.activityID = j.activityID
        o.channelID = j.channelID
        o.installationID = j.installationID
        o.lastError = j.lastError
        return o
    }
}
