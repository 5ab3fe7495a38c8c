import IsleCore
import Testing

@Suite("Double → integer conversions never trap")
struct SaturatingTests {
    @Test("NaN, infinities and out-of-range values clamp; in-range values truncate like Int(_:)", arguments: [
        (Double.nan, Int64(0)), (.infinity, .max), (-.infinity, .min), (1e19, .max), (-1e19, .min), (9.3e18, .max),
        (9_223_372_036_854_775_807.0, .max), (-9_223_372_036_854_775_808.0, .min), (1.9, 1), (-1.9, -1), (0, 0), (4096.0, 4096),
    ])
    func saturating(_ value: Double, _ expected: Int64) {
        #expect(Int64(saturating: value) == expected)
        #expect(Int(saturating: value) == Int(expected))
    }
}
