import Foundation
import IsleCore
import Testing

@Suite("Hex")
struct HexTests {
    @Test("lowercase, two digits a byte, the same as %02x")
    func encode() {
        #expect(Hex.encode([0x00, 0x01, 0xab, 0xff]) == "0001abff")
        #expect(Hex.encode([UInt8]()) == "")
        var random = SeededRandom(seed: 3)
        let bytes = (0..<256).map { _ in UInt8.random(in: 0...255, using: &random) }
        #expect(Hex.encode(bytes) == bytes.map { String(format: "%02x", $0) }.joined())
    }
}
