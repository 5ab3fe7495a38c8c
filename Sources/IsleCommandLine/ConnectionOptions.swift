import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore
import Logging

/// Credentials and where to send: flags first, then ISLE_* environment variables.
struct ConnectionOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Path to the .p8 token-signing key (env ISLE_APNS_KEY).", valueName: "file"))
    var key: String?

    @Option(name: .customLong("key-id"), help: "The 10-character Key ID (env ISLE_APNS_KEY_ID).")
    var keyID: String?

    @Option(name: .customLong("team-id"), help: "The 10-character Team ID (env ISLE_APNS_TEAM_ID).")
    var teamID: String?

    @Option(name: .customLong("bundle-id"), help: "The app's bundle id, without suffix (env ISLE_BUNDLE_ID).")
    var bundleID: String?

    @Flag(help: "Use APNs' development environment (the default; env ISLE_APNS_ENV=sandbox).")
    var sandbox = false

    @Flag(help: "Use APNs' production environment (env ISLE_APNS_ENV=production).")
    var production = false

    @Option(help: ArgumentHelp("Send to this APNs-compatible server instead, e.g. Isle's simulator (env ISLE_APNS_URL).", valueName: "url"))
    var url: String?

    @Option(name: .customLong("broadcast-url"), help: ArgumentHelp("With --url: where broadcasts go, if not --url (env ISLE_APNS_BROADCAST_URL; isle sim prints it).", valueName: "url"))
    var broadcastURL: String?

    @Option(name: .customLong("management-url"), help: ArgumentHelp("With --url: where channel management goes, if not --url (env ISLE_APNS_MANAGEMENT_URL).", valueName: "url"))
    var managementURL: String?

    @Option(name: .customLong("ca-cert"), help: ArgumentHelp("PEM file of the CA to trust for --url (env ISLE_APNS_CA_CERT).", valueName: "file"))
    var caCert: String?

    @Option(help: "Seconds to wait for APNs' answer.")
    var timeout: Int = 30
    @Option(name: .customLong("apns-transport"), help: "The HTTP/2 client: http2 (default) or async-http-client.")
    var apnsTransport: String = APNsTransportKind.default.rawValue

    func env(_ name: String) -> String? {
        let v = CLIContext.current.environment[name]
        return (v?.isEmpty ?? true) ? nil : v
    }

    func resolvedBundleID() throws(CLIError) -> String {
        guard let id = bundleID ?? env("ISLE_BUNDLE_ID") else { throw CLIError("missing --bundle-id (or ISLE_BUNDLE_ID): the app's bundle id, e.g. com.example.pizza") }
        return id
    }

    /// The credentials; every missing one is named at once.
    func credentials() throws(CLIError) -> APNsCredentials {
        let path = key ?? env("ISLE_APNS_KEY"), keyID = keyID ?? env("ISLE_APNS_KEY_ID"), teamID = teamID ?? env("ISLE_APNS_TEAM_ID")
        var missing: [String] = []
        if path == nil { missing.append("--key (or ISLE_APNS_KEY): the path to your .p8 token-signing key") }
        if keyID == nil { missing.append("--key-id (or ISLE_APNS_KEY_ID): the 10-character Key ID of the .p8 key") }
        if teamID == nil { missing.append("--team-id (or ISLE_APNS_TEAM_ID): your 10-character Team ID") }
        guard let path, let keyID, let teamID else { throw CLIError("missing " + missing.joined(separator: "; missing ")) }
        // Apple names the downloaded file after its key: a different --key-id is a token APNs refuses.
        let file = (path as NSString).lastPathComponent
        if file.hasPrefix("AuthKey_"), file.hasSuffix(".p8") {
            let named = String(file.dropFirst("AuthKey_".count).dropLast(".p8".count))
            if !named.isEmpty, named != keyID {
                throw CLIError.configuration("--key-id \(keyID) does not match the key file \(file), which Apple named after key \(named): give --key-id \(named), or the file of key \(keyID)")
            }
        }
        do { return try APNsCredentials(keyID: keyID, teamID: teamID, keyFile: path) } catch {
            throw CLIError.configuration("--key: \(error.reason)")
        }
    }

    func environment() throws(CLIError) -> APNsEnvironment {
        if sandbox && production { throw CLIError("--sandbox and --production exclude each other") }
        if let url = url ?? env("ISLE_APNS_URL") {
            if sandbox || production { throw CLIError("--url replaces --sandbox/--production; give one of them") }
            guard let parsed = URL(string: url), parsed.scheme == "https", parsed.host != nil else {
                throw CLIError("--url: \"\(url)\" must be an https URL such as https://127.0.0.1:8443")
            }
            var roots: String?
            if let path = caCert ?? env("ISLE_APNS_CA_CERT") {
                roots = String(decoding: try Inputs.read(path, flag: "--ca-cert"), as: UTF8.self)
                guard roots!.contains("BEGIN CERTIFICATE") else { throw CLIError("--ca-cert: \(path) has no PEM certificate") }
            }
            var others: [String?] = []
            for (flag, value) in [("--broadcast-url", broadcastURL ?? env("ISLE_APNS_BROADCAST_URL")), ("--management-url", managementURL ?? env("ISLE_APNS_MANAGEMENT_URL"))] {
                if let value {
                    guard let p = URL(string: value), p.scheme == "https", p.host != nil else { throw CLIError("\(flag): \"\(value)\" must be an https URL") }
                }
                others.append(value)
            }
            return .custom(url: url, broadcastURL: others[0], managementURL: others[1], trustRootsPEM: roots)
        }
        if caCert != nil { throw CLIError("--ca-cert only applies with --url") }
        if broadcastURL != nil || managementURL != nil { throw CLIError("--broadcast-url and --management-url only apply with --url") }
        if production { return .production }
        if sandbox { return .sandbox }
        switch env("ISLE_APNS_ENV")?.lowercased() {
        case nil, "sandbox", "development": return .sandbox
        case "production": return .production
        case let other?: throw CLIError("ISLE_APNS_ENV is \"\(other)\"; use sandbox or production")
        }
    }

    var caCertPath: String? { caCert ?? env("ISLE_APNS_CA_CERT") }

    func withClient<R: Sendable>(_ body: (APNsClient) async throws -> R) async throws -> R {
        guard timeout > 0 else { throw CLIError("--timeout must be a positive number of seconds") }
        guard let transport = APNsTransportKind(rawValue: apnsTransport) else {
            throw CLIError("--apns-transport: \"\(apnsTransport)\" is not one of \(APNsTransportKind.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let configuration = APNsClient.Configuration(environment: try environment(), credentials: try credentials(), requestTimeout: .seconds(timeout),
                                                     connectTimeout: .seconds(min(timeout, 10)), transport: transport)
        let client: APNsClient
        do { client = try APNsClient(configuration: configuration, clock: ContextClock(now: CLIContext.current.now), logger: Logger(label: "isle")) } catch {
            throw CLIError("cannot set up the connection: \(error.reason)")
        }
        do {
            let r = try await body(client)
            try? await client.shutdown()
            return r
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

/// Printing APNs' answer and turning errors into one line each.
enum Report {
    static func response(_ r: APNsResponse) {
        var parts = ["\(r.status) OK"]
        if let id = r.apnsID { parts.append("apns-id \(id.text)") }
        if let u = r.apnsUniqueID { parts.append("apns-unique-id \(u)") }
        if let q = r.requestID { parts.append("apns-request-id \(q)") }
        parts.append(String(format: "%.0f ms", Double(r.latency.components.attoseconds) / 1e15 + Double(r.latency.components.seconds) * 1000))
        say(parts.joined(separator: "  "))
    }

    /// One line that names the cause and the fix, with the exit status of its kind. `target`:
    /// where the request went (nil: Apple's hosts).
    static func failure(_ error: APNsError, target: APNsEnvironment? = nil) -> CLIError {
        switch error.code {
        case .rejected:
            let r = error.response!
            var line = r.summary
            if let id = r.apnsID { line += " (apns-id \(id.text))" }
            if let since = r.invalidSince { line += " Token invalid since \(ISO8601DateFormatter().string(from: since))." }
            // Isle's simulator says why when the reason alone would mislead (its own clock, say).
            if let note = r.deviceNote, note.hasPrefix("refused: ") { line += " The simulator says: \(note.dropFirst("refused: ".count))" }
            let status: Int32 = switch error.remedy {
            case .fixConfiguration: ExitStatus.configuration
            case .retryLater: ExitStatus.unavailable
            default: ExitStatus.refused
            }
            return CLIError(line, exitCode: status)
        case .invalidRequest:
            let hint = (error.validation?.errors.count ?? 0) > 1 ? " Run 'isle validate' on the payload for the full list." : ""
            return CLIError(error.message + hint, exitCode: ExitStatus.refused)
        case .transport:
            let kind = error.transport?.kind ?? .other
            let custom: String? = if case .custom(let url, _, _, _)? = target { url } else { nil }
            switch kind {
            case .tlsFailed:
                if let custom {
                    return .configuration("the TLS handshake with \(custom) failed: its certificate is not one this command trusts. Against isle sim, give --ca-cert <its folder>/ca.pem (isle sim prints it); for another server, the CA that signed its certificate")
                }
                return .configuration("the TLS handshake with APNs failed (\(error.transport?.reason ?? error.message)): check this machine's CA certificates and clock")
            case .connectionFailed:
                let whereTo = custom ?? "APNs"
                return CLIError("nothing answers at \(whereTo) (\(error.transport?.reason ?? "connection refused")): is the server running and is the URL right?\(custom != nil ? " isle sim prints its URLs when it starts." : " Check this machine's network.")",
                                exitCode: ExitStatus.unavailable)
            case .timedOut:
                return CLIError("\(custom ?? "APNs") did not answer in time (--timeout): try again later, or give a longer --timeout", exitCode: ExitStatus.unavailable)
            default:
                return CLIError("\(error.message). \(APNsReason.advice(error.remedy))", exitCode: ExitStatus.unavailable)
            }
        }
    }

    static func warnings(_ report: ValidationReport) {
        for issue in report.warnings { warn("warning [\(issue.code.rawValue)] \(issue.path): \(issue.message) \(issue.fix)") }
    }
}

/// The CLI's notion of now (injected in tests) as a client clock.
struct ContextClock: WallClock {
    let now_: @Sendable () -> Date
    init(now: @escaping @Sendable () -> Date) { now_ = now }
    var now: Date { now_() }
}
