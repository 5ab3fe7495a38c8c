import PostgresNIO
import Synchronization

// Statements the queue's driver and the accept path repeat are prepared once per connection, then
// only bound and executed (PostgreSQL parses and plans an unnamed statement on every call). Each
// is a caseless enum in ``PG`` holding its text; `conn.rows(PG.Name.self, args, logger:)` runs it.
// A statement whose text depends on the data stays a string (`conn.rows(sql, …)`).

/// One statement's fixed text. Parameter types come from the first call's bindings (a NULL says
/// its type too, ``PGArg/bind(into:typedNulls:)``), so every call must bind the same kinds.
protocol PreparedSQL {
    static var sql: String { get }
}

/// A ``PreparedSQL`` as postgres-nio runs it: prepared on a connection at its first use there
/// (keyed by `name`), then bound and executed.
struct Prepared<S: PreparedSQL>: PostgresPreparedStatement {
    static var sql: String { S.sql }
    static var name: String { PreparedNames.name(S.self) }
    typealias Row = PostgresRow

    let bindings: PostgresBindings
    func makeBindings() -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) -> PostgresRow { row }
}

/// Statement names, `isle_<type>_<generation>`: unique in the process (the type's full name) and
/// within PostgreSQL's 63 bytes. postgres-nio keeps a failed preparation's error for the
/// connection's life, and PostgreSQL fails a prepared `SELECT *` for good once its table gained a
/// column; so after a server error a preparation may have caused, the statement takes a new name
/// and each connection prepares it again at its next use.
enum PreparedNames {
    private static let names = Mutex<[ObjectIdentifier: (name: String, generation: Int)]>([:])

    static func name(_ s: any PreparedSQL.Type) -> String {
        names.withLock { table -> String in
            if let n = table[ObjectIdentifier(s)] { return n.name }
            let n = make(s, 0)
            table[ObjectIdentifier(s)] = (n, 0)
            return n
        }
    }

    static func retire(_ s: any PreparedSQL.Type) {
        names.withLock { table in
            let g = (table[ObjectIdentifier(s)]?.generation ?? 0) + 1
            table[ObjectIdentifier(s)] = (make(s, g), g)
        }
    }

    private static func make(_ s: any PreparedSQL.Type, _ generation: Int) -> String {
        let n = "isle_\(String(reflecting: s))_\(generation)"
        assert(n.utf8.count < 64, "a prepared statement's name is cut at 63 bytes: \(n)")
        return n
    }

    /// A server error other than bad data (22), a constraint (23) or a deadlock or serialization
    /// failure (40), which only executing raises: a timeout or lock wait while preparing, a table
    /// changed or missing, …
    static func mayHaveFailedPreparation(_ error: PSQLError) -> Bool {
        guard error.code == .server, let state = PG.sqlState(error) else { return false }
        return !["22", "23", "40"].contains(String(state.prefix(2)))
    }
}
