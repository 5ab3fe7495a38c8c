public import ArgumentParser
public import Foundation
import IsleStore
import IsleDelivery

/// Where the commands write, and what environment they read: real stdout/stderr and the process
/// environment by default, captured in tests.
public struct CLIContext: Sendable {
    public var out: @Sendable (String) -> Void
    public var err: @Sendable (String) -> Void
    public var environment: [String: String]
    public var now: @Sendable () -> Date

    public init(out: @escaping @Sendable (String) -> Void, err: @escaping @Sendable (String) -> Void, environment: [String: String], now: @escaping @Sendable () -> Date = { Date() }) {
        self.out = out
        self.err = err
        self.environment = environment
        self.now = now
    }

    public static let standard = CLIContext(
        out: { text in FileHandle.standardOutput.write(Data((text + "\n").utf8)) },
        err: { text in FileHandle.standardError.write(Data((text + "\n").utf8)) },
        environment: ProcessInfo.processInfo.environment
    )

    @TaskLocal public static var current: CLIContext = .standard
}

func say(_ text: String) { CLIContext.current.out(text) }
func warn(_ text: String) { CLIContext.current.err(text) }

/// `isle`'s exit statuses (sysexits.h; README, "Exit statuses"): a script can tell a mistake in
/// the command from a setup to fix, a network to wait for, and a push APNs refused.
public enum ExitStatus {
    public static let ok: Int32 = 0
    /// Something else failed (see the message).
    public static let failure: Int32 = 1
    /// The command is wrong: an unknown or missing option, a value that is not what it must be.
    public static let usage: Int32 = 64
    /// APNs (or the validator before it) refused the push: fix the request or the token.
    public static let refused: Int32 = 65
    /// Nothing answered, or not in time: a server or the network is down; try again later.
    public static let unavailable: Int32 = 69
    /// The setup is wrong: a key, a certificate, a database, a port in use.
    public static let configuration: Int32 = 78
}

/// A failure the user can act on: printed as one line, with an exit status that says which kind.
struct CLIError: Error, CustomStringConvertible {
    let message: String
    var exitCode: Int32 = ExitStatus.usage
    init(_ message: String, exitCode: Int32 = ExitStatus.usage) {
        self.message = message
        self.exitCode = exitCode
    }
    static func configuration(_ message: String) -> CLIError { CLIError(message, exitCode: ExitStatus.configuration) }
    var description: String { message }
}

/// The `isle` command.
public struct IsleCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "isle",
        abstract: "Live Activities and widgets over APNs: push, validate, and inspect.",
        discussion: "Credentials and target can also come from the environment: ISLE_APNS_KEY (path to the .p8), ISLE_APNS_KEY_ID, ISLE_APNS_TEAM_ID, ISLE_BUNDLE_ID, ISLE_APNS_ENV (sandbox or production), ISLE_APNS_URL and ISLE_APNS_CA_CERT (a custom APNs such as Isle's simulator).",
        version: IsleVersion.text,
        subcommands: [PushCommand.self, ValidateCommand.self, OpenAPICommand.self, JWTCommand.self, ChannelCommand.self, SimCommand.self, DemoCommand.self, ServeCommand.self, AppCommand.self, KeyCommand.self, MasterKeyCommand.self, DbCommand.self, TicketCommand.self]
    )

    public init() {}
}

/// Runs the command line and returns the exit status. Errors are one line on stderr: no usage
/// dump, no stack trace.
public enum IsleCLI {
    public static func run(_ arguments: [String]) async -> Int32 {
        do {
            var command = try IsleCommand.parseAsRoot(arguments)
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
            return 0
        } catch let error as CLIError {
            warn("isle: \(error.message)")
            return error.exitCode
        } catch let error as StoreError {
            warn("isle: database: \(error.message)")
            return error.code == .unavailable ? ExitStatus.unavailable : ExitStatus.configuration
        } catch let code as ExitCode {
            // The command already said why.
            return code.rawValue
        } catch {
            let code = IsleCommand.exitCode(for: error)
            if code == .success {
                say(IsleCommand.fullMessage(for: error))
                return 0
            }
            var message = IsleCommand.message(for: error).split(separator: "\n").first.map(String.init) ?? "\(error)"
            let missing = missingOptions(arguments, first: message)
            if missing.count > 1 {
                message = "Missing expected arguments: " + missing.map { "'\($0)'" }.joined(separator: ", ")
            }
            if code == .validationFailure {
                let path = arguments.prefix { !$0.hasPrefix("-") }.prefix(2).joined(separator: " ")
                message += " (see 'isle \(path.isEmpty ? "" : path + " ")--help')"
            }
            warn("isle: \(message)")
            return code.rawValue
        }
    }

    /// Every required option `arguments` lack, not only the first the parser names: each is given a
    /// stand-in value and the command parsed again, until the parser asks for nothing more.
    static func missingOptions(_ arguments: [String], first message: String) -> [String] {
        var missing: [String] = []
        var arguments = arguments
        var message = message
        while missing.count < 32, let named = missingOption(in: message), !missing.contains(named.shown) {
            missing.append(named.shown)
            // Before a "--": after it, everything is a positional argument.
            arguments.insert(contentsOf: [named.flag, "0"], at: arguments.firstIndex(of: "--") ?? arguments.endIndex)
            do {
                _ = try IsleCommand.parseAsRoot(arguments)
                break
            } catch {
                message = IsleCommand.message(for: error)
            }
        }
        return missing
    }

    /// The option in ArgumentParser's "Missing expected argument '--name <value>'".
    static func missingOption(in message: String) -> (flag: String, shown: String)? {
        let prefix = "Missing expected argument '"
        guard message.hasPrefix(prefix), let end = message.dropFirst(prefix.count).firstIndex(of: "'") else { return nil }
        let shown = String(message[message.index(message.startIndex, offsetBy: prefix.count)..<end])
        guard shown.hasPrefix("--"), let flag = shown.split(separator: " ").first else { return nil }
        return (String(flag), shown)
    }

    /// Runs with a captured context; returns (status, stdout, stderr). For tests.
    public static func capture(_ arguments: [String], environment: [String: String] = [:], now: Date? = nil) async -> (status: Int32, out: String, err: String) {
        let out = Lines()
        let err = Lines()
        let context = CLIContext(out: { out.append($0) }, err: { err.append($0) }, environment: environment, now: { now ?? Date() })
        let status = await CLIContext.$current.withValue(context) { await run(arguments) }
        return (status, out.text, err.text)
    }
}

import Synchronization

final class Lines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ s: String) { lines.withLock { $0.append(s) } }
    var text: String { lines.withLock { $0.joined(separator: "\n") } }
}
