import Foundation
import IsleCore
import IsleDelivery
import IsleStore
import Testing

/// Renewals in every store: due by the documented rule, one successor however many sweeps race.
@Suite("Store contract: renewals")
struct RenewalStoreTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let app = "com.example.renew"
    let lifetime: TimeInterval = 8 * 3600
    let lead: TimeInterval = 1800

    @Test("due 30 minutes before the 8-hour end while renewUntil is after it; one successor named however many race; not due once it exists", arguments: StoreKind.allCases)
    func due(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for (id, until) in [("long", 20.0 * 3600), ("short", 7.0 * 3600), ("ended", 20.0 * 3600)] {
            try await s.insertActivity(ActivityRecord(id: id, bundleID: app, externalKey: id, installationID: "phone", attributesType: "T", state: id == "ended" ? .ended : .active, updateToken: "tok-\(id)", startedAt: t0))
            try await s.putRenewal(RenewalRecord(activityID: id, bundleID: app, renewUntil: t0.addingTimeInterval(until), alert: ["title": "T", "body": "B"], createdAt: t0), idempotency: nil)
        }
        #expect(try await s.dueRenewals(now: t0.addingTimeInterval(7 * 3600), lifetime: lifetime, lead: lead, limit: 10).isEmpty)
        let due = try await s.dueRenewals(now: t0.addingTimeInterval(7.6 * 3600), lifetime: lifetime, lead: lead, limit: 10)
        #expect(due.map(\.activityID) == ["long"], "the short one ends after renewUntil anyway; the ended one is over")
        #expect(due.first?.alert == ["title": "T", "body": "B"])
        #expect(try await s.dueRenewals(now: t0.addingTimeInterval(8.1 * 3600), lifetime: lifetime, lead: lead, limit: 10).isEmpty, "past the end: too late")
        let named = try await withThrowingTaskGroup(of: String.self) { group in
            for i in 0..<6 { group.addTask { try await s.setSuccessor(activityID: "long", successorID: "succ-\(i)") } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(named.count == 1)
        // Named but not started (a crash between): still due, with the same successor named.
        #expect(try await s.dueRenewals(now: t0.addingTimeInterval(7.6 * 3600), lifetime: lifetime, lead: lead, limit: 10).first?.successorID == named.first)
        try await s.insertActivity(ActivityRecord(id: named.first!, bundleID: app, externalKey: "long", installationID: "phone", attributesType: "T", state: .starting, startedAt: t0.addingTimeInterval(7.6 * 3600)))
        #expect(try await s.dueRenewals(now: t0.addingTimeInterval(7.6 * 3600), lifetime: lifetime, lead: lead, limit: 10).isEmpty)
        try await s.deleteRenewal(activityID: "long", idempotency: nil)
        #expect(try await s.renewal(activityID: "long") == nil)
    }
}
