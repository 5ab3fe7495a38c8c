import Foundation
@testable import IsleCommandLine
import IsleServer
@testable import IsleStore
import IsleDelivery
import Logging
import Testing

/// `isle serve`'s bounds and secrets (docs/security.md): every limit, quota, timeout and retention can be
/// set by flag, environment or config file; bad values are all reported at once; a password never
/// goes on the command line; config and password files others can read are refused.
@Suite("isle serve: bounds and secrets settings")
struct ServeSettingsTests {
    static func settings(_ arguments: [String], environment: [String: String] = [:]) throws -> ServerConfiguration {
        let command = try ServeCommand.parse(arguments)
        let context = CLIContext(out: { _ in }, err: { _ in }, environment: environment)
        return try CLIContext.$current.withValue(context) { try command.settings().configuration }
    }

    static func privateFile(_ text: String, mode: Int = 0o600) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-\(UUID().uuidString)").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
        return path
    }

    @Test("every flag of isle serve has a config-file key, under the flag's own name or in camelCase; docs/server.md lists each; masterKeyFile works from the file")
    func everyFlagInTheFile() throws {
        let help = ServeCommand.helpMessage(columns: 400)
        var flags = Set<String>()
        for match in help.matches(of: /--([a-z][a-z0-9-]+)/) { flags.insert(String(match.1)) }
        // Not settings: the file itself, --check-config, help; --sandbox/--production are apnsEnvironment;
        // --single-host is isle sim's, named in a help text.
        let notInFile: Set<String> = ["config", "check-config", "help", "sandbox", "production", "single-host"]
        let inFile = Set(ServeCommand.configNames.map(\.flag))
        #expect(flags.subtracting(notInFile).subtracting(inFile).isEmpty, "flags without a config key: \(flags.subtracting(notInFile).subtracting(inFile).sorted())")
        #expect(inFile.subtracting(flags).subtracting(["apns-environment"]).isEmpty, "config keys without a flag: \(inFile.subtracting(flags).sorted())")
        let docs = try String(contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/server.md").path, encoding: .utf8)
        for (key, _) in ServeCommand.configNames { #expect(docs.contains("`\(key)`"), "docs/server.md does not list \(key)") }

        let master = MasterKey.generate()
        let keyFile = try Self.privateFile(master.base64)
        // The flag's name and camelCase both work; the master key from the file.
        let file = try Self.privateFile(#"{"masterKeyFile": "\#(keyFile)", "idle-timeout": 5, "apnsCACert": null, "access-log": true}"#.replacingOccurrences(of: #", "apnsCACert": null"#, with: ""))
        let c = try Self.settings(["--config", file])
        #expect(c.masterKey?.base64 == master.base64 && c.timeouts.idle == .seconds(5) && c.accessLog.on)
        // One setting under both names is refused; an unknown one is named.
        let twice = try Self.privateFile(#"{"idleTimeout": 5, "idle-timeout": 6}"#)
        #expect(throws: CLIError.self) { try Self.settings(["--config", twice]) }
        let unknown = try Self.privateFile(#"{"idleTimeot": 5}"#)
        do { _ = try Self.settings(["--config", unknown]); Issue.record("an unknown key was accepted") } catch {
            #expect("\(error)".contains("idleTimeot") && "\(error)".contains("masterKeyFile"))
        }
        // A bad log level and format are reported together.
        do { _ = try Self.settings(["--log-level", "loud", "--log-format", "xml"]); Issue.record("accepted") } catch {
            #expect("\(error)".contains("log-level: loud") && "\(error)".contains("log-format: \"xml\""))
        }
    }

    @Test("isle serve --check-config: ok for a good set-up; each problem named (a bad value, a newer database, a master key that does not open the apps' keys), exit 78, nothing served or changed")
    func checkConfig() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-check-\(UUID().uuidString).sqlite").path
        let master = MasterKey.generate()
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM123456", keyID: "KEY1234567", keyPEM: master.seal("-----BEGIN PRIVATE KEY-----", bundleID: "com.example.pizza"), createdAt: Date()))
        let good = await IsleCLI.capture(["serve", "--check-config", "--database", path], environment: ["ISLE_MASTER_KEY": master.base64])
        #expect(good.status == 0 && good.out.contains("configuration ok"), "\(good)")
        let wrongKey = await IsleCLI.capture(["serve", "--check-config", "--database", path], environment: ["ISLE_MASTER_KEY": MasterKey.generate().base64])
        #expect(wrongKey.status == 78 && wrongKey.err.contains("does not open com.example.pizza"), "\(wrongKey)")
        let bad = await IsleCLI.capture(["serve", "--check-config", "--database", path, "--idle-timeout", "0"], environment: ["ISLE_MASTER_KEY": master.base64])
        #expect(bad.status != 0 && bad.err.contains("idle-timeout"), "\(bad)")
        try await store.pool.write { db in try db.execute(sql: "INSERT INTO isle_migrations (version, applied_at) VALUES (9999, 0)") }
        let newer = await IsleCLI.capture(["serve", "--check-config", "--database", path], environment: ["ISLE_MASTER_KEY": master.base64])
        #expect(newer.status == 78 && newer.err.contains("written by a newer Isle"), "\(newer)")
        // Every command that opens the database refuses it too, and changes nothing.
        let list = await IsleCLI.capture(["app", "list", "--database", path], environment: ["ISLE_MASTER_KEY": master.base64])
        #expect(list.status == 78 && list.err.contains("newer Isle"), "\(list.status) \(list.err)")
        #expect(try await store.schemaCheck().current == 9999)
    }

    @Test("defaults as docs/security.md states them")
    func defaults() throws {
        let c = try Self.settings([])
        #expect(c.rateLimits[.backend] == RateLimit(perSecond: 10_000, burst: 20_000) && c.rateLimits[.device] == RateLimit(perSecond: 1_000, burst: 2_000))
        #expect(c.deviceInstallationLimit == RateLimit(perSecond: 5, burst: 60) && c.deviceAddressLimit == RateLimit(perSecond: 100, burst: 1_000))
        #expect(c.authFailureLimit == RateLimit(perSecond: 0.5, burst: 20))
        #expect(c.quotas.liveActivitiesPerInstallation == 20 && c.quotas.installationsPerUser == 50)
        #expect(c.timeouts.header == .seconds(10) && c.timeouts.body == .seconds(30) && c.timeouts.idle == .seconds(60))
        #expect(c.retention.endedActivities == 30 * 86_400 && c.retention.staleInstallations == 180 * 86_400)
        #expect(c.retention.unusedActivities == 86_400 && c.retention.unusedInstallations == 7 * 86_400)
        #expect(c.quotas.newInstallationsPerAddressPerHour == 200 && c.quotas.newActivitiesPerAddressPerHour == 1_000 && c.quotas.connectionsPerAddress == 256)
        #expect(!c.webhooks.allowPrivate && c.webhooks.allowedHosts == nil)
        #expect(!c.secureCookies)
    }

    @Test("flags, then environment, then the config file; later ones win")
    func everySetting() throws {
        let c = try Self.settings(["--backend-rate", "50/s,burst=100", "--device-rate", "off", "--installation-rate", "2/s", "--address-rate", "10/s,burst=30",
                                   "--auth-failure-rate", "0.2/s,burst=5", "--max-live-activities-per-installation", "3", "--max-installations-per-user", "4",
                                   "--header-timeout", "2.5", "--body-timeout", "7", "--idle-timeout", "15", "--secure-cookies",
                                   "--keep-ended-activities", "7", "--keep-stale-installations", "90", "--keep-unused-activities", "0.5", "--keep-unused-installations", "3",
                                   "--max-new-installations-per-address", "0", "--max-new-activities-per-address", "9", "--max-connections-per-address", "1000", "--webhook-allow-private"])
        #expect(c.retention.unusedActivities == 43_200 && c.retention.unusedInstallations == 3 * 86_400 && c.webhooks.allowPrivate)
        #expect(c.quotas.newInstallationsPerAddressPerHour == 0 && c.quotas.newActivitiesPerAddressPerHour == 9 && c.quotas.connectionsPerAddress == 1_000)
        #expect(c.rateLimits[.backend] == RateLimit(perSecond: 50, burst: 100) && c.rateLimits[.device] == .off)
        #expect(c.deviceInstallationLimit == RateLimit(perSecond: 2, burst: 2) && c.deviceAddressLimit == RateLimit(perSecond: 10, burst: 30))
        #expect(c.authFailureLimit == RateLimit(perSecond: 0.2, burst: 5))
        #expect(c.quotas.liveActivitiesPerInstallation == 3 && c.quotas.installationsPerUser == 4)
        #expect(c.timeouts.header == .milliseconds(2_500) && c.timeouts.body == .seconds(7) && c.timeouts.idle == .seconds(15))
        #expect(c.secureCookies && c.retention.endedActivities == 7 * 86_400 && c.retention.staleInstallations == 90 * 86_400)

        let file = try Self.privateFile(#"{"installationRate": "1/s,burst=9", "maxInstallationsPerUser": 8, "idleTimeout": 5, "secureCookies": true, "keepEndedActivities": 2}"#)
        let fromFile = try Self.settings(["--config", file])
        #expect(fromFile.deviceInstallationLimit == RateLimit(perSecond: 1, burst: 9) && fromFile.quotas.installationsPerUser == 8)
        #expect(fromFile.timeouts.idle == .seconds(5) && fromFile.secureCookies && fromFile.retention.endedActivities == 2 * 86_400)
        let overridden = try Self.settings(["--config", file, "--max-installations-per-user", "11"], environment: ["ISLE_INSTALLATION_RATE": "3/s", "ISLE_SECURE_COOKIES": "false"])
        #expect(overridden.quotas.installationsPerUser == 11 && overridden.deviceInstallationLimit == RateLimit(perSecond: 3, burst: 3) && !overridden.secureCookies)
    }

    @Test("every bad setting is named at once, with what is expected")
    func badSettings() async throws {
        let r = await IsleCLI.capture(["serve", "--port", "0", "--backend-rate", "fast", "--installation-rate", "5/m", "--header-timeout", "0",
                                       "--max-installations-per-user", "0", "--keep-ended-activities", "0.5"])
        #expect(r.status != 0)
        for says in ["backend-rate: \"fast\" is not a rate; write 10/s, 10/s,burst=60 or off", "installation-rate: \"5/m\"", "header-timeout: 0",
                     "max-installations-per-user: 0 must be a whole number", "keep-ended-activities: 0.5 must be days from 1 to 3650"] {
            #expect(r.err.contains(says), "\(says) in: \(r.err)")
        }
        let env = await IsleCLI.capture(["serve", "--port", "0"], environment: ["ISLE_SECURE_COOKIES": "maybe"])
        #expect(env.status != 0 && env.err.contains("secure-cookies: \"maybe\" is not true or false"), "\(env.err)")
        let unknown = try Self.privateFile(#"{"colour": "blue", "shape": 1}"#)
        let u = await IsleCLI.capture(["serve", "--config", unknown])
        #expect(u.status != 0 && u.err.contains("unknown settings \"colour\", \"shape\""), "\(u.err)")
    }

    @Test("no password on the command line; config and password files others can read are refused")
    func secrets() async throws {
        for arguments in [["serve", "--port", "0", "--database", "postgres://isle:hunter2@127.0.0.1:1/isle"],
                          ["key", "create", "--bundle-id", "a.b", "--scope", "backend", "--database", "postgres://isle:hunter2@127.0.0.1:1/isle"],
                          ["db", "copy", "--from", "x.sqlite", "--to", "postgres://isle:hunter2@127.0.0.1:1/isle"]] {
            let r = await IsleCLI.capture(arguments)
            #expect(r.status != 0 && r.err.contains("holds a password") && r.err.contains("PGPASSWORD") && !r.err.contains("hunter2"), "\(arguments[0]): \(r.err)")
        }
        let open = try Self.privateFile(#"{"port": 0}"#, mode: 0o644)
        let r = await IsleCLI.capture(["serve", "--config", open])
        #expect(r.status != 0 && r.err.contains("readable by others (mode 644)") && r.err.contains("chmod 600 \(open)"), "\(r.err)")
        let groupReadable = try Self.privateFile(#"{"port": 0}"#, mode: 0o640)
        #expect(await IsleCLI.capture(["serve", "--config", groupReadable]).err.contains("readable by others (mode 640)"))
        let password = try Self.privateFile("hunter2\n", mode: 0o604)
        let p = await IsleCLI.capture(["serve", "--port", "0", "--database", "postgres://isle@127.0.0.1:1/isle?passwordfile=\(password)"])
        #expect(p.status != 0 && p.err.contains("password file \(password) is readable by others") && !p.err.contains("hunter2"), "\(p.err)")
    }
}
