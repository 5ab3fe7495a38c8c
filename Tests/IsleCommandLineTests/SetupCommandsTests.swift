import Foundation
@testable import IsleCommandLine
import IsleCore
import IsleStore
import IsleTesting
import Testing

/// The set-up commands do what they say (issue 49): `--check-config` creates nothing and fails on a
/// database with no app; a second attributes type needs no `.p8` and drops no schema; `isle app
/// schema` lists, adds and removes types without the key; every command that opens the database
/// reads `--config`; an unreachable PostgreSQL is named with its host, port and cause.
@Suite("isle: set-up commands that do what they say")
struct SetupCommandsTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let key = repository.appendingPathComponent("Examples/AuthKey_DEMOKEY000.p8").path
    static let pizzaSchema = repository.appendingPathComponent("Examples/PizzaDeliveryAttributes.schema.json").path

    /// A folder of its own, with a master key file in it.
    static func folder() throws -> (dir: String, masterKey: String) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-setup-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let masterKey = dir + "/master.key"
        try Data(MasterKey.generate().base64.utf8).write(to: URL(fileURLWithPath: masterKey))
        chmod(masterKey, 0o600)
        return (dir, masterKey)
    }

    static func matchSchema(_ dir: String) throws -> String {
        let path = dir + "/match.schema.json"
        try Data(#"{"attributesType":"MatchAttributes","attributes":{"home":"string","away":"string"},"contentState":{"home":"int","away":"int"}}"#.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    static func addPizza(_ db: String, masterKey: String) async throws {
        let r = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--key", key, "--key-id", "DEMOKEY000",
                                       "--team-id", "DEMOTEAM00", "--schema", pizzaSchema], environment: ["ISLE_MASTER_KEY_FILE": masterKey])
        #expect(r.status == 0, "\(r.err)")
    }

    static func types(_ db: String) async throws -> [String] {
        let store = try SQLiteStore(path: db)
        return try await store.withRunning { try await store.app("com.example.pizza")?.schemas.map(\.attributesType).sorted() ?? [] }
    }

    @Test("--check-config on a mistyped path: exit 78, names the path, and creates no file")
    func checkConfigCreatesNothing() async throws {
        let (dir, masterKey) = try Self.folder()
        let typo = dir + "/typo.sqlite"
        let r = await IsleCLI.capture(["serve", "--check-config", "--database", typo], environment: ["ISLE_MASTER_KEY_FILE": masterKey])
        #expect(r.status == ExitStatus.configuration)
        #expect(r.err.contains("\(typo) does not exist") && r.err.contains("isle app add --database \(typo)"), "\(r.err)")
        #expect(!FileManager.default.fileExists(atPath: typo), "--check-config created the database")
        #expect(!r.out.contains("configuration ok"))
        // Nor does any other command that only reads or changes what is there.
        for arguments in [["app", "list"], ["key", "list"], ["app", "schema", "list", "--bundle-id", "com.example.pizza"]] {
            let other = await IsleCLI.capture(arguments + ["--database", typo])
            #expect(other.status == ExitStatus.configuration && other.err.contains("does not exist"), "\(arguments): \(other.err)")
            #expect(!FileManager.default.fileExists(atPath: typo), "\(arguments) created the database")
        }
    }

    @Test("--check-config on a database with no app, or with no Isle tables: exit 78 and what to do; with an app: ok")
    func checkConfigNeedsAnApp() async throws {
        let (dir, masterKey) = try Self.folder()
        let db = dir + "/isle.sqlite"
        try await Self.addPizza(db, masterKey: masterKey)
        var r = await IsleCLI.capture(["serve", "--check-config", "--database", db], environment: ["ISLE_MASTER_KEY_FILE": masterKey])
        #expect(r.status == 0 && r.out.contains("configuration ok"), "\(r.err)")
        r = await IsleCLI.capture(["app", "remove", "--database", db, "--bundle-id", "com.example.pizza", "--yes"])
        #expect(r.status == 0, "\(r.err)")
        r = await IsleCLI.capture(["serve", "--check-config", "--database", db], environment: ["ISLE_MASTER_KEY_FILE": masterKey])
        #expect(r.status == ExitStatus.configuration && r.err.contains("has no app yet: add one with isle app add"), "\(r.err)")
        // A SQLite file that is not Isle's: said, and left as it was.
        let other = dir + "/other.sqlite"
        let foreign = try SQLiteStore(path: other)
        _ = try await foreign.withRunning { try await foreign.schemaCheck() }
        chmod(other, 0o600)
        let before = try Data(contentsOf: URL(fileURLWithPath: other))
        r = await IsleCLI.capture(["serve", "--check-config", "--database", other], environment: ["ISLE_MASTER_KEY_FILE": masterKey])
        #expect(r.status == ExitStatus.configuration && r.err.contains("holds no Isle tables"), "\(r.err)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: other)) == before, "--check-config changed the file")
    }

    @Test("app add for a second attributes type: no .p8 needed, and the first type's schema is kept")
    func secondTypeKeepsTheFirst() async throws {
        let (dir, masterKey) = try Self.folder()
        let db = dir + "/isle.sqlite"
        // Without a key on a database that is not there: refused, and nothing is made.
        let early = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--schema", Self.pizzaSchema])
        #expect(early.status == ExitStatus.configuration && early.err.contains("does not exist"), "\(early.err)")
        #expect(!FileManager.default.fileExists(atPath: db))
        try await Self.addPizza(db, masterKey: masterKey)
        // No --key, no master key: the app's key stays as it is.
        let r = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--schema", try Self.matchSchema(dir)])
        #expect(r.status == 0, "\(r.err)")
        #expect(r.out.contains("MatchAttributes (added)") && r.out.contains("PizzaDeliveryAttributes (kept)"), "\(r.out)")
        #expect(try await Self.types(db) == ["MatchAttributes", "PizzaDeliveryAttributes"])
        // Part of a key is refused, naming what is missing; a new app without a key is refused.
        let partial = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.pizza", "--key-id", "DEMOKEY000"])
        #expect(partial.status == ExitStatus.usage && partial.err.contains("--key and --team-id"), "\(partial.err)")
        let newApp = await IsleCLI.capture(["app", "add", "--database", db, "--bundle-id", "com.example.other", "--schema", Self.pizzaSchema])
        #expect(newApp.status == ExitStatus.usage && newApp.err.contains("com.example.other is not in") && newApp.err.contains("needs its provider key"), "\(newApp.err)")
        #expect(try await Self.types(db) == ["MatchAttributes", "PizzaDeliveryAttributes"])
    }

    @Test("isle app schema list, add and remove: no key needed; removing an unknown type names the ones there")
    func schemaCommands() async throws {
        let (dir, masterKey) = try Self.folder()
        let db = dir + "/isle.sqlite"
        try await Self.addPizza(db, masterKey: masterKey)
        var r = await IsleCLI.capture(["app", "schema", "add", "--database", db, "--bundle-id", "com.example.pizza", "--schema", try Self.matchSchema(dir)])
        #expect(r.status == 0 && r.out.contains("MatchAttributes (added)") && r.out.contains("PizzaDeliveryAttributes (kept)"), "\(r.out) \(r.err)")
        r = await IsleCLI.capture(["app", "schema", "list", "--database", db, "--bundle-id", "com.example.pizza"])
        #expect(r.status == 0 && r.out.contains("MatchAttributes  attributes: away, home  content-state: away, home"), "\(r.out)")
        #expect(r.out.contains("PizzaDeliveryAttributes  attributes: numberOfPizzas, orderNumber, totalAmount"))
        r = await IsleCLI.capture(["app", "schema", "list", "--database", db, "--bundle-id", "com.example.pizza", "--json"])
        #expect(r.out.split(separator: "\n").compactMap { try? ActivitySchema(jsonText: String($0)) }.count == 2, "--json prints schemas add takes back: \(r.out)")
        r = await IsleCLI.capture(["app", "schema", "remove", "--database", db, "--bundle-id", "com.example.pizza", "--attributes-type", "Nope"])
        #expect(r.status == ExitStatus.usage && r.err.contains("has no schema for Nope; it has MatchAttributes, PizzaDeliveryAttributes"), "\(r.err)")
        r = await IsleCLI.capture(["app", "schema", "remove", "--database", db, "--bundle-id", "com.example.pizza", "--attributes-type", "MatchAttributes"])
        #expect(r.status == 0 && r.out.contains("attributes types left: PizzaDeliveryAttributes"), "\(r.out) \(r.err)")
        #expect(try await Self.types(db) == ["PizzaDeliveryAttributes"])
        r = await IsleCLI.capture(["app", "schema", "add", "--database", db, "--bundle-id", "com.example.nope", "--schema", Self.pizzaSchema])
        #expect(r.status == ExitStatus.usage && r.err.contains("no app com.example.nope"), "\(r.err)")
    }

    @Test("every command that opens the database reads --config (its database and masterKeyFile); a flag or ISLE_* still wins")
    func adminCommandsReadConfig() async throws {
        let (dir, masterKey) = try Self.folder()
        let db = dir + "/isle.sqlite"
        let config = dir + "/isle.json"
        try Data("{\"database\":\"\(db)\",\"masterKeyFile\":\"\(masterKey)\"}".utf8).write(to: URL(fileURLWithPath: config))
        chmod(config, 0o600)
        // app add with no --database and no master key flag or variable: both from the file.
        var r = await IsleCLI.capture(["app", "add", "--config", config, "--bundle-id", "com.example.pizza", "--key", Self.key, "--key-id", "DEMOKEY000", "--team-id", "DEMOTEAM00"])
        #expect(r.status == 0 && r.out.contains("added in \(db)"), "\(r.out) \(r.err)")
        for arguments in [["app", "list"], ["key", "list"], ["app", "schema", "list", "--bundle-id", "com.example.pizza"], ["app", "schema", "add", "--bundle-id", "com.example.pizza", "--schema", Self.pizzaSchema],
                          ["key", "create", "--bundle-id", "com.example.pizza", "--scope", "backend"], ["app", "ticket-key", "list", "--bundle-id", "com.example.pizza"], ["serve", "--check-config"]] {
            r = await IsleCLI.capture(arguments + ["--config", config])
            #expect(r.status == 0, "\(arguments): \(r.err)")
        }
        #expect(try await Self.types(db) == ["PizzaDeliveryAttributes"])
        // The flag wins over the file, and so does ISLE_DATABASE.
        let elsewhere = dir + "/elsewhere.sqlite"
        r = await IsleCLI.capture(["app", "list", "--config", config, "--database", elsewhere])
        #expect(r.status == ExitStatus.configuration && r.err.contains("\(elsewhere) does not exist"), "\(r.err)")
        r = await IsleCLI.capture(["app", "list", "--config", config], environment: ["ISLE_DATABASE": elsewhere])
        #expect(r.status == ExitStatus.configuration && r.err.contains("\(elsewhere) does not exist"), "\(r.err)")
        // A master key named in the environment wins over the file's: a wrong one is refused.
        let wrong = dir + "/wrong.key"
        try Data(MasterKey.generate().base64.utf8).write(to: URL(fileURLWithPath: wrong))
        chmod(wrong, 0o600)
        r = await IsleCLI.capture(["serve", "--check-config", "--config", config], environment: ["ISLE_MASTER_KEY_FILE": wrong])
        #expect(r.status == ExitStatus.configuration && r.err.contains("it does not open com.example.pizza's .p8 key"), "\(r.err)")
        // A config file others can read is refused, as isle serve refuses it.
        chmod(config, 0o644)
        r = await IsleCLI.capture(["app", "list", "--config", config])
        #expect(r.status != 0 && r.err.contains("readable by others"), "\(r.err)")
    }

    @Test("an unreachable PostgreSQL: at once, with its host, port and cause, never a password and never PSQLError's generic text")
    func unreachablePostgres() async throws {
        // A port nothing listens on: one bound and closed again.
        let port = try freeLoopbackPort()
        let url = "postgres://isle@127.0.0.1:\(port)/isle"
        for arguments in [["app", "list", "--database", url], ["serve", "--check-config", "--database", url]] {
            let started = ContinuousClock.now
            let r = await IsleCLI.capture(arguments, environment: ["PGPASSWORD": "s3cret-password"])
            #expect(r.status == ExitStatus.configuration, "\(arguments): \(r.err)")
            #expect(r.err.contains("cannot reach PostgreSQL at 127.0.0.1:\(port)") && r.err.contains("Connection refused"), "\(r.err)")
            #expect(!r.err.contains("Generic description") && !r.err.contains("s3cret-password"), "\(r.err)")
            #expect(ContinuousClock.now - started < .seconds(30), "it waited as a server does")
        }
    }
}
