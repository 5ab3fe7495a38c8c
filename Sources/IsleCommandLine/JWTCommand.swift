import ArgumentParser
import Crypto
import Foundation
import IsleAPNs
import IsleCore

struct JWTCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jwt",
        abstract: "Print a provider token (JWT) for curl, or inspect one.",
        subcommands: [Make.self, Inspect.self],
        defaultSubcommand: Make.self
    )

    struct Make: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "make", abstract: "Print a fresh provider token (valid for one hour).")
        @OptionGroup var connection: ConnectionOptions

        func run() async throws {
            let credentials = try connection.credentials()
            say(credentials.makeProviderToken(issuedAt: CLIContext.current.now()).jwt)
        }
    }

    struct Inspect: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Decode a provider token and check it against APNs' rules. Exit 1 if APNs would reject it.")
        @Argument(help: "The token (with or without 'bearer '), or - for standard input.")
        var token: String
        @Option(help: ArgumentHelp("Verify the signature with this .p8 key (or a PEM public key).", valueName: "file"))
        var key: String?

        func run() async throws {
            var text = token
            if token == "-" { text = String(decoding: try Inputs.read("-", flag: "TOKEN"), as: UTF8.self) }
            var publicKey: P256.Signing.PublicKey?
            if let key {
                let pem = String(decoding: try Inputs.read(key, flag: "--key"), as: UTF8.self)
                if let pub = try? P256.Signing.PublicKey(pemRepresentation: pem) {
                    publicKey = pub
                } else {
                    do { publicKey = try APNsCredentials(keyID: "AAAAAAAAAA", teamID: "AAAAAAAAAA", pem: pem).publicKey } catch {
                        throw CLIError("--key: \(error.reason)")
                    }
                }
            }
            let now = CLIContext.current.now()
            let r = ProviderTokenInspector.inspect(text, publicKey: publicKey, now: now)
            if let h = r.header { say("header: \(h.jsonString)") }
            if let c = r.claims { say("claims: \(c.jsonString)") }
            if let iat = r.issuedAt {
                say("issued: \(ISO8601DateFormatter().string(from: iat)) (\(Int(now.timeIntervalSince(iat) / 60)) minutes ago)")
            }
            switch r.signatureValid {
            case true?: say("signature: valid for the given key")
            case false?: say("signature: INVALID for the given key")
            case nil: say("signature: not checked (give --key)")
            }
            if r.isAcceptable {
                say("ok: APNs would accept this token's form")
            } else {
                for p in r.problems { say("problem: \(p)") }
                throw ExitCode(1)
            }
        }
    }
}
