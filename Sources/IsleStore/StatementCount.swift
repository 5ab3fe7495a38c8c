import Synchronization

/// SQL statements this process sent to its database (SQLite: every statement run, traced by
/// SQLite itself, transaction control included; PostgreSQL: every statement sent). `/metrics` says
/// it as `isle_store_statements_total`; `isle-bench split` divides it by deliveries.
public enum StoreStatements {
    private static let count = Atomic<Int>(0)
    public static var total: Int { count.load(ordering: .relaxed) }
    static func add(_ n: Int = 1) { count.add(n, ordering: .relaxed) }
}
