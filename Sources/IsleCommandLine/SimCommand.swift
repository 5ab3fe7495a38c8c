import ArgumentParser
import Crypto
import Foundation
import IsleHTTP2Server
import IsleCore
import IsleSimulator
import Logging
import ServiceLifecycle

struct SimCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sim",
        abstract: "Run IsleSimulator: a strict fake APNs (HTTP/2 + TLS) and simulated iPhones, with a JSON control API.",
        discussion: "Prints the APNs URL, the CA certificate to trust, the control URL and a ready-made provider key. The device numbers (budgets, lifetimes, limits) are Isle's model of ActivityKit and WidgetKit, not values Apple publishes; every one can be changed here."
    )

    @Option(help: "Address to listen on (loopback only unless --allow-non-loopback).")
    var host = "127.0.0.1"
    @Option(name: .customLong("apns-port"), help: "Port of the fake APNs' device host (0 = any free port).")
    var apnsPort = 0
    @Option(name: .customLong("broadcast-port"), help: "Port of its broadcast host (0 = any free port).")
    var broadcastPort = 0
    @Option(name: .customLong("management-port"), help: "Port of its channel-management host (0 = any free port).")
    var managementPort = 0
    @Flag(name: .customLong("single-host"), help: "Serve device pushes, broadcasts and channel management on --apns-port alone (for clients with one APNs URL).")
    var singleHost = false
    @Option(name: .customLong("control-port"), help: "Port of the control API (0 = any free port).")
    var controlPort = 0
    @Flag(name: .customLong("allow-non-loopback"), help: "Allow listening on a non-loopback address (the control API has no authentication).")
    var allowNonLoopback = false
    @Flag(help: "Serve the production environment instead of the sandbox.")
    var production = false
    @Option(help: ArgumentHelp("Folder for the CA certificate and the provider key (default: a new temporary folder).", valueName: "dir"))
    var dir: String?
    @Option(name: .customLong("cert"), help: ArgumentHelp("Serve this certificate chain (PEM) instead of generating one.", valueName: "file"))
    var certificate: String?
    @Option(name: .customLong("cert-key"), help: ArgumentHelp("The private key (PEM) for --cert.", valueName: "file"))
    var certificateKey: String?
    @Option(name: .customLong("hostname"), parsing: .singleValue, help: ArgumentHelp("Another DNS name for the server certificate, beside localhost, 127.0.0.1 and ::1 (repeat for more) — e.g. api.sandbox.push.apple.com for a library whose APNs host is fixed, resolved to 127.0.0.1 on the test machine.", valueName: "name"))
    var hostnames: [String] = []
    @Option(name: .customLong("ca-cert"), help: ArgumentHelp("Sign the server certificate with this CA (PEM) — one your machines already trust — instead of a CA of the simulator's; with --ca-key.", valueName: "file"))
    var caCertificate: String?
    @Option(name: .customLong("ca-key"), help: ArgumentHelp("The private key (PEM) of --ca-cert.", valueName: "file"))
    var caKey: String?
    @Flag(name: .customLong("json"), help: "Print where it listens as one JSON line (apnsURL, broadcastURL, managementURL, controlURL, caPath, keyPath, keyID, teamID, environment, virtualClock, devices) instead of the prose, for scripts.")
    var json = false
    @Flag(name: .customLong("virtual-clock"), help: "Start a virtual clock at now that only moves through POST /clock/advance.")
    var virtualClock = false
    @Option(name: .customLong("provider-token-clock"), help: ArgumentHelp("With --virtual-clock, which clock judges a provider token's iat: either (default: the virtual clock or real time, so a sender on its own clock is never refused because the virtual one stood still or jumped) or virtual (the virtual clock alone, for a sender that follows it, such as isle serve --clock-url).", valueName: "either|virtual"))
    var providerTokenClock: String?

    @Option(name: .customLong("key"), help: ArgumentHelp("Accept this provider key (.p8) instead of generating one — e.g. the other environment's simulator's, as Apple accepts one key on both.", valueName: "file"))
    var providerKey: String?
    @Flag(name: .customLong("scoped-key"), help: "Limit the provider key to this simulator's environment, as an environment-scoped key of Apple's is: used on the other environment's host it is refused (403 BadEnvironmentKeyIdInToken).")
    var scopedKey = false
    @Option(name: .customLong("key-id"), help: "Key id of the generated provider key.")
    var keyID = "SIMKEY0001"
    @Option(name: .customLong("team-id"), help: "Team id of the generated provider key.")
    var teamID = "SIMTEAM001"

    @Option(name: .customLong("device"), help: "Create a device with this name at start.")
    var deviceName: String?
    @Option(name: .customLong("os-version"), help: "The --device's iOS version (push-to-start needs 17.2, channels 18, widget pushes 26).")
    var osVersion = "26.0"
    @Option(name: .customLong("model"), help: "The --device's model (an iPhone without a Dynamic Island shows alerts as a banner).")
    var model = "iPhone 16 Pro"
    @Option(name: .customLong("app"), help: "Install this bundle id on that device.")
    var app: String?
    @Option(name: .customLong("schema"), parsing: .singleValue, help: ArgumentHelp("An attributes-type schema for --app (repeat for more).", valueName: "file"))
    var schemas: [String] = []
    @Flag(name: .customLong("frequent-updates"), help: "The --app declares NSSupportsLiveActivitiesFrequentUpdates.")
    var frequentUpdates = false

    @Option(name: .customLong("hourly-budget"), help: "Priority-10 pushes per app per hour (per activity with --budget-per-activity).")
    var hourlyBudget = 15
    @Option(name: .customLong("frequent-hourly-budget"), help: "…with frequent updates declared and on.")
    var frequentHourlyBudget = 120
    @Option(name: .customLong("low-priority-delay"), help: "Seconds before a priority-5 push is applied (default: a seeded 0.5–3 s; 0: at once).")
    var lowPriorityDelay: Double?
    @Option(name: .customLong("low-priority-delay-max"), help: "With it, each priority-5 push waits a seeded random time between --low-priority-delay and this.")
    var lowPriorityDelayMaximum: Double?
    @Option(name: .customLong("push-token-delay"), help: "Seconds after Activity.request before the push token arrives on pushTokenUpdates.")
    var pushTokenDelay: Double = 0
    @Option(name: .customLong("push-to-start-limit"), help: "Push-to-starts one app may make on one device per --push-to-start-window; later ones start nothing (0: no limit; Apple publishes no figure, about ten is reported).")
    var pushToStartLimit = 10
    @Option(name: .customLong("push-to-start-window"), help: "Seconds of the push-to-start window.")
    var pushToStartWindow: Double = 3600
    @Flag(name: .customLong("realistic"), help: "Isle's realistic model: priority 5 waits 1–60 s (seeded), tokens arrive 0.5 s after request.")
    var realistic = false
    @Option(name: .customLong("seed"), help: "Seeds the model's random choices, so a run can be replayed.")
    var seed: UInt64 = 1
    @Option(name: .customLong("max-activities-per-app")) var maxPerApp = 5
    @Option(name: .customLong("max-activities-per-device")) var maxPerDevice = 10
    @Option(name: .customLong("max-active-hours")) var maxActiveHours: Double = 8
    @Option(name: .customLong("max-ended-hours")) var maxEndedHours: Double = 4
    @Flag(name: .customLong("strict-timestamps"), help: "Ignore a push whose timestamp equals the last applied one.")
    var strictTimestamps = false
    @Flag(name: .customLong("withhold-update-token"), help: "Withhold a push-started activity's update token until POST …/allow.")
    var withholdUpdateToken = false
    @Option(name: .customLong("per-token-limit"), help: "Pushes to one device token within --per-token-window before APNs answers 429 TooManyRequests (0: no limit).")
    var perTokenLimit = 40
    @Option(name: .customLong("per-token-window"), help: "Seconds of the per-token window.")
    var perTokenWindow: Double = 10
    @Flag(name: .customLong("budget-per-activity"), help: "Count the priority-10 budget per activity instead of per app (Apple does not say which).")
    var budgetPerActivity = false
    @Flag(name: .customLong("token-after-force-quit"), help: "Hand a push-started activity its update token even while its app is force-quit (by default it waits until the app is opened).")
    var tokenAfterForceQuit = false
    @Flag(name: .customLong("token-while-terminated"), help: "Hand a push-started activity its update token while its app is not running (by default it waits until the app is opened, as developers report).")
    var tokenWhileTerminated = false
    @Option(name: .customLong("widget-daily-budget"), help: "Most widget reloads per widget per 24 h; each widget draws its budget (seeded) from --widget-daily-budget-min to this (WidgetKit: 40 to 70 for a widget viewed often).")
    var widgetDailyBudget = 70
    @Option(name: .customLong("widget-daily-budget-min"), help: "Fewest reloads a widget's daily budget is drawn with (equal to --widget-daily-budget: a fixed budget).")
    var widgetDailyBudgetMinimum: Int?

    // Never kinder than Apple (docs/simulator.md): each seeded by --seed, each default the stricter reading.
    @Flag(name: .customLong("lenient"), help: "Turn off every 'never kinder than Apple' choice below (widget pushes inside the 200, a fixed widget budget, no GOAWAY for errors, no connection-rate limit, no token changes by themselves, no reordering, no priority-5 loss, always the newest stored push); any of the options below given with it still changes its own.")
    var lenient = false
    @Option(name: .customLong("widget-push-delay-max"), help: "A widgets push reloads a seeded 1 s to this many seconds after APNs' 200 (WidgetKit delivers them opportunistically; 0: inside the 200).")
    var widgetPushDelayMaximum: Double?
    @Option(name: .customLong("connection-error-limit"), help: "Error points on one connection (a 4xx but 410: 1; BadDeviceToken: 4) that bring a GOAWAY (APNs drops connections with too many errors; 0: never).")
    var connectionErrorLimit: Int?
    @Option(name: .customLong("connection-rate-limit"), help: "New connections per --connection-rate-window before more are closed at once (APNs treats rapid connect/disconnect as a denial of service; 0: no limit).")
    var connectionRateLimit: Int?
    @Option(name: .customLong("connection-rate-window"), help: "Seconds of the connection-rate window.")
    var connectionRateWindow: Double?
    @Option(name: .customLong("token-rotation"), help: ArgumentHelp("Hours after which an activity's push token changes by itself, drawn (seeded) from MIN-MAX, or off (Apple: it may change throughout the activity).", valueName: "MIN-MAX|off"))
    var tokenRotation: String?
    @Option(name: .customLong("push-to-start-token-rotation"), help: ArgumentHelp("The same for push-to-start, widget and control push tokens (Apple: they may change over time).", valueName: "MIN-MAX|off"))
    var pushToStartTokenRotation: String?
    @Option(name: .customLong("reorder"), help: "Share (0–1) of Live Activity pushes APNs holds a moment, so a later push to the same token may arrive first (Apple: APNs may reorder).")
    var reorder: Double?
    @Option(name: .customLong("reorder-delay-max"), help: "Longest such hold, in seconds.")
    var reorderDelayMaximum: Double?
    @Option(name: .customLong("low-priority-loss"), help: "Share (0–1) of priority-5 pushes never delivered (Apple: in some cases not delivered).")
    var lowPriorityLoss: Double?
    @Flag(name: .customLong("accept-loose-iat"), help: "Take a provider token whose iat is a string of digits or a fraction (as kalyke-apns and pyapns-client send; Apple documents a number of seconds, and APNs appears to accept these). Default: 403 InvalidProviderToken.")
    var acceptLooseIssuedAt = false
    @Option(name: .customLong("stored-not-newest"), help: "Share (0–1) of pushes to an offline device where APNs keeps the earlier stored push instead of the newer (Apple: in most cases the latest).")
    var storedNotNewest: Double?

    /// `MIN-MAX` hours (or `off`) as a range of seconds.
    static func hours(_ text: String, flag: String) throws -> ClosedRange<TimeInterval>? {
        if text == "off" { return nil }
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let lo = Double(parts[0]), let hi = Double(parts[1]), lo.isFinite, hi.isFinite, lo > 0, hi >= lo, hi <= 24 * 365 else {
            throw CLIError("\(flag) \(text): expected MIN-MAX hours such as 1-7 (MIN above 0, MAX at least MIN), or off")
        }
        return (lo * 3600)...(hi * 3600)
    }

    func validate() throws {
        if (certificate == nil) != (certificateKey == nil) { throw CLIError("--cert and --cert-key go together") }
        if (caCertificate == nil) != (caKey == nil) { throw CLIError("--ca-cert and --ca-key go together") }
        if certificate != nil, caCertificate != nil || !hostnames.isEmpty { throw CLIError("--cert serves a certificate as it is; --ca-cert and --hostname make one, so they do not go with it") }
        for name in hostnames where !CertificateAuthority.isValidDNSName(name) {
            throw CLIError("--hostname \(name): not a DNS name (letters, digits, hyphens and dots, such as api.sandbox.push.apple.com; a leading *. for a wildcard; not an address — 127.0.0.1 and ::1 are always in the certificate)")
        }
        if (deviceName == nil) && (app != nil || !schemas.isEmpty) { throw CLIError("--app and --schema need --device") }
        for (name, v) in [("--hourly-budget", hourlyBudget), ("--frequent-hourly-budget", frequentHourlyBudget), ("--max-activities-per-app", maxPerApp), ("--max-activities-per-device", maxPerDevice), ("--widget-daily-budget", widgetDailyBudget)] where v < 1 {
            throw CLIError("\(name) must be at least 1")
        }
        if (lowPriorityDelay ?? 0) < 0 || maxActiveHours <= 0 || maxEndedHours < 0 || pushTokenDelay < 0 { throw CLIError("durations must be positive") }
        if pushToStartLimit < 0 { throw CLIError("--push-to-start-limit must be 0 (no limit) or more") }
        if perTokenLimit < 0 { throw CLIError("--per-token-limit must be 0 (no limit) or more") }
        if !(perTokenWindow > 0 && perTokenWindow <= 3600) { throw CLIError("--per-token-window must be more than 0 and at most 3600 seconds") }
        if !(pushToStartWindow > 0 && pushToStartWindow <= 7 * 86400) { throw CLIError("--push-to-start-window must be more than 0 and at most 604800 seconds") }
        if let m = lowPriorityDelayMaximum, m < (lowPriorityDelay ?? 0) { throw CLIError("--low-priority-delay-max must be at least --low-priority-delay") }
        if ![apnsPort, broadcastPort, managementPort, controlPort].allSatisfy({ (0...65535).contains($0) }) { throw CLIError("ports are 0…65535") }
        for (name, p) in [("--reorder", reorder), ("--low-priority-loss", lowPriorityLoss), ("--stored-not-newest", storedNotNewest)] {
            if let p, !(p >= 0 && p <= 1) { throw CLIError("\(name) must be a share from 0 to 1, such as 0.05") }
        }
        for (name, v) in [("--widget-push-delay-max", widgetPushDelayMaximum), ("--connection-rate-window", connectionRateWindow), ("--reorder-delay-max", reorderDelayMaximum)] {
            if let v, !(v >= 0 && v <= 86_400) { throw CLIError("\(name) must be from 0 to 86400 seconds") }
        }
        for (name, v) in [("--connection-error-limit", connectionErrorLimit), ("--connection-rate-limit", connectionRateLimit)] {
            if let v, v < 0 { throw CLIError("\(name) must be 0 (off) or more") }
        }
        if let m = widgetDailyBudgetMinimum, !(1...widgetDailyBudget).contains(m) { throw CLIError("--widget-daily-budget-min must be from 1 to --widget-daily-budget (\(widgetDailyBudget))") }
        if connectionRateWindow == 0 { throw CLIError("--connection-rate-window must be more than 0") }
        if let t = tokenRotation { _ = try Self.hours(t, flag: "--token-rotation") }
        if let t = pushToStartTokenRotation { _ = try Self.hours(t, flag: "--push-to-start-token-rotation") }
        if singleHost, broadcastPort != 0 || managementPort != 0 { throw CLIError("--single-host serves everything on --apns-port; leave out --broadcast-port and --management-port") }
    }

    /// The CA kept in `folder` (`ca.pem`, and its key `ca-key.pem`, owner-only), made the first
    /// time and again when a file is missing, unreadable or older than 9 years (it is valid for 10).
    /// The server certificate is issued from it at each start, for the names asked for then, so a
    /// server that trusts `ca.pem` keeps working across restarts. `again`: the folder's CA was used.
    /// The server certificate an Isle before this kept in `folder` (`server-cert.pem`, `server-key.pem`
    /// beside `ca.pem`, no `ca-key.pem`), while it is under 300 days old.
    static func olderServerCertificate(in folder: String) -> (chain: String, key: String)? {
        guard !FileManager.default.fileExists(atPath: folder + "/ca-key.pem"), FileManager.default.fileExists(atPath: folder + "/ca.pem"),
              let modified = (try? FileManager.default.attributesOfItem(atPath: folder + "/server-cert.pem"))?[.modificationDate] as? Date,
              Date().timeIntervalSince(modified) < 300 * 86_400,
              let chain = try? String(contentsOfFile: folder + "/server-cert.pem", encoding: .utf8), let key = try? String(contentsOfFile: folder + "/server-key.pem", encoding: .utf8)
        else { return nil }
        return (chain, key)
    }

    static func keptCertificateAuthority(in folder: String) throws -> (ca: CertificateAuthority, again: Bool) {
        let (caPath, keyPath) = (folder + "/ca.pem", folder + "/ca-key.pem")
        let fresh = { (path: String) -> Bool in
            guard let modified = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date else { return false }
            return Date().timeIntervalSince(modified) < 9 * 365 * 86_400
        }
        if fresh(caPath), fresh(keyPath), let cert = try? String(contentsOfFile: caPath, encoding: .utf8), let key = try? String(contentsOfFile: keyPath, encoding: .utf8),
           let ca = try? CertificateAuthority(certificatePEM: cert, privateKeyPEM: key) {
            return (ca, true)
        }
        let ca: CertificateAuthority
        let keyText: String
        do {
            ca = try CertificateAuthority(commonName: "Isle Simulator CA")
            keyText = try ca.privateKeyPEM()
        } catch { throw CLIError("cannot make the simulator's CA: \(error)") }
        // Earlier versions kept the server certificate itself here; it is issued at each start now.
        for old in ["/server-cert.pem", "/server-key.pem"] { try? FileManager.default.removeItem(atPath: folder + old) }
        for (path, text, mode) in [(keyPath, keyText, 0o600), (caPath, ca.certificatePEM, 0o644)] {
            try? FileManager.default.removeItem(atPath: path)
            let body = text.hasSuffix("\n") ? text : text + "\n"
            guard FileManager.default.createFile(atPath: path, contents: Data(body.utf8), attributes: [.posixPermissions: mode]) else {
                throw CLIError("--dir: cannot write \(path)")
            }
        }
        return (ca, false)
    }

    func run() async throws {
        let folder = dir ?? FileManager.default.temporaryDirectory.appendingPathComponent("isle-sim-\(UUID().uuidString.prefix(8))").path
        do { try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true) } catch {
            throw CLIError("--dir: cannot create \(folder)")
        }
        var c = IsleSim.Configuration()
        c.host = host
        c.controlHost = host
        c.apnsPort = apnsPort
        c.broadcastPort = broadcastPort
        c.managementPort = managementPort
        c.singleHost = singleHost
        c.controlPort = controlPort
        c.allowNonLoopback = allowNonLoopback
        c.environment = production ? .production : .sandbox
        c.caCertificatePath = folder + "/ca.pem"
        var caPath = folder + "/ca.pem"
        var reused: [String] = []
        if let certificate, let certificateKey {
            c.certificateChainPEM = String(decoding: try Inputs.read(certificate, flag: "--cert"), as: UTF8.self)
            c.privateKeyPEM = String(decoding: try Inputs.read(certificateKey, flag: "--cert-key"), as: UTF8.self)
        } else if let caCertificate, let caKey {
            // The team's CA: the server certificate chains to a root its machines already trust.
            do {
                c.certificateAuthority = try CertificateAuthority(certificatePEM: String(decoding: try Inputs.read(caCertificate, flag: "--ca-cert"), as: UTF8.self),
                                                                  privateKeyPEM: String(decoding: try Inputs.read(caKey, flag: "--ca-key"), as: UTF8.self))
            } catch let e as CertificateAuthorityError {
                throw CLIError("--\(e.field == "caKey" ? "ca-key" : "ca-cert"): \(e.reason)")
            }
            // The team's CA file is what clients trust: nothing is written over a --dir's own CA.
            c.caCertificatePath = nil
            caPath = URL(fileURLWithPath: caCertificate).standardizedFileURL.path
        } else if dir != nil {
            // A folder of one's own keeps its CA across restarts: a server configured with its
            // ca.pem keeps trusting the simulator started again there.
            if let old = Self.olderServerCertificate(in: folder), hostnames.isEmpty {
                // A folder an Isle before this made: its CA has no key here, so its server
                // certificate is served as it is, and servers that trust its ca.pem keep working.
                c.certificateChainPEM = old.chain
                c.privateKeyPEM = old.key
                reused.append("CA")
            } else {
                let (ca, again) = try Self.keptCertificateAuthority(in: folder)
                c.certificateAuthority = ca
                if again { reused.append("CA") }
            }
            // Written once, when made: a restart leaves ca.pem as it is.
            c.caCertificatePath = nil
        }
        c.hostnames = hostnames
        if realistic { c.device = .realistic(seed: seed) }
        c.device.seed = seed
        if let lowPriorityDelay {
            // A delay given alone is fixed; with --low-priority-delay-max it is the low end of a range.
            c.device.lowPriorityDelay = lowPriorityDelay
            c.device.lowPriorityDelayMaximum = lowPriorityDelayMaximum
        } else if let m = lowPriorityDelayMaximum {
            c.device.lowPriorityDelayMaximum = max(m, c.device.lowPriorityDelay)
        }
        if !realistic || pushTokenDelay > 0 { c.device.pushTokenDelay = pushTokenDelay }
        c.device.hourlyBudget = hourlyBudget
        c.device.pushToStartLimit = pushToStartLimit
        c.device.pushToStartWindow = pushToStartWindow
        c.device.frequentHourlyBudget = frequentHourlyBudget
        c.device.maximumActivitiesPerApp = maxPerApp
        c.device.maximumActivitiesPerDevice = maxPerDevice
        c.device.maximumActiveDuration = maxActiveHours * 3600
        c.device.maximumEndedDuration = maxEndedHours * 3600
        c.device.strictTimestamps = strictTimestamps
        c.device.withholdUpdateTokenUntilAllowed = withholdUpdateToken
        c.device.forceQuitWithholdsToken = !tokenAfterForceQuit
        c.device.terminatedWithholdsToken = !tokenWhileTerminated
        c.device.perTokenLimit = perTokenLimit
        c.device.budgetPerApp = !budgetPerActivity
        c.device.perTokenWindow = perTokenWindow
        c.device.widgetDailyReloadBudget = widgetDailyBudget
        c.device.widgetDailyReloadBudgetMinimum = min(c.device.widgetDailyReloadBudgetMinimum, widgetDailyBudget)
        if lenient { c.device.disableLeeway() }
        if let m = widgetDailyBudgetMinimum { c.device.widgetDailyReloadBudgetMinimum = m }
        if let v = widgetPushDelayMaximum { c.device.widgetPushDelayMaximum = v }
        if let v = connectionErrorLimit { c.device.connectionErrorLimit = v }
        if let v = connectionRateLimit { c.device.connectionRateLimit = v }
        if let v = connectionRateWindow { c.device.connectionRateWindow = v }
        if let t = tokenRotation { c.device.activityTokenRotation = try Self.hours(t, flag: "--token-rotation") }
        if let t = pushToStartTokenRotation { c.device.pushToStartTokenRotation = try Self.hours(t, flag: "--push-to-start-token-rotation") }
        if let v = reorder { c.device.reorderProbability = v }
        if let v = reorderDelayMaximum { c.device.reorderDelayMaximum = v }
        if let v = lowPriorityLoss { c.device.lowPriorityLossProbability = v }
        if let v = storedNotNewest { c.device.storedPushNotNewestProbability = v }
        c.device.acceptsLooseIssuedAt = acceptLooseIssuedAt
        switch providerTokenClock {
        case nil, "either": c.device.providerTokenClock = virtualClock ? .simulatorOrReal : .simulator
        case "virtual":
            guard virtualClock else { throw CLIError("--provider-token-clock virtual goes with --virtual-clock (without it the simulator's clock is real time)") }
            c.device.providerTokenClock = .simulator
        case let other?: throw CLIError("--provider-token-clock: \"\(other)\" is not either or virtual")
        }

        // A provider key: the one given (read before anything starts), the one this --dir already
        // holds, or one made now.
        let key: P256.Signing.PrivateKey
        let kept = folder + "/AuthKey_\(keyID).p8"
        if providerKey == nil, dir != nil, let text = try? String(contentsOfFile: kept, encoding: .utf8), let existing = try? P256.Signing.PrivateKey(pemRepresentation: text) {
            key = existing
            reused.append("provider key")
        } else if let providerKey {
            let text = String(decoding: try Inputs.read(providerKey, flag: "--key"), as: UTF8.self)
            do { key = try P256.Signing.PrivateKey(pemRepresentation: text) } catch {
                throw CLIError("--key: \(providerKey) is not a P-256 private key in PEM (a .p8 from Apple or isle sim)")
            }
        } else {
            key = P256.Signing.PrivateKey()
        }

        var logger = Logger(label: "isle.sim")
        logger.logLevel = .warning
        let clock: any WallClock = virtualClock ? ManualWallClock(Date()) : SystemWallClock()
        let sim: IsleSim
        do { sim = try await IsleSim(configuration: c, clock: clock, logger: logger) } catch let e as SimulatorError {
            throw CLIError(e.message)
        } catch {
            throw CLIError("cannot start the simulator: \(error)")
        }

        // The provider key, registered with the fake APNs and written as a .p8.
        let keyPath = folder + "/AuthKey_\(keyID).p8"
        do {
            try sim.apns.register(RegisteredKey(keyID: keyID, teamID: teamID, publicKeyPEM: key.publicKey.pemRepresentation,
                                                environment: scopedKey ? (production ? .production : .sandbox) : nil))
            // Owner-only (0600): with this key any local user could mint tokens the simulator accepts.
            // Written to a new file each start, so an older copy's looser mode does not survive.
            try? FileManager.default.removeItem(atPath: keyPath)
            guard FileManager.default.createFile(atPath: keyPath, contents: Data((key.pemRepresentation + "\n").utf8), attributes: [.posixPermissions: 0o600]) else {
                throw CLIError("--dir: cannot write the provider key to \(keyPath)")
            }
            chmod(keyPath, 0o600)
        } catch let e as SimulatorError {
            throw CLIError("--key-id/--team-id: \(e.message)")
        }

        var deviceLine = ""
        var devices: [JSONValue] = []
        var phonePath = "phone/<device id>"
        var installedApp: (device: String, bundleID: String, types: [String])?
        if let deviceName {
            let device: String
            do { device = try sim.world.createDevice(name: deviceName, osVersion: osVersion, model: model) } catch { throw CLIError("--os-version/--model: \(error.message)") }
            deviceLine = "  device:   \(device) (\(deviceName), \(model), iOS \(osVersion))"
            phonePath = "phone/\(device)"
            var described: JSONObject = ["id": .string(device), "name": .string(deviceName), "model": .string(model), "osVersion": .string(osVersion)]
            if let app {
                var parsed: [ActivitySchema] = []
                for path in schemas { parsed.append(try Inputs.schema(path)!) }
                do {
                    try sim.world.install(.init(bundleID: app, environment: c.environment, schemas: parsed, declaresFrequentUpdates: frequentUpdates), on: device)
                    deviceLine += "\n  app:      \(app)"
                    described["app"] = .string(app)
                    installedApp = (device, app, parsed.map(\.attributesType))
                } catch { throw CLIError("--app: \(error.message)") }
            }
            devices.append(.object(described))
        }

        let group = ServiceGroup(configuration: .init(services: [sim], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            let control = await sim.controlURL()
            // ActivityKit hands the push-to-start tokens out a moment after install (iOS 17.2+): wait
            // for them, so the start-up output can name them.
            if let installedApp, var described = devices.first?.objectValue {
                for type in installedApp.types {
                    _ = try? await sim.world.waitForPushToStartToken(bundleID: installedApp.bundleID, attributesType: type, on: installedApp.device, timeout: .seconds(5))
                }
                let tokens = ((try? sim.world.app(installedApp.bundleID, on: installedApp.device))?.pushToStartTokens ?? [:]).sorted { $0.key < $1.key }
                for (type, token) in tokens { deviceLine += "\n  push-to-start token (\(type)): \(token)" }
                described["pushToStartTokens"] = .object(JSONObject(tokens.map { ($0.key, JSONValue.string($0.value)) }))
                devices[0] = .object(described)
            }
            if json {
                let line: JSONValue = ["environment": .string(c.environment.rawValue), "virtualClock": .bool(virtualClock), "apnsURL": .string(sim.apnsURL),
                                       "broadcastURL": .string(sim.broadcastURL), "managementURL": .string(sim.managementURL), "controlURL": .string(control),
                                       "caPath": .string(caPath), "keyPath": .string(keyPath), "keyID": .string(keyID), "teamID": .string(teamID),
                                       "kept": .array(reused.map(JSONValue.string)), "devices": .array(devices)]
                say(line.jsonString)
                try await tasks.next()
                return
            }
            say("""
                Isle simulator (\(c.environment.rawValue)\(virtualClock ? ", virtual clock" : ""))
                  APNs:     \(sim.apnsURL)   (HTTP/2 + TLS; device pushes)
                  broadcast: \(sim.broadcastURL)   channels: \(sim.managementURL)
                  CA:       \(caPath)
                  control:  \(control)
                  phone:    \(control)/\(phonePath)   (the Lock Screen and Dynamic Island, in a browser)
                  key:      \(keyPath)   key id \(keyID)   team id \(teamID)
                \(reused.isEmpty ? "" : "  kept:     the \(reused.joined(separator: " and ")) already in \(folder) (a server that trusts them keeps working)\n")\(deviceLine.isEmpty ? "" : deviceLine + "\n")
                Point any client at it:
                  export ISLE_APNS_URL=\(sim.apnsURL) ISLE_APNS_CA_CERT=\(caPath)
                  export ISLE_APNS_BROADCAST_URL=\(sim.broadcastURL) ISLE_APNS_MANAGEMENT_URL=\(sim.managementURL)
                  export ISLE_APNS_KEY=\(keyPath) ISLE_APNS_KEY_ID=\(keyID) ISLE_APNS_TEAM_ID=\(teamID)
                Ctrl-C stops it.
                """)
            try await tasks.next()
        }
    }
}
