import Foundation
@testable import IsleCommandLine
import IsleServer
import IsleStore
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
        return try CLIContext.$current.withValue(context) { try command.settings().0 }
    }

    static func privateFile(_ text: String, mode: Int = 0o600) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-\(UUID().uuidString)").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
        return path
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
