import Foundation
import IsleCore
import Testing

@Suite("Date text styles (docs/protocol.md §9.3)")
struct DateTextTests {
    let now = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01 00:00 UTC

    @Test("timer counts down, then up; hours when needed", arguments: [(900.0, "15:00"), (152, "2:32"), (-152, "2:32"), (133_141, "36:59:01")])
    func timer(_ offset: TimeInterval, _ expected: String) {
        #expect(DateText.text(now.addingTimeInterval(offset), style: .timer, now: now) == expected)
    }

    @Test("relative and offset")
    func relative() {
        #expect(DateText.text(now.addingTimeInterval(674), style: .relative, now: now) == "11 min, 14 sec")
        #expect(DateText.text(now.addingTimeInterval(-8580), style: .relative, now: now) == "2 hr, 23 min")
        #expect(DateText.text(now.addingTimeInterval(660), style: .offset, now: now) == "-11 min")
        #expect(DateText.text(now.addingTimeInterval(-7200), style: .offset, now: now) == "+2 hr")
    }

    @Test("time, date, ranges and timerInterval")
    func absolute() {
        #expect(DateText.text(now.addingTimeInterval(9 * 3600 + 41 * 60), style: .time, now: now) == "9:41 AM")
        #expect(DateText.text(now, style: .date, now: now) == "January 1, 2026")
        #expect(DateText.range(now.addingTimeInterval(34200)...now.addingTimeInterval(53100)) == "9:30 AM – 2:45 PM")
        let window = now...now.addingTimeInterval(1500)
        #expect(DateText.timerInterval(window, now: now.addingTimeInterval(300)) == "20:00")
        #expect(DateText.timerInterval(window, countsDown: false, now: now.addingTimeInterval(300)) == "5:00")
        #expect(DateText.timerInterval(window, now: now.addingTimeInterval(9999)) == "0:00")
    }
}
