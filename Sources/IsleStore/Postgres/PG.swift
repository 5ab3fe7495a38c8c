import Foundation
import IsleDelivery
import Logging
import NIOCore
import PostgresNIO

/// A statement's arguments, bound as `$1`, `$2`, … (never spliced into the SQL text).
enum PGArg: Sendable {
    case text(String?)
    case int(Int64?)
    case double(Double?)
    case bool(Bool?)
    case texts([String])
    case ints([Int64])
    case bools([Bool])
    case doubles([Double])
    /// A moment (TIMESTAMPTZ).
    case date(Date?)
    case dates([Date])
    /// A JSON document Isle wrote (JSONB).
    case json(String?)
    case jsons([String])
    /// A JSON document kept as written (JSON).
    case orderedJSON(String?)

    static func int(_ v: Int?) -> PGArg { .int(v.map(Int64.init)) }

    /// A moment PostgreSQL can hold (years 4713 BC to 294276 AD; Isle stores nothing near
    /// either end) and that PostgresNIO's microsecond conversion cannot overflow, at the nearest
    /// microsecond: PostgresNIO truncates, so a moment read back from PostgreSQL and bound again
    /// would often land a microsecond early (and `started_at = $1` would miss its own row). Half a
    /// microsecond toward the value's side of 2000-01-01 (PostgreSQL's epoch) makes its
    /// truncation a rounding.
    static func storable(_ d: Date) -> Date {
        let t = d.timeIntervalSince1970
        let clamped = t.isNaN ? 0 : min(max(t, -200_000_000_000), 6_000_000_000_000)
        let epoch2000 = 946_684_800.0
        let micros = ((clamped - epoch2000) * 1_000_000).rounded()
        return Date(timeIntervalSince1970: epoch2000 + (micros + (micros < 0 ? -0.5 : 0.5)) / 1_000_000)
    }

    /// `typedNulls`: a NULL is bound with its value's type instead of none (which PostgreSQL infers
    /// from the SQL). A prepared statement keeps the types of its first call: with untyped NULLs a
    /// first call's NULL could fix a type a later value does not have.
    func bind(into b: inout PostgresBindings, typedNulls: Bool = false) {
        func bindNull(_ type: PostgresDataType) {
            if typedNulls { b.append(PostgresData(type: type)) } else { b.appendNull() }
        }
        switch self {
        case .text(let v): if let v { b.append(v) } else { bindNull(String.psqlType) }
        case .int(let v): if let v { b.append(v) } else { bindNull(Int64.psqlType) }
        case .double(let v): if let v { b.append(v) } else { bindNull(Double.psqlType) }
        case .bool(let v): if let v { b.append(v) } else { bindNull(Bool.psqlType) }
        case .texts(let v): b.append(v)
        case .ints(let v): b.append(v)
        case .bools(let v): b.append(v)
        case .doubles(let v): b.append(v)
        case .date(let v): if let v { b.append(Self.storable(v)) } else { bindNull(Date.psqlType) }
        case .dates(let v): b.append(v.map(Self.storable))
        case .json(let v): if let v { b.append(JSONText(v)) } else { bindNull(JSONText.psqlType) }
        case .jsons(let v): b.append(v.map(JSONText.init))
        case .orderedJSON(let v): if let v { b.append(OrderedJSONText(v)) } else { bindNull(OrderedJSONText.psqlType) }
        }
    }
}

/// JSON text bound as JSONB (binary format: a version byte, then the text), so that a statement
/// needs no cast to write a JSONB column.
struct JSONText: PostgresNonThrowingEncodable, PostgresArrayEncodable {
    static var psqlType: PostgresDataType { .jsonb }
    static var psqlFormat: PostgresFormat { .binary }
    static var psqlArrayType: PostgresDataType { .jsonbArray }
    var text: String
    init(_ text: String) { self.text = text }
    func encode<E: PostgresJSONEncoder>(into buffer: inout ByteBuffer, context: PostgresEncodingContext<E>) {
        buffer.writeInteger(UInt8(1))
        buffer.writeString(text)
    }
}

/// JSON text bound as JSON (kept as written; its binary format is the text itself).
struct OrderedJSONText: PostgresNonThrowingEncodable {
    static var psqlType: PostgresDataType { .json }
    static var psqlFormat: PostgresFormat { .binary }
    var text: String
    init(_ text: String) { self.text = text }
    func encode<E: PostgresJSONEncoder>(into buffer: inout ByteBuffer, context: PostgresEncodingContext<E>) {
        buffer.writeString(text)
    }
}

/// A row read by column name.
struct PGRow {
    let row: PostgresRandomAccessRow
    init(_ row: PostgresRow) { self.row = row.makeRandomAccess() }

    func string(_ c: String) throws -> String { try row[c].decode(String.self) }
    func int(_ c: String) throws -> Int64 { try row[c].decode(Int64.self) }
    func optionalInt(_ c: String) throws -> Int64? { try row[c].decode(Int64?.self) }
    func double(_ c: String) throws -> Double { try row[c].decode(Double.self) }
    func optionalDouble(_ c: String) throws -> Double? { try row[c].decode(Double?.self) }
    func bool(_ c: String) throws -> Bool { try row[c].decode(Bool.self) }
    func date(_ c: String) throws -> Date { try row[c].decode(Date.self) }
    func optionalDate(_ c: String) throws -> Date? { try row[c].decode(Date?.self) }
    func optionalString(_ c: String) throws -> String? { try row[c].decode(String?.self) }
    func strings(_ c: String) throws -> [String] { try row[c].decode([String].self) }
}

extension PostgresConnection {
    /// Runs one statement and returns its rows.
    @discardableResult
    func rows(_ sql: String, _ args: [PGArg] = [], logger: Logger) async throws -> [PGRow] {
        var binds = PostgresBindings(capacity: args.count)
        for a in args { a.bind(into: &binds) }
        StoreStatements.add(sql: sql)
        do {
            return try await query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger).collect().map(PGRow.init)
        } catch let error as PSQLError {
            throw PG.storeError(error)
        }
    }

    func row(_ sql: String, _ args: [PGArg] = [], logger: Logger) async throws -> PGRow? {
        try await rows(sql, args, logger: logger).first
    }

    /// Runs a prepared statement (PreparedStatements.swift): prepared on this connection at its
    /// first use, then only bound and executed.
    @discardableResult
    func rows<S: PreparedSQL>(_ statement: S.Type, _ args: [PGArg] = [], logger: Logger) async throws -> [PGRow] {
        var binds = PostgresBindings(capacity: args.count)
        for a in args { a.bind(into: &binds, typedNulls: true) }
        StoreStatements.add(sql: S.sql)
        do {
            let sequence = try await execute(Prepared<S>(bindings: binds), logger: logger)
            var out: [PGRow] = []
            for try await r in sequence { out.append(PGRow(r)) }
            return out
        } catch let error as PSQLError {
            if PreparedNames.mayHaveFailedPreparation(error) { PreparedNames.retire(S.self) }
            throw PG.storeError(error)
        }
    }

    func row<S: PreparedSQL>(_ statement: S.Type, _ args: [PGArg] = [], logger: Logger) async throws -> PGRow? {
        try await rows(statement, args, logger: logger).first
    }
}

enum PG {
    /// What went wrong, in words, without secrets: postgres-nio's `PSQLError` prints only a generic
    /// sentence (it guards against leaking a query's text and values); this names its kind, the
    /// server's SQLSTATE and message, and the network error under it (connection refused, a
    /// timeout, a TLS failure). Never the query, its values or the password.
    static func describe(_ error: any Error) -> String {
        guard let e = error as? PSQLError else { return String(describing: error) }
        var parts: [String] = []
        if let state = e.serverInfo?[.sqlState] {
            parts.append("\(state): \(e.serverInfo?[.message] ?? "server error")")
        } else {
            parts.append("\(e.code)")
        }
        if let underlying = e.underlying {
            // NIO's connection errors list each address tried; their text is errno's.
            parts.append(String(describing: underlying).replacingOccurrences(of: "\n", with: " "))
        }
        return parts.joined(separator: ": ")
    }

    /// The SQLSTATE of a server error (`23505` unique violation, `40P01` deadlock, …).
    static func sqlState(_ error: PSQLError) -> String? { error.serverInfo?[.sqlState] }

    /// What the store's callers understand: the database is away (`.unavailable`), or a
    /// constraint said no (`.conflict`); SQL text and bound values are never part of the message.
    static func storeError(_ error: PSQLError) -> any Error {
        switch error.code {
        case .server:
            let state = sqlState(error) ?? ""
            if state.hasPrefix("23") { return StoreError(.conflict, "a uniqueness or reference rule refused the write (\(state))") }
            // Shutting down, cannot connect, too many connections, read-only standby, …
            if state.hasPrefix("57") || state.hasPrefix("08") || state.hasPrefix("53") || state == "25006" {
                return StoreError(.unavailable, "PostgreSQL is unavailable (\(state): \(error.serverInfo?[.message] ?? ""))")
            }
            return RetryablePGError(state: state, message: error.serverInfo?[.message] ?? "server error")
        case .connectionError, .serverClosedConnection, .clientClosedConnection, .poolClosed, .uncleanShutdown, .sslUnsupported, .failedToAddSSLHandler:
            return StoreError(.unavailable, "PostgreSQL is unreachable (\(error.code))")
        default:
            return StoreError(.unavailable, "PostgreSQL failed (\(error.code))")
        }
    }
}

/// A server error other than unavailability and constraints; deadlocks (`40P01`) and serialization
/// failures (`40001`) are retried by the store's transactions.
struct RetryablePGError: Error, CustomStringConvertible {
    var state: String
    var message: String
    var isTransient: Bool { state == "40P01" || state == "40001" }
    var description: String { "PostgreSQL error \(state): \(message)" }
}
