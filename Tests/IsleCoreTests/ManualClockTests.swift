import Foundation
import IsleCore
import Testing

@Suite("Injected clocks: sleeping on a manual clock")
struct ManualClockTests {
    @Test("a sleeper wakes when the clock is moved to its deadline, not before; a past deadline returns at once; cancelling throws")
    func sleepers() async throws {
        let clock = ManualWallClock(Date(timeIntervalSince1970: 1_000))
        try await clock.sleep(until: Date(timeIntervalSince1970: 999))
        let woke = Task { try await clock.sleep(until: Date(timeIntervalSince1970: 1_060)); return clock.now }
        let cancelled = Task { try await clock.sleep(until: Date(timeIntervalSince1970: 5_000)) }
        // Moving short of the deadline wakes nothing (checked after the sleepers registered).
        try await eventually("both sleepers registered") { clock.sleepers == 2 }
        clock.advance(by: 59)
        #expect(clock.sleepers == 2)
        clock.advance(by: 1)
        #expect(try await woke.value == Date(timeIntervalSince1970: 1_060))
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(clock.sleepers == 0)
    }

    func eventually(_ what: String, _ condition: () -> Bool) async throws {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: .seconds(10))
        while !condition() {
            guard clock.now < deadline else {
                Issue.record("\(what) did not happen within 10 seconds")
                throw CancellationError()
            }
            await Task.yield()
        }
    }
}
