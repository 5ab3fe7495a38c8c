import Foundation
import IsleServer
import Logging
import ServiceLifecycle
import UnixSignals

/// What `isle serve` runs with, from the config file, the environment and the flags.
struct ServeSettings: Sendable {
    var configuration: ServerConfiguration
    var level: Logger.Level
    var format: LogFormat
}

/// SIGHUP: the config file (and the environment and flags, as at the start) read again. The log
/// level and format, the access log and the TLS certificate and key (read again even when their
/// files look unchanged) take effect at once; a setting that needs a restart is named in the log
/// and keeps its running value. A file that does not read, or holds a bad setting, changes
/// nothing: the running configuration is kept and the log says why (docs/server.md, "Signals").
struct ServeReload: Service {
    let command: ServeCommand
    let running: ServerConfiguration
    let logs: LogControl
    let signals: UnixSignalsSequence
    let logger: Logger

    func run() async throws {
        await cancelWhenGracefulShutdown {
            for await _ in signals { reload() }
        }
    }

    func reload() {
        let next: ServeSettings
        do { next = try command.settings() } catch {
            logger.error("configuration not reloaded: the running configuration is kept", metadata: ["reason": "\(Self.oneLine(error))"])
            return
        }
        if let tls = running.tls {
            do { try tls.reload() } catch {
                logger.error("configuration not reloaded: the TLS certificate or key does not load; the running ones are kept", metadata: ["reason": "\(Self.oneLine(error))"])
                return
            }
        }
        logs.level = next.level
        logs.format = next.format
        running.accessLog.on = next.configuration.accessLog.on
        let restart = Self.needingRestart(running, next.configuration)
        var metadata: Logger.Metadata = ["log.level": "\(next.level)", "log.format": "\(next.format.rawValue)", "access.log": "\(next.configuration.accessLog.on)"]
        if !restart.isEmpty { metadata["needs.restart"] = "\(restart.joined(separator: ", "))" }
        logger.notice(restart.isEmpty ? "configuration reloaded" : "configuration reloaded; some changed settings take effect at the next start", metadata: metadata)
    }

    static func oneLine(_ error: any Error) -> String {
        "\(error)".replacingOccurrences(of: "\n", with: "; ")
    }

    /// Settings that changed but are built once at the start: named, so the operator knows to restart.
    static func needingRestart(_ old: ServerConfiguration, _ new: ServerConfiguration) -> [String] {
        var changed: [String] = []
        func compare<T: Equatable>(_ name: String, _ a: T, _ b: T) {
            if a != b { changed.append(name) }
        }
        compare("host", old.host, new.host)
        compare("port", old.port, new.port)
        compare("database", old.database, new.database)
        compare("concurrency", old.concurrency, new.concurrency)
        compare("lease", old.lease, new.lease)
        compare("apns", "\(old.apnsTargets.sorted { $0.key.rawValue < $1.key.rawValue })", "\(new.apnsTargets.sorted { $0.key.rawValue < $1.key.rawValue })")
        compare("apnsTransport", old.apnsTransport.rawValue, new.apnsTransport.rawValue)
        compare("apnsEnvironment", old.defaultEnvironment.rawValue, new.defaultEnvironment.rawValue)
        compare("rates", "\(old.rateLimits.sorted { "\($0.key)" < "\($1.key)" }) \(String(describing: old.deviceInstallationLimit)) \(String(describing: old.deviceAddressLimit)) \(String(describing: old.authFailureLimit))",
                "\(new.rateLimits.sorted { "\($0.key)" < "\($1.key)" }) \(String(describing: new.deviceInstallationLimit)) \(String(describing: new.deviceAddressLimit)) \(String(describing: new.authFailureLimit))")
        compare("quotas", "\(old.quotas)", "\(new.quotas)")
        compare("timeouts", "\(old.timeouts)", "\(new.timeouts)")
        compare("retention", "\(old.retention)", "\(new.retention)")
        compare("webhooks", "\(old.webhooks)", "\(new.webhooks)")
        compare("trustedProxies", "\(old.trustedProxies)", "\(new.trustedProxies)")
        compare("secureCookies", old.secureCookies, new.secureCookies)
        compare("tls", "\(old.tls.map { [$0.certificatePath, $0.keyPath] } ?? [])", "\(new.tls.map { [$0.certificatePath, $0.keyPath] } ?? [])")
        compare("masterKey", old.masterKey?.base64 ?? "", new.masterKey?.base64 ?? "")
        return changed
    }
}
