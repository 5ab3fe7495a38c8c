import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore
import IsleDelivery
import IsleStore

/// `isle app environment-key`: a provider key limited to one APNs environment (Apple lets a key be
/// scoped to the sandbox or to production). Pushes to that environment are signed with it; the
/// other environment keeps the app's own key (`isle app add`).
struct EnvironmentKeyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "environment-key",
        abstract: "Give one APNs environment a key of its own (an environment-scoped key), or take it away.",
        discussion: "APNs refuses a key scoped to one environment on the other (403 BadEnvironmentKeyIdInToken). With a key per environment, each push is signed with its environment's key: isle app environment-key set --environment sandbox --key AuthKey_SBX.p8 --key-id … --team-id …",
        subcommands: [Set.self, Remove.self])

    static func environment(_ text: String) throws(CLIError) -> PushEnvironment {
        guard let e = PushEnvironment(reported: text) else { throw CLIError("--environment: \(text) is not an APNs environment; use sandbox or production") }
        return e
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Sign the app's pushes to this environment with this key (replacing its earlier key there).")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: "sandbox or production.") var environment: String
        @Option(help: ArgumentHelp("The .p8 token-signing key scoped to that environment.", valueName: "file")) var key: String
        @Option(name: .customLong("key-id")) var keyID: String
        @Option(name: .customLong("team-id")) var teamID: String

        func run() async throws {
            let environment = try EnvironmentKeyCommand.environment(self.environment)
            do { _ = try APNsCredentials(keyID: keyID, teamID: teamID, keyFile: key) } catch { throw CLIError("--key: \(error.reason)") }
            let pem = String(decoding: try Inputs.read(key, flag: "--key"), as: UTF8.self)
            guard let masterKey = try database.masterKey() else {
                throw CLIError("app environment-key: the .p8 key is stored encrypted and needs a master key. \(DatabaseOption.masterKeyHelp)")
            }
            let (bundleID, keyID, teamID, shown) = (bundleID, keyID, teamID, database.shownPath)
            try await database.withStore { store in
                try await ServeCommand.checkKeys(store: store, masterKey: masterKey, path: shown)
                var app = try await TicketKeyCommand.app(store, bundleID, shown)
                app.environmentKeys.removeAll { $0.environment == environment }
                app.environmentKeys.append(EnvironmentKey(environment: environment, keyID: keyID, teamID: teamID, keyPEM: masterKey.seal(pem, bundleID: bundleID),
                                                          createdAt: CLIContext.current.now()))
                try await store.upsertApp(app)
            }
            say("app \(bundleID) in \(shown): pushes to \(environment.rawValue) are signed with key \(keyID) (team \(teamID)); a running isle serve uses it from its next push")
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Sign the app's pushes to this environment with the app's own key again.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: "sandbox or production.") var environment: String

        func run() async throws {
            let environment = try EnvironmentKeyCommand.environment(self.environment)
            let (bundleID, shown) = (bundleID, database.shownPath)
            let removed = try await database.withStore { store -> Bool in
                var app = try await TicketKeyCommand.app(store, bundleID, shown)
                let before = app.environmentKeys.count
                app.environmentKeys.removeAll { $0.environment == environment }
                guard app.environmentKeys.count < before else { return false }
                try await store.upsertApp(app)
                return true
            }
            guard removed else { throw CLIError("--environment: app \(bundleID) has no key of its own for \(environment.rawValue)") }
            say("app \(bundleID) in \(shown): pushes to \(environment.rawValue) are signed with the app's own key again")
        }
    }
}
