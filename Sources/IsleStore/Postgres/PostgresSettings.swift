public import Foundation
import IsleDelivery

/// Where and how to reach PostgreSQL, from a URL:
/// `postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require&pool=20&statement_timeout=30]`.
///
/// The password comes from the URL, else `PGPASSWORD`, else the file named by `passwordfile=` in
/// the URL (or `ISLE_DATABASE_PASSWORD_FILE`). ``redacted`` is the URL without it — the only form
/// that is ever logged or printed.
public struct PostgresSettings: Sendable, Hashable {
    public enum TLSMode: String, Sendable, Hashable { case disable, prefer, require }
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var tls: TLSMode
    /// Connections in the pool (per process).
    public var poolSize: Int
    /// Every statement is cancelled after this many seconds.
    public var statementTimeout: Int

    /// True when `text` names a PostgreSQL database rather than a SQLite file: its scheme is
    /// `postgres` or `postgresql`, in any case (schemes are case-insensitive, RFC 3986), with or
    /// without the `//`. Anything else is taken as a file path and may be printed as it is, so a
    /// URL with a password must never fall through to that side (`POSTGRES://user:pw@…` did).
    public static func isPostgresURL(_ text: String) -> Bool {
        guard let colon = text.firstIndex(of: ":") else { return false }
        return isPostgresScheme(String(text[..<colon]))
    }

    public init(url text: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        // The text itself is never in an error: it may hold the password.
        guard Self.isPostgresURL(text), let components = URLComponents(string: text), components.scheme.map(Self.isPostgresScheme) == true else {
            throw StoreError(.unavailable, "not a PostgreSQL URL: expected postgres://user[:password]@host[:port]/database")
        }
        guard let host = components.host, !host.isEmpty else { throw StoreError(.unavailable, "the PostgreSQL URL names no host: postgres://user@host:5432/database") }
        guard let user = components.user, !user.isEmpty else { throw StoreError(.unavailable, "the PostgreSQL URL names no user: postgres://user@\(host)/database") }
        let database = String(components.path.drop(while: { $0 == "/" }))
        guard !database.isEmpty else { throw StoreError(.unavailable, "the PostgreSQL URL names no database: postgres://user@\(host)/database") }
        self.host = host
        port = components.port ?? 5432
        username = user.removingPercentEncoding ?? user
        self.database = database
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] { query[item.name] = item.value ?? "" }
        let known: Set<String> = ["sslmode", "pool", "statement_timeout", "passwordfile"]
        if let unknown = query.keys.sorted().first(where: { !known.contains($0) }) {
            throw StoreError(.unavailable, "unknown PostgreSQL URL setting \(unknown); known: \(known.sorted().joined(separator: ", "))")
        }
        guard let tls = TLSMode(rawValue: query["sslmode"] ?? "prefer") else { throw StoreError(.unavailable, "sslmode must be disable, prefer or require") }
        self.tls = tls
        guard let pool = Int(query["pool"] ?? "10"), (1...200).contains(pool) else { throw StoreError(.unavailable, "pool must be a whole number of connections from 1 to 200") }
        poolSize = pool
        guard let timeout = Int(query["statement_timeout"] ?? "30"), (1...3600).contains(timeout) else {
            throw StoreError(.unavailable, "statement_timeout must be whole seconds from 1 to 3600")
        }
        statementTimeout = timeout
        if let p = components.password {
            password = p.removingPercentEncoding ?? p
        } else if let p = environment["PGPASSWORD"], !p.isEmpty {
            password = p
        } else if let file = query["passwordfile"] ?? environment["ISLE_DATABASE_PASSWORD_FILE"], !file.isEmpty {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw StoreError(.unavailable, "cannot read the PostgreSQL password file \(file)") }
            // Like the master key: a password other users of the machine can read is not kept secret.
            if let mode = FilePermissions.mode(of: file), mode & 0o077 != 0 {
                throw StoreError(.unavailable, "the PostgreSQL password file \(file) is readable by others (mode \(String(mode & 0o777, radix: 8))); run: chmod 600 \(file)")
            }
            password = text.trimmingCharacters(in: .whitespacesAndNewlines)
        } else {
            password = nil
        }
    }

    /// `postgres` or `postgresql`, in any case.
    static func isPostgresScheme(_ scheme: String) -> Bool {
        let lower = scheme.lowercased()
        return lower == "postgres" || lower == "postgresql"
    }

    /// The URL without the password: safe to log.
    public var redacted: String { "postgres://\(username)@\(host):\(port)/\(database)" }

    /// A URL that reaches these settings again (the password left to PGPASSWORD or the file, never in it).
    public var url: String {
        "postgres://\(username)@\(host):\(port)/\(database)?sslmode=\(tls.rawValue)&pool=\(poolSize)&statement_timeout=\(statementTimeout)"
    }
}
