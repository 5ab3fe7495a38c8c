import Foundation
import Synchronization

/// SQL statements this process sent to its database (SQLite: every statement run, traced by
/// SQLite itself, transaction control included; PostgreSQL: every statement sent). `/metrics` says
/// it as `isle_store_statements_total`; `isle-bench split` divides it by deliveries.
///
/// With `ISLE_STATEMENT_KINDS=1` in the environment, each statement is also counted by its kind
/// (its first words), and `/metrics` adds `isle_store_statements_by_kind_total`: what
/// `isle-bench split --statement-kinds` prints per delivery (a diagnosis, off by default).
public enum StoreStatements {
    private static let count = Atomic<Int>(0)
    public static var total: Int { count.load(ordering: .relaxed) }
    static func add(_ n: Int = 1) { count.add(n, ordering: .relaxed) }

    public static let kindsEnabled = ProcessInfo.processInfo.environment["ISLE_STATEMENT_KINDS"] == "1"
    private static let byKind = Mutex<[String: Int]>([:])

    /// Counts one statement by kind, when enabled (``kindsEnabled``).
    static func add(sql: @autoclosure () -> String) {
        add()
        guard kindsEnabled else { return }
        let key = kind(of: sql())
        byKind.withLock { $0[key, default: 0] += 1 }
    }

    /// The statements counted so far, by kind (empty unless ``kindsEnabled``).
    public static var kinds: [String: Int] { byKind.withLock { $0 } }

    /// A statement's first words, whitespace collapsed, at most 72 characters, without quotes.
    static func kind(of sql: String) -> String {
        let words = sql.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }).prefix(8).joined(separator: " ")
        return String(words.filter { $0 != "\"" && $0 != "\\" }.prefix(72))
    }
}
