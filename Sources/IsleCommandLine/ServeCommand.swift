import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore
import IsleServer
import IsleStore
import Logging
import ServiceLifecycle

/// Where the database is: `--database`, else ISLE_DATABASE, else ./isle.sqlite. A
/// `postgres://user@host:port/db` URL names a PostgreSQL database (several `isle serve` may share it).
struct DatabaseOption: ParsableArguments {
    @Option(help: ArgumentHelp("A SQLite file, or postgres://user@host:port/database (env ISLE_DATABASE; default ./isle.sqlite). The PostgreSQL password comes from the URL, PGPASSWORD or ?passwordfile=.", valueName: "path-or-url"))
    var database: String?
    @Option(name: .customLong("master-key-file"), help: ArgumentHelp("The master key that seals the apps' .p8 keys (env ISLE_MASTER_KEY_FILE, or the key itself in ISLE_MASTER_KEY). Create one with: isle master-key.", valueName: "file"))
    var masterKeyFile: String?

    var path: String { database ?? CLIContext.current.environment["ISLE_DATABASE"] ?? "./isle.sqlite" }

    /// The master key from --master-key-file, ISLE_MASTER_KEY_FILE or ISLE_MASTER_KEY; nil when none is given.
    func masterKey() throws -> MasterKey? {
        let env = CLIContext.current.environment
        do {
            if let file = masterKeyFile ?? env["ISLE_MASTER_KEY_FILE"].flatMap({ $0.isEmpty ? nil : $0 }) { return try MasterKey(file: file) }
            if let text = env["ISLE_MASTER_KEY"], !text.isEmpty { return try MasterKey(base64: text) }
        } catch {
            throw CLIError("master key: \(error.message)")
        }
        return nil
    }

    static let masterKeyHelp = "Create a master key once with `isle master-key > isle-master.key && chmod 600 isle-master.key`, keep it apart from the database (and its backups), and pass --master-key-file isle-master.key (or ISLE_MASTER_KEY_FILE, or the key itself in ISLE_MASTER_KEY) to isle app add and isle serve."

    /// What to print for the database: a file path, or the URL without its password.
    var shownPath: String { DatabaseOption.shown(path) }

    static func shown(_ path: String) -> String {
        PostgresSettings.isPostgresURL(path) ? ((try? PostgresSettings(url: path))?.redacted ?? "postgres://…") : path
    }

    /// Opens the store (SQLite file or PostgreSQL URL), without running it.
    static func store(_ path: String, logger: Logger) throws -> any IsleStore {
        if PostgresSettings.isPostgresURL(path) {
            do { return PostgresStore(settings: try PostgresSettings(url: path), logger: logger) } catch let e as StoreError { throw CLIError("database: \(e.message)") }
        }
        if let problem = FilePermissions.problem(withDatabase: path) { throw CLIError("database: \(problem)") }
        do { return try SQLiteStore(path: path) } catch { throw CLIError("database: cannot open \(path): \(error)") }
    }

    /// Runs `body` with the migrated store, its connections up for the duration.
    func withStore<T: Sendable>(_ body: @escaping @Sendable (any IsleStore) async throws -> T) async throws -> T {
        var logger = Logger(label: "isle.store")
        logger.logLevel = .warning
        let store = try Self.store(path, logger: logger)
        let shown = shownPath
        return try await store.withRunning {
            do { try await store.migrate() } catch { throw CLIError("--database: cannot prepare \(shown): \(error)") }
            return try await body(store)
        }
    }
}

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the Isle server: HTTP API and delivery engine over a SQLite file, or a PostgreSQL database several servers share.",
        discussion: "Settings come from --config FILE (JSON with the same names as the flags), then ISLE_* environment variables, then flags; later ones win. Logs never contain a full token, JWT or key."
    )

    @Option(help: ArgumentHelp("A JSON configuration file.", valueName: "file")) var config: String?
    @Option(help: "Address to listen on (env ISLE_HOST; default 127.0.0.1).") var host: String?
    @Option(help: "Port (env ISLE_PORT; default 8080; 0 = any).") var port: Int?
    @OptionGroup var database: DatabaseOption
    @Flag(help: "Tokens whose app does not say their APNs environment are sandbox tokens (default; env ISLE_APNS_ENV=sandbox).") var sandbox = false
    @Flag(help: "Tokens whose app does not say their APNs environment are production tokens (env ISLE_APNS_ENV=production).") var production = false
    @Option(name: .customLong("apns-url"), help: "Send both environments' pushes to this APNs-compatible server, e.g. isle sim (env ISLE_APNS_URL).") var apnsURL: String?
    @Option(name: .customLong("apns-sandbox-url"), help: "Send sandbox tokens' pushes to this APNs-compatible server, broadcasts and channel management included (env ISLE_APNS_SANDBOX_URL; e.g. isle sim --single-host).") var apnsSandboxURL: String?
    @Option(name: .customLong("apns-production-url"), help: "Send production tokens' pushes to this APNs-compatible server, broadcasts and channel management included (env ISLE_APNS_PRODUCTION_URL; e.g. isle sim --production --single-host).") var apnsProductionURL: String?
    @Option(name: .customLong("apns-broadcast-url"), help: "With --apns-url: where broadcasts go, if not there (env ISLE_APNS_BROADCAST_URL; isle sim prints it).") var apnsBroadcastURL: String?
    @Option(name: .customLong("apns-management-url"), help: "With --apns-url: where channel management goes, if not there (env ISLE_APNS_MANAGEMENT_URL).") var apnsManagementURL: String?
    @Option(name: .customLong("apns-ca-cert"), help: "PEM file of the CA certificate(s) to trust for --apns-url, --apns-sandbox-url and --apns-production-url (env ISLE_APNS_CA_CERT; concatenate several).") var apnsCACert: String?
    @Option(help: "Deliveries in flight (env ISLE_CONCURRENCY; default 64).") var concurrency: Int?
    @Option(name: .customLong("apns-transport"), help: "The HTTP/2 client for APNs: http2 (Isle's own, default) or async-http-client (env ISLE_APNS_TRANSPORT).") var apnsTransport: String?
    @Option(help: ArgumentHelp("Seconds a claimed push belongs to this server before another may take it over (env ISLE_LEASE; default 120; at least 2). Shorter brings a crashed instance's work back sooner; it must stay longer than a send can take.", valueName: "seconds")) var lease: Int?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error (env ISLE_LOG_LEVEL; default info).") var logLevel: String?

    func run() async throws {
        let env = CLIContext.current.environment
        var file: JSONObject = [:]
        if let config {
            let value = try Inputs.json("@" + config, flag: "--config")
            guard let o = value.objectValue else { throw CLIError("--config: \(config) must hold a JSON object") }
            let known: Set = ["host", "port", "database", "apnsEnvironment", "apnsURL", "apnsSandboxURL", "apnsProductionURL", "apnsBroadcastURL", "apnsManagementURL", "apnsCACert", "apnsTransport", "concurrency", "logLevel", "lease"]
            if let unknown = o.keys.first(where: { !known.contains($0) }) { throw CLIError("--config: unknown setting \"\(unknown)\"; known: \(known.sorted().joined(separator: ", "))") }
            file = o
        }
        func pick(_ flag: String?, _ envName: String, _ key: String) -> String? {
            flag ?? env[envName].flatMap { $0.isEmpty ? nil : $0 } ?? file[key]?.stringValue ?? file[key]?.numberValue?.literal
        }
        var c = ServerConfiguration()
        c.host = pick(host, "ISLE_HOST", "host") ?? c.host
        if let p = pick(port.map(String.init), "ISLE_PORT", "port") {
            guard let n = Int(p), (0...65535).contains(n) else { throw CLIError("port: \(p) is not a port number") }
            c.port = n
        }
        c.databasePath = database.database ?? env["ISLE_DATABASE"] ?? file["database"]?.stringValue ?? c.databasePath
        if let n = pick(concurrency.map(String.init), "ISLE_CONCURRENCY", "concurrency") {
            guard let v = Int(n), (1...10_000).contains(v) else { throw CLIError("concurrency: \(n) must be 1…10000") }
            c.concurrency = v
        }
        if let l = pick(lease.map(String.init), "ISLE_LEASE", "lease") {
            guard let v = Int(l), (2...86_400).contains(v) else { throw CLIError("lease: \(l) must be whole seconds from 2 to 86400") }
            c.lease = TimeInterval(v)
            // The sweep looks for expired leases several times per lease.
            c.sweepInterval = min(.seconds(15), .seconds(max(1, v / 4)))
            c.requestTimeout = min(c.requestTimeout, .seconds(max(1, v / 2)))
        }
        if let t = pick(apnsTransport, "ISLE_APNS_TRANSPORT", "apnsTransport") {
            guard let kind = APNsTransportKind(rawValue: t) else {
                throw CLIError("apns-transport: \"\(t)\" is not one of \(APNsTransportKind.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            c.apnsTransport = kind
        }
        if sandbox && production { throw CLIError("--sandbox and --production exclude each other") }
        let defaultName = env["ISLE_APNS_ENV"].flatMap { $0.isEmpty ? nil : $0 } ?? file["apnsEnvironment"]?.stringValue
        if production {
            c.defaultEnvironment = .production
        } else if !sandbox, let defaultName {
            guard let e = PushEnvironment(reported: defaultName) else { throw CLIError("apnsEnvironment: \"\(defaultName)\" is not sandbox or production") }
            c.defaultEnvironment = e
        }
        let caPath = pick(apnsCACert, "ISLE_APNS_CA_CERT", "apnsCACert")
        let pem = try caPath.map { String(decoding: try Inputs.read($0, flag: "--apns-ca-cert"), as: UTF8.self) }
        func https(_ flag: String, _ value: String?) throws -> String? {
            if let value, URL(string: value)?.scheme != "https" { throw CLIError("\(flag): \(value) must be an https URL") }
            return value
        }
        let broadcast = try https("apns-broadcast-url", pick(apnsBroadcastURL, "ISLE_APNS_BROADCAST_URL", "apnsBroadcastURL"))
        let management = try https("apns-management-url", pick(apnsManagementURL, "ISLE_APNS_MANAGEMENT_URL", "apnsManagementURL"))
        let commonURL = try https("apns-url", pick(apnsURL, "ISLE_APNS_URL", "apnsURL"))
        if commonURL == nil, broadcast != nil || management != nil {
            throw CLIError("--apns-broadcast-url and --apns-management-url go with --apns-url (with --apns-sandbox-url or --apns-production-url, the server there serves all three)")
        }
        if let url = commonURL {
            c.sendBothEnvironments(to: .custom(url: url, broadcastURL: broadcast, managementURL: management, trustRootsPEM: pem))
        }
        for (environment, flag, value) in [(PushEnvironment.sandbox, "apns-sandbox-url", pick(apnsSandboxURL, "ISLE_APNS_SANDBOX_URL", "apnsSandboxURL")),
                                           (.production, "apns-production-url", pick(apnsProductionURL, "ISLE_APNS_PRODUCTION_URL", "apnsProductionURL"))] {
            guard let url = try https(flag, value) else { continue }
            c.apnsTargets[environment] = .custom(url: url, trustRootsPEM: pem)
        }
        var logger = Logger(label: "isle.server")
        let level = pick(logLevel, "ISLE_LOG_LEVEL", "logLevel") ?? "info"
        guard let l = Logger.Level(rawValue: level) else { throw CLIError("log-level: \(level) is not one of trace, debug, info, notice, warning, error, critical") }
        logger.logLevel = l

        let store = try DatabaseOption.store(c.databasePath, logger: logger)
        let shown = DatabaseOption.shown(c.databasePath)
        c.masterKey = try database.masterKey()
        let configuration = c
        let serverLogger = logger
        try await store.withRunning {
            try await Self.checkKeys(store: store, masterKey: configuration.masterKey, path: shown)
            try await Self.serve(configuration, store: store, shown: shown, logger: serverLogger)
        }
    }

    static func serve(_ c: ServerConfiguration, store: any IsleStore, shown: String, logger: Logger) async throws {
        let app = IsleServerApp(configuration: c, store: store, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            let p = await app.port()
            guard p != 0 else {
                // It stopped before listening (another server holds the database, the port is
                // taken, …): the service group's error says why.
                try await tasks.next()
                throw CLIError("the server stopped before it could listen")
            }
            let apps = try await store.apps()
            say("Isle server on http://\(c.host):\(p)  database \(shown)  APNs \(c.apnsDescription)  apps: \(apps.isEmpty ? "none yet (isle app add)" : apps.map(\.bundleID).joined(separator: ", "))")
            try await tasks.next()
        }
    }
}

extension ServeCommand {
    /// Every app key must open with the master key given; keys from before sealing are sealed now.
    static func checkKeys(store: any IsleStore, masterKey: MasterKey?, path: String) async throws {
        try await store.migrate()
        let apps = try await store.apps()
        let clear = apps.filter { !MasterKey.isSealed($0.keyPEM) }
        if !clear.isEmpty {
            guard let masterKey else {
                throw CLIError("database: \(path) holds the .p8 key of \(clear.map(\.bundleID).joined(separator: ", ")) in clear; give a master key and isle serve seals it. \(DatabaseOption.masterKeyHelp)")
            }
            guard let sqlite = store as? SQLiteStore else { throw CLIError("database: \(path) holds the .p8 key of \(clear.map(\.bundleID).joined(separator: ", ")) in clear") }
            let sealed = try await sqlite.sealPlaintextKeys(with: masterKey)
            warn("sealed the .p8 key of \(sealed.joined(separator: ", ")) with the master key (it was stored in clear)")
        }
        let sealedApps = apps.filter { MasterKey.isSealed($0.keyPEM) }
        if !sealedApps.isEmpty {
            guard let masterKey else {
                throw CLIError("database: the apps' .p8 keys are encrypted at rest and no master key was given. \(DatabaseOption.masterKeyHelp)")
            }
            for app in sealedApps {
                do { _ = try masterKey.open(app.keyPEM, bundleID: app.bundleID) } catch {
                    throw CLIError("master key: \(error.message); give the master key these apps were added with")
                }
            }
        }
    }
}

/// `isle master-key`: a new random master key, printed once.
struct MasterKeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "master-key",
        abstract: "Print a new master key (32 random bytes, base64) to seal the apps' .p8 keys at rest.",
        discussion: "isle master-key > isle-master.key && chmod 600 isle-master.key, then pass --master-key-file isle-master.key to isle app add and isle serve. Without it the server cannot open its apps' keys: keep a copy somewhere safe, apart from the database."
    )
    func run() throws { say(MasterKey.generate().base64) }
}

struct AppCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "app", abstract: "Register apps with the server's database.", subcommands: [Add.self, List.self, TicketKeyCommand.self])

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add (or replace) an app: its provider key and attributes-type schemas.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: ArgumentHelp("The .p8 token-signing key.", valueName: "file")) var key: String
        @Option(name: .customLong("key-id")) var keyID: String
        @Option(name: .customLong("team-id")) var teamID: String
        @Option(parsing: .singleValue, help: ArgumentHelp("An attributes-type schema (repeat for more).", valueName: "file")) var schema: [String] = []
        @Flag(name: .customLong("frequent-updates"), help: "The app declares NSSupportsLiveActivitiesFrequentUpdates.") var frequentUpdates = false

        func run() async throws {
            guard !bundleID.isEmpty, !bundleID.contains(".push-type."), !bundleID.contains(where: \.isWhitespace) else { throw CLIError("--bundle-id: give the bare bundle id, e.g. com.example.pizza") }
            let credentials: APNsCredentials
            do { credentials = try APNsCredentials(keyID: keyID, teamID: teamID, keyFile: key) } catch { throw CLIError("--key: \(error.reason)") }
            _ = credentials
            var schemas: [ActivitySchema] = []
            for path in schema { schemas.append(try Inputs.schema(path)!) }
            let pem = String(decoding: try Inputs.read(key, flag: "--key"), as: UTF8.self)
            guard let masterKey = try database.masterKey() else {
                throw CLIError("app add: the .p8 key is stored encrypted and needs a master key. \(DatabaseOption.masterKeyHelp)")
            }
            let shown = database.shownPath
            let record = AppRecord(bundleID: bundleID, teamID: teamID, keyID: keyID, keyPEM: masterKey.seal(pem, bundleID: bundleID),
                                   frequentUpdatesDeclared: frequentUpdates, schemas: schemas, createdAt: Date())
            try await database.withStore { store in
                try await ServeCommand.checkKeys(store: store, masterKey: masterKey, path: shown)
                // Replacing an app keeps its ticket keys (isle app ticket-key manages them).
                var record = record
                record.ticketKeys = try await store.app(record.bundleID)?.ticketKeys ?? []
                try await store.upsertApp(record)
            }
            say("app \(bundleID) saved in \(shown) (key \(keyID), team \(teamID), \(schemas.count) attributes type\(schemas.count == 1 ? "" : "s"))")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List registered apps.")
        @OptionGroup var database: DatabaseOption
        func run() async throws {
            for a in try await database.withStore({ try await $0.apps() }) {
                say("\(a.bundleID)  key \(a.keyID)  team \(a.teamID)  types: \(a.schemas.map(\.attributesType).joined(separator: ", "))")
            }
        }
    }
}

struct KeyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "key", abstract: "Create and revoke API keys.", subcommands: [Create.self, Revoke.self])

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an API key; the secret is printed once and only its hash is stored.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: "backend (start, update, end, read), device (register tokens and state) or admin (the web console at /console, nothing else).") var scope: String

        func run() async throws {
            guard let s = APIKeyScope(rawValue: scope) else { throw CLIError("--scope: use backend, device or admin") }
            let (shown, bundleID) = (database.shownPath, bundleID)
            let (id, secret) = try await database.withStore { store in
                guard try await store.app(bundleID) != nil else { throw CLIError("--bundle-id: no app \(bundleID) in \(shown); add it first with isle app add") }
                return try await ServerSetup.createKey(store: store, bundleID: bundleID, scope: s)
            }
            say(secret)
            warn("key \(id) (\(s.rawValue)) for \(bundleID): keep the secret above; it is not shown again")
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke an API key by its id.")
        @OptionGroup var database: DatabaseOption
        @Argument var id: String
        func run() async throws {
            let id = id
            guard try await database.withStore({ try await $0.revokeAPIKey(id: id, at: Date()) }) else { throw CLIError("no active key \(id)") }
            say("revoked \(id)")
        }
    }
}
