public import Foundation
import Crypto
import IsleCore

/// How Isle signs a webhook request, and how a receiver checks it (docs/events.md):
/// `Isle-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the secret>`.
/// A receiver recomputes the HMAC over the timestamp and the exact body bytes, compares in constant
/// time, and refuses a timestamp outside its replay window (Isle's default: 5 minutes).
public enum WebhookSignature {
    public static let header = "Isle-Signature"
    public static let replayWindow: TimeInterval = 300

    public static func sign(body: [UInt8], secret: String, at: Date) -> String { sign(body: body, secrets: [secret], at: at) }

    /// Signed with each secret, the current one first: during a rotation's overlap the header
    /// carries a `v1` for the new secret and one for the old, and a receiver holding either
    /// verifies the request (as Stripe's does).
    public static func sign(body: [UInt8], secrets: [String], at: Date) -> String {
        let t = Int64(at.timeIntervalSince1970.rounded(.down))
        return (["t=\(t)"] + secrets.map { "v1=\(mac(body: body, secret: $0, timestamp: t))" }).joined(separator: ",")
    }

    static func mac(body: [UInt8], secret: String, timestamp: Int64) -> String {
        var message = Array("\(timestamp).".utf8)
        message.append(contentsOf: body)
        return Hex.encode(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: Array(secret.utf8))))
    }

    /// Whether `header` signs `body` with `secret`, within `window` of `now`.
    public static func verify(header: String, body: [UInt8], secret: String, now: Date, window: TimeInterval = replayWindow) -> Bool {
        var t: Int64?
        var signatures: [String] = []
        for part in header.split(separator: ",") {
            let kv = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard kv.count == 2 else { continue }
            if kv[0] == "t" { t = Int64(kv[1]) } else if kv[0] == "v1" { signatures.append(kv[1]) }
        }
        guard let t, abs(now.timeIntervalSince1970 - Double(t)) <= window else { return false }
        let expected = Array(mac(body: body, secret: secret, timestamp: t).utf8)
        return signatures.contains { s in
            let given = Array(s.utf8)
            guard given.count == expected.count else { return false }
            var difference: UInt8 = 0
            for i in 0..<given.count { difference |= given[i] ^ expected[i] }
            return difference == 0
        }
    }
}
