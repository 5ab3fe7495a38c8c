import Foundation
import IsleCore
import IsleDelivery
import Testing

/// The engine's record of priority-10 sends decided and not yet counted by a claim: under any
/// interleaving of claims, decisions and written results, one installation never gets more
/// priority-10 sends than its budget.
@Suite("Priority-10 decisions made together")
struct PriorityReservationsTests {
    @Test("seeded interleavings: claims read the store's count at any moment, decisions and writes come in any order; the sends at 10 never pass the budget, and every one the budget allows is made", arguments: [1, 2, 3, 4, 5, 6, 7, 8] as [UInt64])
    func interleavings(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let reservations = PriorityReservations()
        let budget = 14
        // The store: priority-10 sends written. Claimed jobs: their mark and the count they read.
        var stored = 0
        var claimed: [(job: Int64, mark: UInt64, read: Int)] = []
        var decided: [(job: Int64, atTen: Bool)] = []
        var atTen = 0
        var next: Int64 = 1
        var jobs = 60
        while jobs > 0 || !claimed.isEmpty || !decided.isEmpty {
            switch Int.random(in: 0..<3, using: &random) {
            case 0 where jobs > 0:
                // A claim of 1–4 jobs: the mark, then the store's count.
                let mark = reservations.mark()
                for _ in 0..<min(jobs, Int.random(in: 1...4, using: &random)) {
                    claimed.append((next, mark, stored))
                    next += 1
                    jobs -= 1
                }
            case 1 where !claimed.isEmpty:
                let c = claimed.remove(at: Int.random(in: 0..<claimed.count, using: &random))
                let ten = reservations.decide(key: "inst:app/phone", job: c.job, mark: c.mark, { uncounted in c.read + uncounted < budget }, sendsAtTen: { $0 })
                if ten { atTen += 1 }
                decided.append((c.job, ten))
            case 2 where !decided.isEmpty:
                // The result is written (APNs may have refused a send: then it is not counted).
                let d = decided.remove(at: Int.random(in: 0..<decided.count, using: &random))
                let landed = d.atTen && Int.random(in: 0..<10, using: &random) > 0
                if landed { stored += 1 } else if d.atTen { atTen -= 1 }
                reservations.written(job: d.job, sentAtTen: landed)
            default:
                continue
            }
            #expect(atTen <= budget, "seed \(seed): \(atTen) sends at 10 decided or written")
        }
        #expect(stored == budget, "every send the budget allows is made: \(stored)")
    }
}
