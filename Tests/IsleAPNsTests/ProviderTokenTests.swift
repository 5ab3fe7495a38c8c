import Foundation
import IsleAPNs
import IsleCore
import IsleTesting
import Testing

@Suite("Provider tokens (docs/protocol.md §1.2–1.3, docs/protocol.md, Wire)")
struct ProviderTokenTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)

    @Test("schedule: mint on first use, refresh at 50 minutes")
    func schedule() {
        var s = ProviderTokenSchedule()
        #expect(s.action(now: t0) == .mint)
        s.didMint(issuedAt: t0)
        #expect(s.action(now: t0.addingTimeInterval(49 * 60 + 59)) == .useCurrent)
        #expect(s.action(now: t0.addingTimeInterval(50 * 60)) == .mint)
    }

    @Test("schedule: an expired-token rejection never replaces a token younger than 20 minutes")
    func rejection() {
        var s = ProviderTokenSchedule()
        s.didMint(issuedAt: t0)
        #expect(s.didReject(tokenIssuedAt: t0, now: t0.addingTimeInterval(19 * 60 + 59)) == false)
        #expect(s.action(now: t0.addingTimeInterval(19 * 60 + 59)) == .useCurrent)
        #expect(s.action(now: t0.addingTimeInterval(20 * 60)) == .mint)
        // A rejection of an older token, already replaced, allows a retry with the current one.
        s.didMint(issuedAt: t0.addingTimeInterval(20 * 60))
        #expect(s.didReject(tokenIssuedAt: t0, now: t0.addingTimeInterval(21 * 60)) == true)
        #expect(s.action(now: t0.addingTimeInterval(21 * 60)) == .useCurrent)
    }

    @Test("provider: integer iat even when the clock has a fraction; one token shared")
    func provider() throws {
        let clock = ManualWallClock(t0.addingTimeInterval(0.987))
        let key = TestProviderKey()
        let provider = ProviderTokenProvider(credentials: try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM), clock: clock)
        let a = provider.currentToken()
        clock.advance(by: 600)
        #expect(provider.currentToken() == a)
        let jwt = try DecodedJWT(a.jwt)
        #expect(jwt.claimsText == #"{"iss":"DEF123GHIJ","iat":1767225600}"#)
        #expect(!"\(a)".contains(a.jwt))
    }

    @Test("inspector accepts Isle's tokens and verifies the signature")
    func inspectGood() throws {
        let key = TestProviderKey()
        let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
        let token = credentials.makeProviderToken(issuedAt: t0)
        let ok = ProviderTokenInspector.inspect(token.jwt, publicKey: credentials.publicKey, now: t0.addingTimeInterval(60))
        #expect(ok.isAcceptable, "\(ok.problems)")
        #expect(ok.signatureValid == true)
        #expect(ok.keyID == "ABC123DEFG" && ok.teamID == "DEF123GHIJ")
        let old = ProviderTokenInspector.inspect(token.jwt, now: t0.addingTimeInterval(3601))
        #expect(old.problems.contains { $0.contains("ExpiredProviderToken") })
        let otherKey = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: TestProviderKey().privateKeyPEM)
        #expect(ProviderTokenInspector.inspect(token.jwt, publicKey: otherKey.publicKey, now: t0).signatureValid == false)
    }

    @Test("inspector names what is wrong with foreign tokens", arguments: [
        (#"{"alg":"HS256","kid":"ABC123DEFG"}"#, #"{"iss":"DEF123GHIJ","iat":1767225600}"#, "ES256"),
        (#"{"alg":"ES256","kid":"ABC123DEFG","typ":"JWT"}"#, #"{"iss":"DEF123GHIJ","iat":1767225600}"#, "typ"),
        (#"{"alg":"ES256"}"#, #"{"iss":"DEF123GHIJ","iat":1767225600}"#, "kid"),
        (#"{"alg":"ES256","kid":"ABC123DEFG"}"#, #"{"iss":"DEF123GHIJ","iat":"1767225600"}"#, "JSON number"),
        (#"{"alg":"ES256","kid":"ABC123DEFG"}"#, #"{"iss":"DEF123GHIJ","iat":1767225600.5}"#, "integer"),
        (#"{"alg":"ES256","kid":"ABC123DEFG"}"#, #"{"iat":1767225600,"kid":"ABC123DEFG"}"#, "iss"),
    ])
    func inspectBad(_ header: String, _ claims: String, _ mentions: String) {
        func b64(_ s: String) -> String {
            Data(s.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "").replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        }
        let sig = Data(repeating: 1, count: 64).base64EncodedString().replacingOccurrences(of: "=", with: "").replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        let r = ProviderTokenInspector.inspect("\(b64(header)).\(b64(claims)).\(sig)", now: t0)
        #expect(r.problems.contains { $0.contains(mentions) }, "\(r.problems)")
        #expect(ProviderTokenInspector.inspect("abc.def", now: t0).problems.first?.contains("three") == true)
    }

    @Test("keys: a bad key or id fails at load with a clear reason, never echoing the key")
    func badKeys() throws {
        let key = TestProviderKey()
        #expect(throws: APNsCredentialsError.self) { try APNsCredentials(keyID: "short", teamID: key.teamID, pem: key.privateKeyPEM) }
        #expect(throws: APNsCredentialsError.self) { try APNsCredentials(keyID: key.keyID, teamID: "def123ghij", pem: key.privateKeyPEM) }
        for (text, reason) in [("", "empty"), ("not a key!", "neither PEM"), (key.publicKeyPEM, "public key"),
                               ("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "certificate"),
                               ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----", "not a valid ES256")] {
            do { _ = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: text); Issue.record("accepted \(reason)") } catch {
                #expect(error.reason.contains(reason), "\(error)")
            }
        }
        do { _ = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, keyFile: "/nonexistent/AuthKey.p8") } catch {
            #expect(error.reason.contains("no such file"))
        }
        // A .p8 file loads; so does its bare base64 body.
        let path = try key.writeP8()
        _ = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, keyFile: path)
        let body = key.privateKeyPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        _ = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: body)
    }
}
