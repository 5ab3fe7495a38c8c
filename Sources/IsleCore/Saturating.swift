/// Double → integer conversions that never trap: `Int(x)` traps on NaN, infinities and values
/// outside the integer's range, so every conversion of a computed or configured number goes
/// through these (docs/protocol.md, Isle's decisions: bad input never stops a process).
extension Int64 {
    /// `value` rounded toward zero and clamped to Int64's range; NaN becomes 0.
    public init(saturating value: Double) {
        if value.isNaN { self = 0 }
        else if value >= 9_223_372_036_854_775_807.0 { self = .max }  // Double(Int64.max) rounds up to 2^63
        else if value <= -9_223_372_036_854_775_808.0 { self = .min }
        else { self = Int64(value) }
    }
}

extension Int {
    /// `value` rounded toward zero and clamped to Int's range; NaN becomes 0.
    public init(saturating value: Double) { self = Int(Int64(saturating: value)) }
}
