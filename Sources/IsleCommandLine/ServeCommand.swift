import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore
import IsleServer
import IsleStore
import IsleDelivery
import Logging
import OTel
import ServiceLifecycle
import UnixSignals

/// Where the database is: `--database`, else ISLE_DATABASE, else ./isle.sqlite. A
/// `postgres://user@host:port/db` URL names a PostgreSQL database (several `isle serve` may share it).
struct DatabaseOption: ParsableArguments {
    @Option(help: ArgumentHelp("A SQLite file, or postgres://user@host:port/database (env ISLE_DATABASE; default ./isle.sqlite). The PostgreSQL password comes from PGPASSWORD or ?passwordfile= (a file only you can read), never from this flag.", valueName: "path-or-url"))
    var database: String?
    @Option(name: .customLong("master-key-file"), help: ArgumentHelp("The master key that seals the apps' .p8 keys (env ISLE_MASTER_KEY_FILE, or the key itself in ISLE_MASTER_KEY). Create one with: isle master-key.", valueName: "file"))
    var masterKeyFile: String?
    @Option(help: ArgumentHelp("isle serve's JSON configuration file (docs/server.md): its database and masterKeyFile are used where no flag or ISLE_* variable gives them (every command that opens the database reads it).", valueName: "file"))
    var config: String?

    var path: String { database ?? CLIContext.current.environment["ISLE_DATABASE"] ?? "./isle.sqlite" }

    /// A password on the command line is visible to every user of the machine (`ps`,
    /// /proc/PID/cmdline): refused, pointing to the ways that keep it private.
    mutating func validate() throws {
        if let database, let problem = Self.passwordProblem(database, source: "--database") { throw ValidationError(problem) }
        // The config file's database and master key, where neither a flag nor the environment gives them.
        guard let config else { return }
        let file: JSONObject
        do { file = try Self.readConfig(config) } catch let e as CLIError { throw ValidationError(e.message) }
        let env = CLIContext.current.environment
        func given(_ name: String) -> Bool { !(env[name] ?? "").isEmpty }
        if database == nil, !given("ISLE_DATABASE"), let value = file["database"] {
            guard let path = value.stringValue, !path.isEmpty else { throw ValidationError("--config: database in \(config) must be a file path or a postgres:// URL") }
            database = path
        }
        if masterKeyFile == nil, !given("ISLE_MASTER_KEY_FILE"), !given("ISLE_MASTER_KEY"), let value = file["masterKeyFile"] ?? file["master-key-file"] {
            guard let path = value.stringValue, !path.isEmpty else { throw ValidationError("--config: masterKeyFile in \(config) must be a file path") }
            masterKeyFile = path
        }
    }

    /// A config file's settings: a JSON object in a file only its owner can read (it may hold the
    /// database's password).
    static func readConfig(_ config: String) throws -> JSONObject {
        if let mode = FilePermissions.mode(of: config), mode & 0o077 != 0 {
            throw CLIError("--config: \(config) is readable by others (mode \(String(mode & 0o777, radix: 8))), and it may hold the database's password; run: chmod 600 \(config)")
        }
        let value = try Inputs.json("@" + config, flag: "--config")
        guard let o = value.objectValue else { throw CLIError("--config: \(config) must hold a JSON object") }
        return o
    }

    static func passwordProblem(_ url: String, source: String) -> String? {
        guard PostgresSettings.isPostgresURL(url), let components = URLComponents(string: url), components.password != nil else { return nil }
        return "\(source) holds a password, which any user of this machine can read in the process list; leave it out of the URL and give it in PGPASSWORD, in a file named by ?passwordfile= (chmod 600), or put the URL in ISLE_DATABASE or a --config file (chmod 600)"
    }

    /// The master key from --master-key-file, ISLE_MASTER_KEY_FILE, ISLE_MASTER_KEY or (for
    /// `isle serve`) the config file's `masterKeyFile`; nil when none is given.
    func masterKey(configFile: String? = nil) throws -> MasterKey? {
        let env = CLIContext.current.environment
        do {
            if let file = masterKeyFile ?? env["ISLE_MASTER_KEY_FILE"].flatMap({ $0.isEmpty ? nil : $0 }) { return try MasterKey(file: file) }
            if let text = env["ISLE_MASTER_KEY"], !text.isEmpty { return try MasterKey(base64: text) }
            if let configFile { return try MasterKey(file: configFile) }
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
            do { return PostgresStore(settings: try PostgresSettings(url: path, environment: CLIContext.current.environment), logger: logger) } catch let e as StoreError { throw CLIError("database: \(e.message)") }
        }
        if let problem = FilePermissions.problem(withDatabase: path) { throw CLIError("database: \(problem)") }
        do { return try SQLiteStore(path: path, logger: logger) } catch { throw CLIError("database: cannot open \(path): \(error)") }
    }

    /// A database that is not there yet, refused unless the command is the one that creates it
    /// (`isle app add`): a mistyped path would otherwise become a new, empty database.
    static func refuseMissing(_ path: String) throws {
        guard !PostgresSettings.isPostgresURL(path), !FileManager.default.fileExists(atPath: path) else { return }
        throw CLIError.configuration("--database: \(path) does not exist (is the path right?); isle app add --database \(path) … creates it")
    }

    /// PostgreSQL reached at once, or a one-line error naming its host, port and why: an admin
    /// command does not wait the way a server does for a database that is away.
    static func checkReachable(_ store: any IsleStore) async throws {
        guard let pg = store as? PostgresStore else { return }
        do { try await pg.checkReachable() } catch let e as StoreError { throw CLIError.configuration("database: \(e.message)") }
    }

    /// Runs `body` with the migrated store, its connections up for the duration. `creates`: this
    /// command may create the database (only `isle app add` does).
    func withStore<T: Sendable>(creates: Bool = false, _ body: @escaping @Sendable (any IsleStore) async throws -> T) async throws -> T {
        var logger = Logger(label: "isle.store")
        logger.logLevel = .warning
        if !creates { try Self.refuseMissing(path) }
        let store = try Self.store(path, logger: logger)
        let shown = shownPath
        try await Self.checkReachable(store)
        return try await store.withRunning {
            do { try await store.migrate() } catch let e as StoreError where e.code == .refused {
                // A database newer than this binary: the set-up is wrong, not the command (exit 78).
                throw CLIError.configuration("--database: \(shown): \(e.message)")
            } catch { throw CLIError("--database: cannot prepare \(shown): \(error)") }
            return try await body(store)
        }
    }
}

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the Isle server: HTTP API and delivery engine over a SQLite file, or a PostgreSQL database several servers share.",
        discussion: "Settings come from --config FILE (a JSON object: each flag under its name, as written here without the dashes (\"apns-ca-cert\") or in camelCase (\"apnsCACert\"), docs/server.md), then ISLE_* environment variables, then flags; later ones win. SIGHUP reads the file again (log level and format, access log, the TLS files); SIGTERM and SIGINT stop gracefully. Logs never contain a full token, JWT or key."
    )

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
    @Option(help: "Deliveries in flight (env ISLE_CONCURRENCY; default 256; a claim and a batch of results hold up to this many).") var concurrency: Int?
    @Option(name: .customLong("apns-transport"), help: "The HTTP/2 client for APNs: http2 (Isle's own, default) or async-http-client (env ISLE_APNS_TRANSPORT).") var apnsTransport: String?
    @Option(help: ArgumentHelp("Seconds a claimed push belongs to this server before another may take it over (env ISLE_LEASE; default 120; at least 2). Shorter brings a crashed instance's work back sooner; it must stay longer than a send can take.", valueName: "seconds")) var lease: Int?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error (env ISLE_LOG_LEVEL; default info).") var logLevel: String?
    @Option(name: .customLong("log-format"), help: "text (default) or json: one JSON object per line, with trace_id and span_id inside traced requests (env ISLE_LOG_FORMAT).") var logFormat: String?
    @Flag(name: .customLong("access-log"), help: "A line at info for every request: method, route, status, duration, key id (env ISLE_ACCESS_LOG=true; written at debug without it).") var accessLog = false
    @Flag(name: .customLong("check-config"), help: "Check the settings (config file, environment, flags), the TLS files, the master key and the database's schema, print what is wrong or \"configuration ok\", and exit without serving.") var checkConfig = false
    // Bounds (docs/security.md, "Bounded by construction"). A rate is 10/s, 10/s,burst=60 or off.
    @Option(name: .customLong("backend-rate"), help: ArgumentHelp("Requests per backend API key (env ISLE_BACKEND_RATE; default 10000/s,burst=20000).", valueName: "rate")) var backendRate: String?
    @Option(name: .customLong("device-rate"), help: ArgumentHelp("Requests per device API key, the whole fleet together (env ISLE_DEVICE_RATE; default 1000/s,burst=2000).", valueName: "rate")) var deviceRate: String?
    @Option(name: .customLong("installation-rate"), help: ArgumentHelp("Device-key requests per installation (env ISLE_INSTALLATION_RATE; default 5/s,burst=60).", valueName: "rate")) var installationRate: String?
    @Option(name: .customLong("address-rate"), help: ArgumentHelp("Device-key requests per client address (env ISLE_ADDRESS_RATE; default 100/s,burst=1000).", valueName: "rate")) var addressRate: String?
    @Option(name: .customLong("auth-failure-rate"), help: ArgumentHelp("Unknown API keys and failed console sign-ins per client address (env ISLE_AUTH_FAILURE_RATE; default 0.5/s,burst=20).", valueName: "rate")) var authFailureRate: String?
    @Option(name: .customLong("max-live-activities-per-installation"), help: ArgumentHelp("Live activities one installation may hold (env ISLE_MAX_LIVE_ACTIVITIES_PER_INSTALLATION; default 20).", valueName: "n")) var maxLiveActivities: Int?
    @Option(name: .customLong("max-installations-per-user"), help: ArgumentHelp("Installations the backend may bind to one user (env ISLE_MAX_INSTALLATIONS_PER_USER; default 50).", valueName: "n")) var maxInstallationsPerUser: Int?
    @Option(name: .customLong("max-new-installations-per-address"), help: ArgumentHelp("New installations one client address may register per hour; 0: no limit (env ISLE_MAX_NEW_INSTALLATIONS_PER_ADDRESS; default 200).", valueName: "n")) var maxNewInstallations: Int?
    @Option(name: .customLong("max-new-activities-per-address"), help: ArgumentHelp("New activities one client address may register per hour; 0: no limit (env ISLE_MAX_NEW_ACTIVITIES_PER_ADDRESS; default 1000).", valueName: "n")) var maxNewActivities: Int?
    @Option(name: .customLong("max-connections-per-address"), help: ArgumentHelp("Open connections one client address may hold; 0: no limit (env ISLE_MAX_CONNECTIONS_PER_ADDRESS; default 256).", valueName: "n")) var maxConnectionsPerAddress: Int?
    @Option(name: .customLong("header-timeout"), help: ArgumentHelp("Seconds from a request's first byte to the end of its head (env ISLE_HEADER_TIMEOUT; default 10).", valueName: "seconds")) var headerTimeout: Double?
    @Option(name: .customLong("body-timeout"), help: ArgumentHelp("Seconds from a request's head to the end of its body (env ISLE_BODY_TIMEOUT; default 30).", valueName: "seconds")) var bodyTimeout: Double?
    @Option(name: .customLong("idle-timeout"), help: ArgumentHelp("Seconds a connection may stay open with no request in progress (env ISLE_IDLE_TIMEOUT; default 60).", valueName: "seconds")) var idleTimeout: Double?
    @Flag(name: .customLong("secure-cookies"), help: "The console's session cookie is Secure: set it when clients reach Isle over HTTPS (a TLS-terminating proxy) (env ISLE_SECURE_COOKIES=true).") var secureCookies = false
    @Option(name: .customLong("tls-cert"), help: ArgumentHelp("Serve the API over HTTPS with this PEM certificate chain (env ISLE_TLS_CERT); read again when it changes.", valueName: "file")) var tlsCert: String?
    @Option(name: .customLong("tls-key"), help: ArgumentHelp("The PEM private key of --tls-cert (env ISLE_TLS_KEY).", valueName: "file")) var tlsKey: String?
    @Option(name: .customLong("trusted-proxies"), help: ArgumentHelp("Reverse proxies (addresses or CIDR ranges, comma-separated) whose X-Forwarded-For names the client, for per-address limits (env ISLE_TRUSTED_PROXIES; default none).", valueName: "ranges")) var trustedProxies: String?
    @Option(name: .customLong("webhook-hosts"), help: ArgumentHelp("The only hosts webhooks may point at, comma-separated (*.example.com for subdomains); these may also be private addresses (env ISLE_WEBHOOK_HOSTS; default: any host whose addresses are all public).", valueName: "hosts")) var webhookHosts: String?
    @Flag(name: .customLong("webhook-allow-private"), help: "Webhooks may reach loopback, private and link-local addresses (tests and development only; env ISLE_WEBHOOK_ALLOW_PRIVATE=true).") var webhookAllowPrivate = false
    @Option(name: .customLong("max-event-wait"), help: ArgumentHelp("Longest long poll of GET /v1/events, in seconds (env ISLE_MAX_EVENT_WAIT; default 30).", valueName: "seconds")) var maxEventWait: Double?
    @Option(name: .customLong("webhook-disable-after"), help: ArgumentHelp("Days a webhook may keep failing before it is disabled, with a webhook.disabled event (env ISLE_WEBHOOK_DISABLE_AFTER; default 3; 0: never).", valueName: "days")) var webhookDisableAfter: Double?
    @Option(name: .customLong("keep-events"), help: ArgumentHelp("Days an event (docs/events.md) is kept for GET /v1/events and webhooks (env ISLE_KEEP_EVENTS; default 7).", valueName: "days")) var keepEvents: Double?
    @Option(name: .customLong("keep-ended-activities"), help: ArgumentHelp("Days an ended, dismissed or unreachable activity is kept (env ISLE_KEEP_ENDED_ACTIVITIES; default 30).", valueName: "days")) var keepEndedActivities: Double?
    @Option(name: .customLong("keep-stale-installations"), help: ArgumentHelp("Days an installation that reported nothing and holds no live activity is kept (env ISLE_KEEP_STALE_INSTALLATIONS; default 180).", valueName: "days")) var keepStaleInstallations: Double?
    @Option(name: .customLong("clock-url"), help: ArgumentHelp("Take the time from the control API of an isle sim on its virtual clock (its GET /clock) instead of the system clock, for end-to-end tests of time rules; loopback only, never in production (env ISLE_CLOCK_URL).", valueName: "url")) var clockURL: String?
    @Option(name: .customLong("topic-idle"), help: ArgumentHelp("Hours a topic's broadcast channel may go without a broadcast (and with no live follower) before it is closed, unless the topic sets its own (env ISLE_TOPIC_IDLE; default 24).", valueName: "hours")) var topicIdle: Double?
    @Option(name: .customLong("channel-limit"), help: ArgumentHelp("Broadcast channels per app and APNs environment (env ISLE_CHANNEL_LIMIT; default 10000, Apple's limit). At the limit the idlest topic channel with no live follower is closed to make room.", valueName: "n")) var channelLimit: Int?
    @Option(name: .customLong("budget-per"), help: ArgumentHelp("Whose priority-10 budget a push spends: installation (default: the app on one phone, all its activities and channels together, as a phone may count it, so an alert Isle sends at 10 is never throttled there) or activity (each its own, a kinder reading) (env ISLE_BUDGET_PER).", valueName: "installation|activity")) var budgetPer: String?
    @Option(name: .customLong("keep-unused-activities"), help: ArgumentHelp("Days a live activity nothing was ever pushed to is kept after it started (env ISLE_KEEP_UNUSED_ACTIVITIES; default 1; at least 0.5).", valueName: "days")) var keepUnusedActivities: Double?
    @Option(name: .customLong("keep-unused-installations"), help: ArgumentHelp("Days an installation with no user and no activity is kept after it last reported (env ISLE_KEEP_UNUSED_INSTALLATIONS; default 7).", valueName: "days")) var keepUnusedInstallations: Double?

    /// 0.1, 3600: a number as a person writes it.
    static func plain(_ v: Double) -> String { v == v.rounded() ? String(Int(v)) : String(v) }

    /// Every setting a --config file may hold: its camelCase key and the flag it stands for
    /// (the file may use either name). `--sandbox` and `--production` are `apnsEnvironment`.
    static let configNames: [(key: String, flag: String)] = [
        ("host", "host"), ("port", "port"), ("database", "database"), ("masterKeyFile", "master-key-file"), ("apnsEnvironment", "apns-environment"),
        ("apnsURL", "apns-url"), ("apnsSandboxURL", "apns-sandbox-url"), ("apnsProductionURL", "apns-production-url"), ("apnsBroadcastURL", "apns-broadcast-url"),
        ("apnsManagementURL", "apns-management-url"), ("apnsCACert", "apns-ca-cert"), ("apnsTransport", "apns-transport"), ("concurrency", "concurrency"),
        ("logLevel", "log-level"), ("logFormat", "log-format"), ("accessLog", "access-log"), ("lease", "lease"), ("backendRate", "backend-rate"),
        ("deviceRate", "device-rate"), ("installationRate", "installation-rate"), ("addressRate", "address-rate"), ("authFailureRate", "auth-failure-rate"),
        ("maxLiveActivitiesPerInstallation", "max-live-activities-per-installation"), ("maxInstallationsPerUser", "max-installations-per-user"),
        ("maxNewInstallationsPerAddress", "max-new-installations-per-address"), ("maxNewActivitiesPerAddress", "max-new-activities-per-address"),
        ("maxConnectionsPerAddress", "max-connections-per-address"), ("headerTimeout", "header-timeout"), ("bodyTimeout", "body-timeout"), ("idleTimeout", "idle-timeout"),
        ("secureCookies", "secure-cookies"), ("tlsCert", "tls-cert"), ("tlsKey", "tls-key"), ("trustedProxies", "trusted-proxies"), ("webhookHosts", "webhook-hosts"),
        ("webhookAllowPrivate", "webhook-allow-private"), ("maxEventWait", "max-event-wait"), ("webhookDisableAfter", "webhook-disable-after"), ("keepEvents", "keep-events"), ("keepEndedActivities", "keep-ended-activities"),
        ("keepStaleInstallations", "keep-stale-installations"), ("keepUnusedActivities", "keep-unused-activities"), ("keepUnusedInstallations", "keep-unused-installations"),
        ("topicIdle", "topic-idle"), ("channelLimit", "channel-limit"), ("clockURL", "clock-url"), ("budgetPer", "budget-per"),
    ]
    static let configKeys: Set<String> = Set(configNames.map(\.key))
    /// A flag's name in the file ("apns-ca-cert") as its key ("apnsCACert").
    static let configAliases: [String: String] = Dictionary(uniqueKeysWithValues: configNames.filter { $0.key != $0.flag }.map { ($0.flag, $0.key) })

    func run() async throws {
        let settings = try settings()
        if checkConfig { return try await Self.check(settings) }
        var configuration = settings.configuration
        // Every connection is a file descriptor: the soft limit goes up to the hard one.
        FileDescriptorLimit.raise()
        // A file-size limit reached (ulimit -f) is an error on the write that hit it — a 503 for
        // the request, /ready not ready — not a signal that ends the server.
        signal(SIGXFSZ, SIG_IGN)
        // SIGHUP reads the config file again (ServeReload); trapped before anything runs, so a
        // SIGHUP that comes early does not end the process (its default action).
        let hangups = await UnixSignalsSequence(trapping: .sighup)
        let logs = LogControl(level: settings.level, format: settings.format)
        let diagnostics = logs.logger(label: "isle.tracing")
        let tracing = try ServeTracing.start(CLIContext.current.environment, logger: diagnostics)
        configuration.tracer = tracing?.tracer
        // With traces, every log line written inside a span carries its trace and span ids.
        let logger = logs.logger(label: "isle.server", metadataProvider: tracing == nil ? nil : OTel.makeLoggingMetadataProvider())
        let store = try DatabaseOption.store(configuration.database, logger: logger)
        let shown = DatabaseOption.shown(configuration.database)
        let reload = ServeReload(command: self, running: configuration, logs: logs, signals: hangups, logger: logger)
        try await store.withRunning {
            try await Self.checkKeys(store: store, masterKey: configuration.masterKey, path: shown)
            try await Self.serve(configuration, store: store, shown: shown, logger: logger, tracing: tracing, more: [reload], jsonLogs: settings.format == .json)
        }
    }

    /// `--check-config`: every setting, the TLS files and the master key (read by ``settings()``),
    /// the trace exporter's settings, and the database: reachable, its schema one this binary knows,
    /// the apps' keys opening with the master key. Nothing is changed.
    static func check(_ settings: ServeSettings) async throws {
        var problems = ServeTracing.problems(CLIContext.current.environment)
        var logger = Logger(label: "isle.check")
        logger.logLevel = .critical
        let c = settings.configuration
        let shown = DatabaseOption.shown(c.database)
        // Nothing is created: a database that is not there is a mistake to report, not one to make.
        do { try DatabaseOption.refuseMissing(c.database) } catch let e as CLIError {
            throw CLIError.configuration((problems + [e.message]).joined(separator: "\n"))
        }
        let store = try DatabaseOption.store(c.database, logger: logger)
        do {
            try await DatabaseOption.checkReachable(store)
            try await store.withRunning {
                let check = try await store.schemaCheck()
                if let problem = check.problem { problems.append("database: \(shown): \(problem)") }
                guard check.problem == nil else { return }
                guard check.current > 0 else {
                    problems.append("database: \(shown) holds no Isle tables: it is not Isle's database, or nothing was set up yet (isle app add creates them)")
                    return
                }
                let apps = try await store.apps()
                if apps.isEmpty { problems.append("database: \(shown) has no app yet: add one with isle app add --bundle-id … --key AuthKey_….p8 --key-id … --team-id …") }
                for app in apps where MasterKey.isSealed(app.keyPEM) {
                    guard let key = c.masterKey else {
                        problems.append("master key: the apps' .p8 keys are encrypted at rest and no master key was given. \(DatabaseOption.masterKeyHelp)")
                        break
                    }
                    for stored in [app.keyPEM] + app.environmentKeys.map(\.keyPEM) {
                        do { _ = try key.open(stored, bundleID: app.bundleID) } catch {
                            problems.append("master key: it does not open \(app.bundleID)'s .p8 key: is it the key the database was sealed with?")
                            break
                        }
                    }
                }
            }
        } catch let e as CLIError {
            problems.append(e.message)
        } catch {
            problems.append("database: \(shown): \(error)")
        }
        guard problems.isEmpty else { throw CLIError.configuration(problems.joined(separator: "\n")) }
        say("configuration ok: \(shown), log level \(settings.level), \(settings.format.rawValue) logs\(c.tls == nil ? "" : ", TLS")")
    }

    /// The server's configuration and log level from the config file, the environment and the
    /// flags (later ones win); every bad setting is reported at once.
    func settings() throws -> ServeSettings {
        let env = CLIContext.current.environment
        var file: JSONObject = [:]
        if let config = database.config {
            // It may hold the database URL (with its password): like the master key, it must be
            // private to its owner.
            let o = try DatabaseOption.readConfig(config)
            var named: JSONObject = [:]
            var unknown: [String] = []
            for (key, value) in o {
                let name = Self.configAliases[key] ?? key
                guard Self.configKeys.contains(name) else { unknown.append(key); continue }
                if named[name] != nil { throw CLIError("--config: \(name) is given twice (as \"\(name)\" and as \"\(Self.configNames.first { $0.key == name }!.flag)\"); keep one") }
                named[name] = value
            }
            if !unknown.isEmpty {
                throw CLIError("--config: unknown setting\(unknown.count == 1 ? "" : "s") \(unknown.sorted().map { "\"\($0)\"" }.joined(separator: ", ")); known: \(Self.configKeys.sorted().joined(separator: ", ")) (or the flags' names: apns-ca-cert, …)")
            }
            file = named
        }
        func pick(_ flag: String?, _ envName: String, _ key: String) -> String? {
            flag ?? env[envName].flatMap { $0.isEmpty ? nil : $0 } ?? file[key]?.stringValue ?? file[key]?.numberValue?.literal ?? file[key]?.boolValue.map(String.init)
        }
        // Every bad setting is reported at once, not one per run.
        var problems: [String] = []
        func rate(_ flag: String?, _ envName: String, _ key: String, _ name: String) -> RateLimit? {
            guard let text = pick(flag, envName, key) else { return nil }
            guard let r = RateLimit(parsing: text) else {
                problems.append("\(name): \"\(text)\" is not a rate; write 10/s, 10/s,burst=60 or off")
                return nil
            }
            return r
        }
        func number(_ flag: Double?, _ envName: String, _ key: String, _ name: String, _ range: ClosedRange<Double>, _ unit: String) -> Double? {
            guard let text = pick(flag.map { String($0) }, envName, key) else { return nil }
            guard let v = Double(text), range.contains(v) else {
                problems.append("\(name): \(text) must be \(unit) from \(Self.plain(range.lowerBound)) to \(Self.plain(range.upperBound))")
                return nil
            }
            return v
        }
        /// A whole number from the flag, the environment or the file, within `range`.
        func whole(_ flag: Int?, _ envName: String, _ key: String, _ name: String, _ range: ClosedRange<Int>, _ described: String) -> Int? {
            guard let text = pick(flag.map(String.init), envName, key) else { return nil }
            guard let v = Int(text), range.contains(v) else {
                problems.append("\(name): \(text) must be a whole number from \(described)")
                return nil
            }
            return v
        }
        func count(_ flag: Int?, _ envName: String, _ key: String, _ name: String) -> Int? {
            whole(flag, envName, key, name, 1...100_000, "1 to 100000")
        }
        var c = ServerConfiguration()
        c.build = (IsleVersion.version, IsleVersion.commit)
        c.host = pick(host, "ISLE_HOST", "host") ?? c.host
        if let p = pick(port.map(String.init), "ISLE_PORT", "port") {
            guard let n = Int(p), (0...65535).contains(n) else { throw CLIError("port: \(p) is not a port number") }
            c.port = n
        }
        c.database = database.database ?? env["ISLE_DATABASE"] ?? file["database"]?.stringValue ?? c.database
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
        if let r = rate(backendRate, "ISLE_BACKEND_RATE", "backendRate", "backend-rate") { c.rateLimits[.backend] = r }
        if let r = rate(deviceRate, "ISLE_DEVICE_RATE", "deviceRate", "device-rate") { c.rateLimits[.device] = r }
        if let r = rate(installationRate, "ISLE_INSTALLATION_RATE", "installationRate", "installation-rate") { c.deviceInstallationLimit = r }
        if let r = rate(addressRate, "ISLE_ADDRESS_RATE", "addressRate", "address-rate") { c.deviceAddressLimit = r }
        if let r = rate(authFailureRate, "ISLE_AUTH_FAILURE_RATE", "authFailureRate", "auth-failure-rate") { c.authFailureLimit = r }
        if let n = count(maxLiveActivities, "ISLE_MAX_LIVE_ACTIVITIES_PER_INSTALLATION", "maxLiveActivitiesPerInstallation", "max-live-activities-per-installation") {
            c.quotas.liveActivitiesPerInstallation = n
        }
        if let n = count(maxInstallationsPerUser, "ISLE_MAX_INSTALLATIONS_PER_USER", "maxInstallationsPerUser", "max-installations-per-user") { c.quotas.installationsPerUser = n }
        func allowance(_ flag: Int?, _ envName: String, _ key: String, _ name: String) -> Int? {
            whole(flag, envName, key, name, 0...1_000_000, "0 (no limit) to 1000000")
        }
        if let n = allowance(maxNewInstallations, "ISLE_MAX_NEW_INSTALLATIONS_PER_ADDRESS", "maxNewInstallationsPerAddress", "max-new-installations-per-address") {
            c.quotas.newInstallationsPerAddressPerHour = n
        }
        if let n = allowance(maxNewActivities, "ISLE_MAX_NEW_ACTIVITIES_PER_ADDRESS", "maxNewActivitiesPerAddress", "max-new-activities-per-address") {
            c.quotas.newActivitiesPerAddressPerHour = n
        }
        if let n = allowance(maxConnectionsPerAddress, "ISLE_MAX_CONNECTIONS_PER_ADDRESS", "maxConnectionsPerAddress", "max-connections-per-address") {
            c.quotas.connectionsPerAddress = n
        }
        if let v = number(headerTimeout, "ISLE_HEADER_TIMEOUT", "headerTimeout", "header-timeout", 0.1...3600, "seconds") { c.timeouts.header = .milliseconds(Int64(v * 1000)) }
        if let v = number(bodyTimeout, "ISLE_BODY_TIMEOUT", "bodyTimeout", "body-timeout", 0.1...3600, "seconds") { c.timeouts.body = .milliseconds(Int64(v * 1000)) }
        if let v = number(idleTimeout, "ISLE_IDLE_TIMEOUT", "idleTimeout", "idle-timeout", 0.1...86_400, "seconds") { c.timeouts.idle = .milliseconds(Int64(v * 1000)) }
        switch (pick(tlsCert, "ISLE_TLS_CERT", "tlsCert"), pick(tlsKey, "ISLE_TLS_KEY", "tlsKey")) {
        case (nil, nil): break
        case (let cert?, let key?):
            do {
                c.tls = try TLSCredentials(certificatePath: cert, keyPath: key)
                c.secureCookies = true
            } catch { problems.append("\(error)") }
        case (nil, _): problems.append("tls-key: give --tls-cert too (the certificate chain the key belongs to)")
        case (_, nil): problems.append("tls-cert: give --tls-key too (the certificate's private key)")
        }
        if let text = pick(trustedProxies, "ISLE_TRUSTED_PROXIES", "trustedProxies") {
            let parts = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            let ranges = parts.compactMap(AddressRange.init)
            if ranges.count != parts.count || ranges.isEmpty {
                problems.append("trusted-proxies: \"\(text)\" must be addresses or CIDR ranges, comma-separated, e.g. 127.0.0.1,10.0.0.0/8,fd00::/8")
            } else {
                c.trustedProxies = ranges
            }
        }
        if let v = number(maxEventWait, "ISLE_MAX_EVENT_WAIT", "maxEventWait", "max-event-wait", 0...30, "seconds") { c.webhooks.maximumPollWait = v }
        if let v = number(webhookDisableAfter, "ISLE_WEBHOOK_DISABLE_AFTER", "webhookDisableAfter", "webhook-disable-after", 0...365, "days") { c.webhooks.disableAfter = v * 86_400 }
        if let text = pick(webhookHosts, "ISLE_WEBHOOK_HOSTS", "webhookHosts") {
            let hosts = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            if hosts.isEmpty || hosts.contains(where: { $0.contains("/") || $0.contains(":") || $0.dropFirst($0.hasPrefix("*.") ? 2 : 0).contains("*") }) {
                problems.append("webhook-hosts: \"\(text)\" must be host names, comma-separated, e.g. hooks.example.com,*.internal.example.com")
            } else {
                c.webhooks.allowedHosts = hosts
            }
        }
        if let v = number(keepEvents, "ISLE_KEEP_EVENTS", "keepEvents", "keep-events", 1...3650, "days") { c.retention.events = v * 86_400 }
        if let v = number(keepEndedActivities, "ISLE_KEEP_ENDED_ACTIVITIES", "keepEndedActivities", "keep-ended-activities", 1...3650, "days") { c.retention.endedActivities = v * 86_400 }
        if let v = number(keepStaleInstallations, "ISLE_KEEP_STALE_INSTALLATIONS", "keepStaleInstallations", "keep-stale-installations", 1...3650, "days") { c.retention.staleInstallations = v * 86_400 }
        if let text = pick(clockURL, "ISLE_CLOCK_URL", "clockURL") {
            if let u = URL(string: text), u.scheme == "http", ["127.0.0.1", "localhost", "::1", "[::1]"].contains(u.host ?? "") {
                c.clockURL = text
            } else {
                problems.append("clock-url: \"\(text)\" must be an isle sim control API on this machine, such as http://127.0.0.1:8480")
            }
        }
        if let v = number(topicIdle, "ISLE_TOPIC_IDLE", "topicIdle", "topic-idle", 1.0 / 60...720, "hours") { c.topicIdle = v * 3600 }
        if let v = whole(channelLimit, "ISLE_CHANNEL_LIMIT", "channelLimit", "channel-limit", 1...10_000, "1 to 10000 (Apple's limit)") { c.channelLimit = v }
        if let text = pick(budgetPer, "ISLE_BUDGET_PER", "budgetPer") {
            if let scope = BudgetScope(rawValue: text.lowercased()) { c.budgetScope = scope } else {
                problems.append("budget-per: \"\(text)\" must be installation (the app on one phone, the default) or activity")
            }
        }
        if let v = number(keepUnusedActivities, "ISLE_KEEP_UNUSED_ACTIVITIES", "keepUnusedActivities", "keep-unused-activities", 0.5...3650, "days") { c.retention.unusedActivities = v * 86_400 }
        if let v = number(keepUnusedInstallations, "ISLE_KEEP_UNUSED_INSTALLATIONS", "keepUnusedInstallations", "keep-unused-installations", 1...3650, "days") { c.retention.unusedInstallations = v * 86_400 }
        if let text = pick(webhookAllowPrivate ? "true" : nil, "ISLE_WEBHOOK_ALLOW_PRIVATE", "webhookAllowPrivate") {
            switch text.lowercased() {
            case "true", "1", "yes": c.webhooks.allowPrivate = true
            case "false", "0", "no": c.webhooks.allowPrivate = false
            default: problems.append("webhook-allow-private: \"\(text)\" is not true or false")
            }
        }
        if let text = pick(secureCookies ? "true" : nil, "ISLE_SECURE_COOKIES", "secureCookies") {
            switch text.lowercased() {
            case "true", "1", "yes": c.secureCookies = true
            case "false", "0", "no": c.secureCookies = false
            default: problems.append("secure-cookies: \"\(text)\" is not true or false")
            }
        }
        if let text = pick(accessLog ? "true" : nil, "ISLE_ACCESS_LOG", "accessLog") {
            switch text.lowercased() {
            case "true", "1", "yes": c.accessLog.on = true
            case "false", "0", "no": c.accessLog.on = false
            default: problems.append("access-log: \"\(text)\" is not true or false")
            }
        }
        let level = pick(logLevel, "ISLE_LOG_LEVEL", "logLevel") ?? "info"
        let l = Logger.Level(rawValue: level)
        if l == nil { problems.append("log-level: \(level) is not one of trace, debug, info, notice, warning, error, critical") }
        let formatName = pick(logFormat, "ISLE_LOG_FORMAT", "logFormat") ?? "text"
        let format = LogFormat(rawValue: formatName)
        if format == nil { problems.append("log-format: \"\(formatName)\" is not text or json") }
        do { c.masterKey = try database.masterKey(configFile: file["masterKeyFile"]?.stringValue) } catch { problems.append("\(error)") }
        guard problems.isEmpty, let l, let format else { throw CLIError(problems.joined(separator: "\n")) }
        return ServeSettings(configuration: c, level: l, format: format)
    }

    /// `jsonLogs`: the banner is a log record too (every line of the output is one JSON object).
    static func serve(_ c: ServerConfiguration, store: any IsleStore, shown: String, logger: Logger, tracing: ServeTracing? = nil, more: [any Service] = [], jsonLogs: Bool = false) async throws {
        // A simulated clock (end-to-end tests): the server's time is the simulator's.
        var followed: SimulatorClock?
        if let url = c.clockURL {
            do { followed = try await SimulatorClock.follow(url, logger: logger) } catch { throw CLIError("clock-url: \(error)") }
            logger.warning("the server's clock follows the simulator at \(url) (--clock-url): for tests only")
        }
        let app = IsleServerApp(configuration: c, store: store, clock: followed?.clock ?? SystemWallClock(), logger: logger)
        // Stopped in reverse order: the span exporter last, after the server's last spans.
        let services: [any Service] = (tracing.map { [$0.service] } ?? []) + more + (followed.map { [$0] } ?? []) + [app]
        let group = ServiceGroup(configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            let p = await app.port()
            guard p != 0 else {
                // It stopped before listening (another server holds the database, the port is
                // taken, …): the service group's error says why.
                do { try await tasks.next() } catch {
                    let text = "\(error)"
                    if text.contains("Address already in use") || text.contains("errno: 98") || text.contains("EADDRINUSE") {
                        throw CLIError.configuration("port \(c.port) on \(c.host) is in use: stop what holds it (another isle serve?), or give another --port")
                    }
                    if text.contains("Permission denied") || text.contains("errno: 13") {
                        throw CLIError.configuration("port \(c.port) on \(c.host) needs privileges this process does not have: give a port above 1023 (and a reverse proxy in front)")
                    }
                    throw error
                }
                throw CLIError("the server stopped before it could listen", exitCode: ExitStatus.failure)
            }
            let banner = try await banner(c, port: p, store: store, shown: shown, tracing: tracing?.destination)
            if jsonLogs {
                logger.notice("listening", metadata: ["port": "\(p)", "banner": .array(banner.split(separator: "\n").map { .string(String($0)) })])
            } else {
                say(banner)
            }
            try await tasks.next()
            logger.notice("stopped")
        }
    }
}

extension ServeCommand {
    /// What `isle serve` prints once it listens: where the API and the console are, the database,
    /// where each environment's pushes go, and the next step when something is missing.
    static func banner(_ c: ServerConfiguration, port: Int, store: any IsleStore, shown: String, tracing: String? = nil) async throws -> String {
        let base = "\(c.tls == nil ? "http" : "https")://\(c.host.contains(":") ? "[\(c.host)]" : c.host):\(port)"
        let apps = try await store.apps()
        let keys = try await store.apiKeys(bundleID: nil).filter { $0.revokedAt == nil }
        var lines = [
            "Isle server on \(base)",
            "  API:       \(base)/v1   (OpenAPI document: \(base)/openapi.json)",
            "  console:   \(base)/console   (sign in with an admin key)",
            "  database:  \(shown)",
        ]
        for e in PushEnvironment.allCases {
            let t = c.target(e).endpoints
            lines.append("  APNs \(e.rawValue)\(e == c.defaultEnvironment ? " (default)" : ""): \(t.device)   broadcast \(t.broadcast)   channels \(t.channelManagement)")
        }
        lines.append("  apps:      \(apps.isEmpty ? "none yet" : apps.map(\.bundleID).joined(separator: ", "))")
        if let tracing { lines.append("  tracing:   \(tracing)") }
        let db = shown.isEmpty ? "" : " --database \(shown)"
        if apps.isEmpty {
            lines.append("Next: add your app: isle app add\(db) --bundle-id <id> --key AuthKey_<KEYID>.p8 --key-id <KEYID> --team-id <TEAMID> --schema <attributes>.schema.json")
        } else if let app = apps.first(where: { a in !keys.contains { $0.bundleID == a.bundleID && $0.scope == .backend } }) {
            lines.append("Next: a key for \(app.bundleID)'s backend: isle key create\(db) --bundle-id \(app.bundleID) --scope backend (device and admin keys alike)")
        } else if !keys.contains(where: \.scope.actsInConsole) {
            lines.append("Next: a key for the console: isle key create\(db) --bundle-id \(apps[0].bundleID) --scope admin")
        }
        return lines.joined(separator: "\n")
    }

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
                for stored in [app.keyPEM] + app.environmentKeys.map(\.keyPEM) {
                    do { _ = try masterKey.open(stored, bundleID: app.bundleID) } catch {
                        throw CLIError("master key: \(error.message); give the master key these apps were added with")
                    }
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
    static let configuration = CommandConfiguration(commandName: "app", abstract: "Register apps with the server's database.", subcommands: [Add.self, List.self, Remove.self, SchemaCommand.self, TicketKeyCommand.self, EnvironmentKeyCommand.self])

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Add an app (its provider key and attributes-type schemas), or change one: a new key, more schemas.",
            discussion: "A new app needs --key, --key-id and --team-id. For an app already there they are optional (give all three to replace its key); each --schema adds that attributes type or replaces the schema of the same type, and the app's other types are kept. isle app schema lists and removes them. This command creates the database if it is not there yet.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: ArgumentHelp("The .p8 token-signing key (required for a new app).", valueName: "file")) var key: String?
        @Option(name: .customLong("key-id")) var keyID: String?
        @Option(name: .customLong("team-id")) var teamID: String?
        @Option(parsing: .singleValue, help: ArgumentHelp("An attributes-type schema (repeat for more); added to the app's others.", valueName: "file")) var schema: [String] = []
        @Flag(name: .customLong("frequent-updates"), inversion: .prefixedNo, help: "The app declares NSSupportsLiveActivitiesFrequentUpdates (or no longer does); an app already there keeps what it had without either.") var frequentUpdates: Bool?

        func run() async throws {
            guard !bundleID.isEmpty, !bundleID.contains(".push-type."), !bundleID.contains(where: \.isWhitespace) else { throw CLIError("--bundle-id: give the bare bundle id, e.g. com.example.pizza") }
            let given = [("--key", key), ("--key-id", keyID), ("--team-id", teamID)]
            if given.contains(where: { $0.1 != nil }), let missing = Optional(given.filter { $0.1 == nil }.map(\.0)), !missing.isEmpty {
                throw CLIError("\(missing.joined(separator: " and ")): a provider key is given with all three of --key, --key-id and --team-id")
            }
            var newKey: (pem: String, keyID: String, teamID: String)?
            if let key, let keyID, let teamID {
                do { _ = try APNsCredentials(keyID: keyID, teamID: teamID, keyFile: key) } catch { throw CLIError("--key: \(error.reason)") }
                newKey = (String(decoding: try Inputs.read(key, flag: "--key"), as: UTF8.self), keyID, teamID)
            }
            var schemas: [ActivitySchema] = []
            for path in schema { schemas.append(try Inputs.schema(path)!) }
            if let twice = Dictionary(grouping: schemas, by: \.attributesType).first(where: { $0.value.count > 1 })?.key {
                throw CLIError("--schema: two files describe \(twice); give one")
            }
            // Without a key the app must be there already, and so must its database: none is made
            // only to be refused.
            if newKey == nil { try DatabaseOption.refuseMissing(database.path) }
            // The master key seals a new .p8; an app whose key stays needs none.
            let masterKey = try database.masterKey()
            if newKey != nil, masterKey == nil {
                throw CLIError("app add: the .p8 key is stored encrypted and needs a master key. \(DatabaseOption.masterKeyHelp)")
            }
            let (shown, bundleID, frequentUpdates) = (database.shownPath, bundleID, frequentUpdates)
            let (replacement, added) = (newKey, schemas)
            let outcome = try await database.withStore(creates: true) { store -> String in
                if let masterKey { try await ServeCommand.checkKeys(store: store, masterKey: masterKey, path: shown) }
                let existing = try await store.app(bundleID)
                guard existing != nil || replacement != nil else {
                    throw CLIError("--key, --key-id and --team-id: \(bundleID) is not in \(shown) yet, and a new app needs its provider key (isle app list shows the apps there)")
                }
                var record = existing ?? AppRecord(bundleID: bundleID, teamID: "", keyID: "", keyPEM: "", frequentUpdatesDeclared: frequentUpdates ?? false, schemas: [], createdAt: Date())
                if let replacement, let masterKey {
                    record.keyPEM = masterKey.seal(replacement.pem, bundleID: bundleID)
                    record.keyID = replacement.keyID
                    record.teamID = replacement.teamID
                }
                if let frequentUpdates { record.frequentUpdatesDeclared = frequentUpdates }
                // Schemas are added or replaced by type, never dropped (isle app schema remove drops one).
                let notes = AppCommand.merge(added, into: &record.schemas)
                // Replacing an app keeps its ticket keys and its environments' keys (isle app
                // ticket-key and isle app environment-key manage them).
                try await store.upsertApp(record)
                let what = existing == nil ? "added" : replacement == nil ? "updated" : "updated with a new key"
                return "app \(bundleID) \(what) in \(shown) (key \(record.keyID), team \(record.teamID)); attributes types: \(notes.isEmpty ? "none yet (isle app schema add)" : notes.joined(separator: ", "))"
            }
            say(outcome)
        }
    }

    /// Adds each schema, or replaces the one of its attributes type; the others stay. Says what
    /// became of each type: added, replaced, unchanged, kept.
    static func merge(_ given: [ActivitySchema], into schemas: inout [ActivitySchema]) -> [String] {
        var notes: [String] = []
        for s in given {
            if let i = schemas.firstIndex(where: { $0.attributesType == s.attributesType }) {
                notes.append(schemas[i] == s ? "\(s.attributesType) (unchanged)" : "\(s.attributesType) (replaced)")
                schemas[i] = s
            } else {
                notes.append("\(s.attributesType) (added)")
                schemas.append(s)
            }
        }
        let kept = schemas.map(\.attributesType).filter { t in !given.contains { $0.attributesType == t } }
        return notes + kept.map { "\($0) (kept)" }
    }

    /// `isle app schema list|add|remove`: an app's attributes-type schemas, without its key.
    struct SchemaCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "schema",
            abstract: "List, add or remove an app's attributes-type schemas (no provider key needed).",
            discussion: "The server checks every start and update of an attributes type against its schema, and refuses types it has none for (docs/payloads.md). A running isle serve sees a change within a second.",
            subcommands: [SchemaList.self, SchemaAdd.self, SchemaRemove.self])
    }

    struct SchemaList: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "list", abstract: "List an app's attributes types and their fields.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Flag(help: "Print each schema as JSON (the file isle app schema add takes).") var json = false

        func run() async throws {
            let (bundleID, shown) = (bundleID, database.shownPath)
            guard let app = try await database.withStore({ try await $0.app(bundleID) }) else {
                throw CLIError("--bundle-id: no app \(bundleID) in \(shown) (isle app list shows the apps)")
            }
            if app.schemas.isEmpty { say("\(bundleID) has no attributes-type schema yet: isle app schema add --bundle-id \(bundleID) --schema <file>") }
            for s in app.schemas.sorted(by: { $0.attributesType < $1.attributesType }) {
                if json { say(s.jsonValue.jsonString); continue }
                func fields(_ o: JSONValue?) -> String { o?.objectValue.map { $0.keys.sorted().joined(separator: ", ") } ?? "" }
                say("\(s.attributesType)  attributes: \(fields(s.jsonValue["attributes"]))  content-state: \(fields(s.jsonValue["contentState"]))")
            }
        }
    }

    struct SchemaAdd: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "add", abstract: "Add attributes-type schemas to an app, or replace the schema of a type it has; its other types stay.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(parsing: .singleValue, help: ArgumentHelp("An attributes-type schema (repeat for more).", valueName: "file")) var schema: [String] = []

        func validate() throws {
            if schema.isEmpty { throw ValidationError("--schema: give at least one schema file") }
        }

        func run() async throws {
            var schemas: [ActivitySchema] = []
            for path in schema { schemas.append(try Inputs.schema(path)!) }
            if let twice = Dictionary(grouping: schemas, by: \.attributesType).first(where: { $0.value.count > 1 })?.key {
                throw CLIError("--schema: two files describe \(twice); give one")
            }
            let (bundleID, shown, given) = (bundleID, database.shownPath, schemas)
            let notes = try await database.withStore { store -> [String] in
                guard var app = try await store.app(bundleID) else {
                    throw CLIError("--bundle-id: no app \(bundleID) in \(shown); add it first with isle app add (isle app list shows the apps)")
                }
                let notes = AppCommand.merge(given, into: &app.schemas)
                try await store.upsertApp(app)
                return notes
            }
            say("app \(bundleID) in \(shown): attributes types \(notes.joined(separator: ", "))")
        }
    }

    struct SchemaRemove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "remove",
            abstract: "Remove an attributes type's schema from an app.",
            discussion: "The server then refuses starts and registrations of that type (unknownAttributesType); activities of it that are already live keep their updates checked against nothing, so end them first.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(name: .customLong("attributes-type"), help: "The type to remove, e.g. PizzaDeliveryAttributes.") var attributesType: String

        func run() async throws {
            let (bundleID, shown, type) = (bundleID, database.shownPath, attributesType)
            let left = try await database.withStore { store -> [String] in
                guard var app = try await store.app(bundleID) else {
                    throw CLIError("--bundle-id: no app \(bundleID) in \(shown) (isle app list shows the apps)")
                }
                guard app.schemas.contains(where: { $0.attributesType == type }) else {
                    let known = app.schemas.map(\.attributesType).sorted()
                    throw CLIError("--attributes-type: \(bundleID) has no schema for \(type)\(known.isEmpty ? "" : "; it has \(known.joined(separator: ", "))")")
                }
                app.schemas.removeAll { $0.attributesType == type }
                try await store.upsertApp(app)
                return app.schemas.map(\.attributesType)
            }
            say("removed \(type) from \(bundleID) in \(shown); attributes types left: \(left.isEmpty ? "none" : left.joined(separator: ", "))")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List registered apps.")
        @OptionGroup var database: DatabaseOption
        func run() async throws {
            for a in try await database.withStore({ try await $0.apps() }) {
                let scoped = a.environmentKeys.sorted { $0.environment.rawValue < $1.environment.rawValue }.map { "  \($0.environment.rawValue) key \($0.keyID) team \($0.teamID)" }.joined()
                say("\(a.bundleID)  key \(a.keyID)  team \(a.teamID)\(scoped)  types: \(a.schemas.map(\.attributesType).joined(separator: ", "))")
            }
        }
    }
}

extension AppCommand {
    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove an app and everything the server keeps for it.",
            discussion: "Its key and schemas, API keys, installations and tokens, activities, queued and sent pushes, delivery records, channels (on Isle's side: delete them on APNs first with isle channel delete), events, webhooks, audit log, history and pause go in one transaction. Without --yes it only counts them. Pushes not yet sent are never sent; a running server stops at once (its in-flight sends finish and are not recorded).")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Flag(help: "Remove it; without this, only say what would go.") var yes = false

        func run() async throws {
            let (bundleID, yes, shown) = (bundleID, yes, database.shownPath)
            let removed = try await database.withStore { store -> [String: Int]? in
                guard try await store.app(bundleID) != nil else { return nil }
                return yes ? try await store.removeApp(bundleID) : try await store.appRowCounts(bundleID)
            }
            guard let removed else { throw CLIError("--bundle-id: no app \(bundleID) in \(shown) (isle app list shows the apps)") }
            let counts = Schema.appRows.map(\.table).filter { $0 != "apps" && (removed[$0] ?? 0) > 0 }.map { "\(removed[$0]!) \($0)" }
            let what = counts.isEmpty ? "no other rows" : counts.joined(separator: ", ")
            guard yes else {
                say("app \(bundleID) in \(shown) has \(what)")
                throw CLIError("nothing removed: add --yes to remove \(bundleID) and all of the above")
            }
            say("removed app \(bundleID) from \(shown), with \(what)")
        }
    }
}

struct KeyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "key", abstract: "Create, list and revoke API keys.", subcommands: [Create.self, List.self, Revoke.self])

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List API keys: id, app, scope, created, revoked (never a secret: only hashes are stored).")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id"), help: "Only this app's keys.") var bundleID: String?
        func run() async throws {
            let bundleID = bundleID
            let keys = try await database.withStore { try await $0.apiKeys(bundleID: bundleID) }
            if keys.isEmpty {
                say(bundleID.map { "no key for \($0) yet: isle key create --bundle-id \($0) --scope backend" } ?? "no key yet: isle key create --bundle-id <app> --scope backend")
                return
            }
            let f = ISO8601DateFormatter()
            for k in keys {
                say("\(k.id)  \(k.bundleID)  \(k.scope.rawValue)  created \(f.string(from: k.createdAt))\(k.revokedAt.map { "  revoked \(f.string(from: $0))" } ?? "")")
            }
        }
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an API key; the secret is printed once and only its hash is stored.")
        @OptionGroup var database: DatabaseOption
        @Option(name: .customLong("bundle-id")) var bundleID: String
        @Option(help: "backend (start, update, end, read), device (register tokens and state), admin (the web console at /console for this app, nothing else), viewer (the console for this app, read-only: every page, no action) or server-admin (the console for every app, with an app switcher; it opens on this app).") var scope: String

        func run() async throws {
            guard let s = APIKeyScope(rawValue: scope) else { throw CLIError("--scope: use backend, device, admin, viewer or server-admin") }
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
