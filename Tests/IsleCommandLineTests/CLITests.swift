import Foundation
@testable import IsleCommandLine
import IsleCore
import IsleHTTP2Server
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// A sink, a key file and a CA file, and the flags that point `isle` at them.
struct CLIHarness {
    let sink: RecordingAPNsServer
    let key: TestProviderKey
    let keyPath: String
    let caPath: String

    var flags: [String] {
        ["--key", keyPath, "--key-id", key.keyID, "--team-id", key.teamID, "--bundle-id", "com.example.pizza", "--url", sink.baseURL, "--ca-cert", caPath]
    }

    static func with<R: Sendable>(_ body: (CLIHarness) async throws -> R) async throws -> R {
        try await RecordingAPNsServer.withServer { sink in
            let key = TestProviderKey()
            let keyPath = try key.writeP8()
            let caPath = (keyPath as NSString).deletingLastPathComponent + "/ca.pem"
            try sink.caCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
            return try await body(CLIHarness(sink: sink, key: key, keyPath: keyPath, caPath: caPath))
        }
    }
}

let token = String(repeating: "5f", count: 32)
let now = Date(timeIntervalSince1970: 1_767_225_600)

@Suite("isle CLI")
struct CLITests {
    @Test("isle sim --dir keeps its CA across restarts (a server given its ca.pem keeps trusting it; the CA key is owner-only); a missing file makes a new one")
    func simFolderKeepsItsCertificateAuthority() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("isle-simdir-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        // An older Isle kept the server certificate itself: it goes.
        try Data("old".utf8).write(to: URL(fileURLWithPath: folder + "/server-cert.pem"))
        let first = try SimCommand.keptCertificateAuthority(in: folder)
        let ca = try String(contentsOfFile: folder + "/ca.pem", encoding: .utf8)
        #expect(!first.again && ca.contains("BEGIN CERTIFICATE") && ca.trimmingCharacters(in: .whitespacesAndNewlines) == first.ca.certificatePEM.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(!FileManager.default.fileExists(atPath: folder + "/server-cert.pem"))
        let mode = (try FileManager.default.attributesOfItem(atPath: folder + "/ca-key.pem")[.posixPermissions] as? Int) ?? 0
        #expect(mode & 0o077 == 0, "the CA key is readable by others: \(String(mode, radix: 8))")
        let second = try SimCommand.keptCertificateAuthority(in: folder)
        #expect(second.again && second.ca.certificatePEM == ca)
        // The kept CA issues: a certificate for the names asked for at this start.
        let leaf = try second.ca.issueServerCertificate(dnsNames: ["localhost", "api.sandbox.push.apple.com"])
        #expect(leaf.certificatePEM.contains("BEGIN CERTIFICATE"))
        try FileManager.default.removeItem(atPath: folder + "/ca-key.pem")
        let third = try SimCommand.keptCertificateAuthority(in: folder)
        let caAgain = try String(contentsOfFile: folder + "/ca.pem", encoding: .utf8)
        #expect(!third.again && caAgain != ca)
    }

    @Test("push update sends the push and prints APNs' answer")
    func pushUpdate() async throws {
        try await CLIHarness.with { h in
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", #"{"driverName":"Anne"}"#, "--priority", "10",
                                           "--alert-title", "Delivery Update", "--alert-body", "Soon", "--stale-date", "+30m"] + h.flags, now: now)
            #expect(r.status == 0, "\(r.err)")
            #expect(r.out.hasPrefix("200 OK  apns-id "))
            let req = try #require(h.sink.requests.first)
            #expect(req.path == "/3/device/\(token)")
            #expect(req.value("apns-priority") == "10")
            #expect(req.bodyText == #"{"aps":{"timestamp":1767225600,"event":"update","content-state":{"driverName":"Anne"},"alert":{"title":"Delivery Update","body":"Soon"},"stale-date":1767227400}}"#)
        }
    }

    @Test("push start with localized alert, attributes from a file, schema default type, input-push-token")
    func pushStart() async throws {
        try await CLIHarness.with { h in
            let dir = (h.keyPath as NSString).deletingLastPathComponent
            try #"{"hero":"Power Panda"}"#.write(toFile: dir + "/attrs.json", atomically: true, encoding: .utf8)
            let schemaPath = Fixtures.directory.appendingPathComponent("wwdc23/AdventureAttributes.schema.json").path
            let r = await IsleCLI.capture(["push", "start", "--token", token, "--attributes", "@" + dir + "/attrs.json", "--schema", schemaPath,
                                           "--content-state", #"{"currentHealthLevel":1,"eventDescription":"Go"}"#,
                                           "--alert-title-loc-key", "%@ starts", "--alert-title-loc-args", "Power Panda", "--alert-body", "Adventure begins",
                                           "--sound", "chime.aiff", "--input-push-token"] + h.flags, now: now)
            #expect(r.status == 0, "\(r.err)")
            let body = try JSONParser.parse(try #require(h.sink.requests.first).body)
            #expect(body["aps"]?["attributes-type"] == "AdventureAttributes")
            #expect(body["aps"]?["attributes"] == ["hero": "Power Panda"])
            #expect(body["aps"]?["alert"]?["title"] == ["loc-key": "%@ starts", "loc-args": ["Power Panda"]])
            #expect(body["aps"]?["alert"]?["sound"] == "chime.aiff")
            #expect(body["aps"]?["input-push-token"] == 1)
        }
    }

    @Test("push end and widgets")
    func endAndWidgets() async throws {
        try await CLIHarness.with { h in
            let e = await IsleCLI.capture(["push", "end", "--token", token, "--dismissal-date", "+30m"] + h.flags, now: now)
            #expect(e.status == 0, "\(e.err)")
            #expect(h.sink.requests[0].bodyText == #"{"aps":{"timestamp":1767225600,"event":"end","dismissal-date":1767227400}}"#)
            let w = await IsleCLI.capture(["push", "widgets", "--token", token] + h.flags, now: now)
            #expect(w.status == 0, "\(w.err)")
            #expect(h.sink.requests[1].value("apns-topic") == "com.example.pizza.push-type.widgets")
        }
    }

    @Test("--dry-run prints curl with the JWT redacted, and sends nothing")
    func dryRun() async throws {
        try await CLIHarness.with { h in
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}", "--dry-run"] + h.flags, now: now)
            #expect(r.status == 0, "\(r.err)")
            #expect(r.out.contains("curl --http2"))
            #expect(r.out.contains("--header 'apns-topic: com.example.pizza.push-type.liveactivity'"))
            #expect(r.out.contains("--cacert '\(h.caPath)'"))
            #expect(r.out.contains("<redacted"))
            #expect(!r.out.contains("eyJ"))
            #expect(r.out.contains("'\(h.sink.baseURL)/3/device/\(token)'"))
            let s = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}", "--dry-run", "--show-secrets"] + h.flags, now: now)
            #expect(s.out.contains("authorization: bearer eyJ"))
            #expect(h.sink.requestCount == 0)
        }
    }

    @Test("credentials and target from environment variables")
    func environment() async throws {
        try await CLIHarness.with { h in
            let env = ["ISLE_APNS_KEY": h.keyPath, "ISLE_APNS_KEY_ID": h.key.keyID, "ISLE_APNS_TEAM_ID": h.key.teamID,
                       "ISLE_BUNDLE_ID": "com.example.pizza", "ISLE_APNS_URL": h.sink.baseURL, "ISLE_APNS_CA_CERT": h.caPath]
            let r = await IsleCLI.capture(["push", "widgets", "--token", token], environment: env, now: now)
            #expect(r.status == 0, "\(r.err)")
            #expect(h.sink.requestCount == 1)
        }
    }

    @Test("APNs errors: meaning and what to do, exit 65 (refused)")
    func apnsError() async throws {
        try await CLIHarness.with { h in
            h.sink.enqueueError(status: 410, reason: "Unregistered", timestamp: now)
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}"] + h.flags, now: now)
            #expect(r.status == ExitStatus.refused)
            #expect(r.err.contains("410 Unregistered"))
            #expect(r.err.contains("Stop sending to this token"))
            #expect(r.err.contains("2026-01-01T00:00:00Z"))
            #expect(r.err.split(separator: "\n").count == 1)
        }
    }

    struct BadInput: Sendable, CustomTestStringConvertible {
        let args: [String]
        let mentions: String
        var withFlags = true
        var testDescription: String { args.joined(separator: " ") }
    }

    static let badInputs: [BadInput] = [
        BadInput(args: ["push", "update", "--content-state", "{}"], mentions: "--token", withFlags: false),
        BadInput(args: ["push", "update", "--token", "xyz!", "--content-state", "{}"], mentions: "--token: the device token must be hexadecimal"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{oops}"], mentions: "--content-state: the value is not JSON"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "@/nonexistent.json"], mentions: "no such file"),
        BadInput(args: ["push", "update", "--token", token], mentions: "missing --content-state"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{}", "--priority", "7"], mentions: "not a priority"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{}", "--stale-date", "tomorrow"], mentions: "--stale-date"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{}", "--alert-title", "only"], mentions: "needs a body"),
        BadInput(args: ["push", "start", "--token", token, "--content-state", "{}", "--attributes", "{}", "--attributes-type", "P"], mentions: "needs an alert"),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{}", "--key", "/nonexistent.p8", "--key-id", "ABC123DEFG", "--team-id", "DEF123GHIJ", "--bundle-id", "a"], mentions: "--key: cannot read the key file", withFlags: false),
        BadInput(args: ["push", "update", "--token", token, "--content-state", "{}", "--bundle-id", "a"], mentions: "missing --key", withFlags: false),
        BadInput(args: ["push", "update", "--token", token, "--content-state", #"{"currentHealthLevel":"x"}"#, "--schema", "SCHEMA"], mentions: "currentHealthLevel"),
        BadInput(args: ["channel", "read", "--channel", "!!"], mentions: "not a base64 channel id"),
        BadInput(args: ["channel", "create", "--storage-policy", "3"], mentions: "--storage-policy"),
        BadInput(args: ["channel", "send", "--channel", "YQ==", "--event", "start"], mentions: "cannot start"),
        BadInput(args: ["validate", "x.json", "--push-type", "liveActivity"], mentions: "not an APNs push type", withFlags: false),
        BadInput(args: ["nonsense"], mentions: "Unexpected argument", withFlags: false),
    ]

    @Test("bad input: one clear line on stderr, non-zero exit, nothing sent", arguments: badInputs)
    func badInput(_ c: BadInput) async throws {
        try await CLIHarness.with { h in
            let schemaPath = Fixtures.directory.appendingPathComponent("wwdc23/AdventureAttributes.schema.json").path
            let args = c.args.map { $0 == "SCHEMA" ? schemaPath : $0 } + (c.withFlags ? h.flags : [])
            let r = await IsleCLI.capture(args, now: now)
            #expect(r.status != 0)
            #expect(r.err.contains(c.mentions), "\(r.err)")
            #expect(r.err.hasPrefix("isle: "), "\(r.err)")
            #expect(r.err.split(separator: "\n").count == 1, "\(r.err)")
            #expect(h.sink.requestCount == 0)
        }
    }

    @Test("jwt prints a token that jwt inspect accepts and verifies")
    func jwt() async throws {
        try await CLIHarness.with { h in
            let made = await IsleCLI.capture(["jwt", "--key", h.keyPath, "--key-id", h.key.keyID, "--team-id", h.key.teamID], now: now)
            #expect(made.status == 0, "\(made.err)")
            let inspected = await IsleCLI.capture(["jwt", "inspect", made.out, "--key", h.keyPath], now: now.addingTimeInterval(120))
            #expect(inspected.status == 0, "\(inspected.out)")
            #expect(inspected.out.contains("signature: valid"))
            #expect(inspected.out.contains(#"claims: {"iss":"DEF123GHIJ","iat":1767225600}"#))
            let stale = await IsleCLI.capture(["jwt", "inspect", made.out], now: now.addingTimeInterval(7200))
            #expect(stale.status == 1)
            #expect(stale.out.contains("ExpiredProviderToken"))
        }
    }

    @Test("channel create, list, read, delete, send")
    func channels() async throws {
        try await CLIHarness.with { h in
            h.sink.enqueue(HTTP2ServerResponse(status: 201, headers: [("apns-channel-id", "Y2hhbm5lbDE=")]))
            let c = await IsleCLI.capture(["channel", "create", "--storage-policy", "1"] + h.flags, now: now)
            #expect(c.status == 0, "\(c.err)")
            #expect(c.out == "Y2hhbm5lbDE=")
            h.sink.enqueue(HTTP2ServerResponse(status: 200, body: Array(#"{"channels":["Y2hhbm5lbDE="]}"#.utf8)))
            #expect(await IsleCLI.capture(["channel", "list"] + h.flags, now: now).out == "Y2hhbm5lbDE=")
            h.sink.enqueue(HTTP2ServerResponse(status: 200, body: Array(#"{"message-storage-policy":1,"push-type":"LiveActivity"}"#.utf8)))
            #expect(await IsleCLI.capture(["channel", "read", "--channel", "Y2hhbm5lbDE="] + h.flags, now: now).out.contains("most recent message stored"))
            let s = await IsleCLI.capture(["channel", "send", "--channel", "Y2hhbm5lbDE=", "--content-state", #"{"home":2}"#] + h.flags, now: now)
            #expect(s.status == 0, "\(s.err)")
            #expect(h.sink.requests[3].path == "/4/broadcasts/apps/com.example.pizza")
            h.sink.enqueue(HTTP2ServerResponse(status: 204))
            #expect(await IsleCLI.capture(["channel", "delete", "--channel", "Y2hhbm5lbDE="] + h.flags, now: now).status == 0)
            // A No-Message-Stored channel with a storing expiration is refused locally.
            let bad = await IsleCLI.capture(["channel", "send", "--channel", "Y2hhbm5lbDE=", "--content-state", "{}", "--storage-policy", "0", "--expiration", "+1h"] + h.flags, now: now)
            #expect(bad.status == ExitStatus.refused && bad.err.contains("BadExpirationDate"))
        }
    }

    @Test("validate: --json report, exit status by errors")
    func validateJSON() async throws {
        let path = Fixtures.directory.appendingPathComponent("wwdc23/update-alert.json").path
        let r = await IsleCLI.capture(["validate", path, "--json", "--priority", "10"], now: Date(timeIntervalSince1970: 1_685_952_000))
        #expect(r.status == 0)
        let json = try JSONParser.parse(r.out)
        #expect(json["valid"] == true)
        #expect(json["issues"]?.arrayValue?.isEmpty == true)
        let bad = await IsleCLI.capture(["validate", path, "--json", "--broadcast", "--push-type", "widgets"])
        #expect(bad.status != 0)
    }
}

@Suite("isle sim --key")
struct SimKeyTests {
    @Test("a provider key that is not a P-256 PEM is refused before anything starts, naming the flag")
    func badKey() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-not-a-key-\(UUID().uuidString).p8").path
        try Data("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n".utf8).write(to: URL(fileURLWithPath: path))
        let r = await IsleCLI.capture(["sim", "--key", path, "--control-port", "0"])
        #expect(r.status != 0 && r.err.contains("--key: \(path) is not a P-256 private key"), "\(r.err)")
        let missing = await IsleCLI.capture(["sim", "--key", path + ".missing", "--control-port", "0"])
        #expect(missing.status != 0 && missing.err.contains("--key"), "\(missing.err)")
    }
}

@Suite("isle serve: one process per SQLite file")
struct ServeExclusiveTests {
    @Test("a second isle serve on a held database exits at once with one line saying why")
    func secondServeExits() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-serve-\(UUID().uuidString).sqlite").path
        let hold = try SQLiteStore(path: path).holdForServing()  // as a running `isle serve` does
        defer { hold.release() }
        let r = await IsleCLI.capture(["serve", "--database", path, "--port", "0"])
        #expect(r.status != 0)
        let lines = r.err.split(separator: "\n")
        #expect(lines.count == 1 && lines.first?.contains("another isle serve is already using \(path)") == true, "\(r.err)")
    }

    @Test("APNs targets and the default environment are checked before anything opens, naming the setting")
    func environmentSettings() async {
        let http = await IsleCLI.capture(["serve", "--port", "0", "--apns-production-url", "http://127.0.0.1:1"])
        #expect(http.status != 0 && http.err.contains("apns-production-url: http://127.0.0.1:1 must be an https URL"), "\(http.err)")
        let env = await IsleCLI.capture(["serve", "--port", "0"], environment: ["ISLE_APNS_ENV": "staging"])
        #expect(env.status != 0 && env.err.contains("\"staging\" is not sandbox or production"), "\(env.err)")
        let alone = await IsleCLI.capture(["serve", "--port", "0", "--apns-broadcast-url", "https://127.0.0.1:1"])
        #expect(alone.status != 0 && alone.err.contains("go with --apns-url"), "\(alone.err)")
        let both = await IsleCLI.capture(["serve", "--port", "0", "--sandbox", "--production"])
        #expect(both.status != 0 && both.err.contains("exclude each other"), "\(both.err)")
    }

    @Test("an empty ISLE_DATABASE is refused, not a temporary database")
    func emptyDatabase() async {
        let r = await IsleCLI.capture(["serve", "--port", "0"], environment: ["ISLE_DATABASE": ""])
        #expect(r.status != 0)
        #expect(r.err.contains("the database path is empty"), "\(r.err)")
    }
}

/// Secrets at rest: the database is private to its owner and never holds a `.p8` key in clear.
@Suite("isle app add / serve: secrets at rest")
struct SecretsAtRestCLITests {
    static func tempPath(_ name: String) -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-secrets-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir.appendingPathComponent(name).path
    }

    static func mode(_ path: String) -> Int? { FilePermissions.mode(of: path).map { $0 & 0o777 } }

    /// The test key's PEM written to a file, as an operator's AuthKey_….p8.
    static func keyFile(_ key: TestProviderKey) throws -> String {
        let path = tempPath("AuthKey_\(key.keyID).p8")
        try key.privateKeyPEM.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test("app add without a master key refuses and says how to make one; with one, the file is 0600 and holds no key in clear")
    func appAddSealsTheKey() async throws {
        let key = TestProviderKey()
        let p8 = try Self.keyFile(key)
        let db = Self.tempPath("isle.sqlite")
        let args = ["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--key", p8, "--key-id", key.keyID, "--team-id", key.teamID]
        let refused = await IsleCLI.capture(args)
        #expect(refused.status != 0)
        #expect(refused.err.contains("needs a master key") && refused.err.contains("isle master-key"), "\(refused.err)")

        let created = await IsleCLI.capture(["master-key"])
        let masterKey = created.out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(created.status == 0 && masterKey.count == 44 && Data(base64Encoded: masterKey)?.count == 32)
        let added = await IsleCLI.capture(args, environment: ["ISLE_MASTER_KEY": masterKey])
        #expect(added.status == 0, "\(added.err)")

        for file in [db, db + "-wal", db + "-shm"] where FileManager.default.fileExists(atPath: file) {
            #expect(Self.mode(file) == 0o600, "\(file) is \(String(Self.mode(file) ?? 0, radix: 8))")
        }
        // Neither the PEM nor its base64 body is anywhere in the database files.
        let body = key.privateKeyPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        for file in [db, db + "-wal"] where FileManager.default.fileExists(atPath: file) {
            let bytes = String(decoding: try Data(contentsOf: URL(fileURLWithPath: file)), as: UTF8.self)
            #expect(!bytes.contains("PRIVATE KEY") && !bytes.contains(body.prefix(40)), "\(file) holds the key in clear")
        }
        let store = try SQLiteStore(path: db)
        let app = try #require(try await store.app("com.example.pizza"))
        #expect(app.keyPEM.hasPrefix(MasterKey.sealedPrefix))
        #expect(try MasterKey.openKey(of: app, with: try MasterKey(base64: masterKey)) == key.privateKeyPEM)
    }

    @Test("app remove: without --yes it counts and removes nothing (64); with --yes the app, its keys and activities go; an unknown app is named")
    func appRemove() async throws {
        let key = TestProviderKey()
        let p8 = try Self.keyFile(key)
        let db = Self.tempPath("isle.sqlite")
        let env = ["ISLE_MASTER_KEY": MasterKey.generate().base64]
        for app in ["com.example.pizza", "com.example.kept"] {
            let added = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", app, "--key", p8, "--key-id", key.keyID, "--team-id", key.teamID], environment: env)
            #expect(added.status == 0, "\(added.err)")
            #expect(await IsleCLI.capture(["key", "create", "--database", db, "--bundle-id", app, "--scope", "backend"], environment: env).status == 0)
        }
        let store = try SQLiteStore(path: db)
        try await store.insertActivity(ActivityRecord(id: "a1", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok", startedAt: Date(), topics: ["t"]))

        let dry = await IsleCLI.capture(["app", "remove", "--database", db, "--bundle-id", "com.example.pizza"], environment: env)
        #expect(dry.status == ExitStatus.usage && dry.err.contains("add --yes"), "\(dry.err)")
        #expect(dry.out.contains("1 api_keys") && dry.out.contains("1 activities") && dry.out.contains("1 activity_topics"), "\(dry.out)")
        #expect(try await store.app("com.example.pizza") != nil)

        let removed = await IsleCLI.capture(["app", "remove", "--database", db, "--bundle-id", "com.example.pizza", "--yes"], environment: env)
        #expect(removed.status == 0 && removed.out.contains("removed app com.example.pizza"), "\(removed.err)")
        #expect(try await store.app("com.example.pizza") == nil)
        #expect(try await store.activity(id: "a1") == nil)
        #expect(try await store.apiKeys(bundleID: "com.example.pizza").isEmpty)
        #expect(try await store.apiKeys(bundleID: "com.example.kept").count == 1)
        let list = await IsleCLI.capture(["app", "list", "--database", db], environment: env)
        #expect(list.out.contains("com.example.kept") && !list.out.contains("com.example.pizza"), "\(list.out)")

        let unknown = await IsleCLI.capture(["app", "remove", "--database", db, "--bundle-id", "com.example.pizza", "--yes"], environment: env)
        #expect(unknown.status == ExitStatus.usage && unknown.err.contains("no app com.example.pizza") && unknown.err.contains("isle app list"), "\(unknown.err)")
    }

    @Test("serve refuses a database others can read, naming the chmod; and apps whose keys its master key does not open")
    func serveRefuses() async throws {
        let key = TestProviderKey()
        let p8 = try Self.keyFile(key)
        let db = Self.tempPath("isle.sqlite")
        let masterKey = MasterKey.generate().base64
        let added = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--key", p8, "--key-id", key.keyID, "--team-id", key.teamID],
                                          environment: ["ISLE_MASTER_KEY": masterKey])
        #expect(added.status == 0, "\(added.err)")

        let noKey = await IsleCLI.capture(["serve", "--database", db, "--port", "0"])
        #expect(noKey.status != 0 && noKey.err.contains("encrypted at rest and no master key"), "\(noKey.err)")
        let wrongKey = await IsleCLI.capture(["serve", "--database", db, "--port", "0"], environment: ["ISLE_MASTER_KEY": MasterKey.generate().base64])
        #expect(wrongKey.status != 0 && wrongKey.err.contains("does not open"), "\(wrongKey.err)")
        let badKey = await IsleCLI.capture(["serve", "--database", db, "--port", "0"], environment: ["ISLE_MASTER_KEY": "short"])
        #expect(badKey.status != 0 && badKey.err.contains("32 bytes"), "\(badKey.err)")

        chmod(db, 0o644)
        let open = await IsleCLI.capture(["serve", "--database", db, "--port", "0"], environment: ["ISLE_MASTER_KEY": masterKey])
        #expect(open.status != 0 && open.err.contains("chmod 600 \(db)"), "\(open.err)")

        // A master key file others can read is refused too.
        let file = Self.tempPath("master.key")
        try masterKey.write(toFile: file, atomically: true, encoding: .utf8)
        chmod(file, 0o644)
        chmod(db, 0o600)
        let openKeyFile = await IsleCLI.capture(["serve", "--database", db, "--port", "0", "--master-key-file", file])
        #expect(openKeyFile.status != 0 && openKeyFile.err.contains("chmod 600 \(file)"), "\(openKeyFile.err)")
    }
}
