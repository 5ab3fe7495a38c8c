import Foundation
import IsleStore
import IsleDelivery
import Logging
import Testing

/// A fresh database per test on the PostgreSQL server named by `ISLE_TEST_POSTGRES_URL`
/// (`.ci/run` starts a throwaway cluster and sets it).
enum PostgresTestDatabase {
    static let url: String? = {
        let url = ProcessInfo.processInfo.environment["ISLE_TEST_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
        if url == nil {
            print("note: the PostgreSQL store contract cases are skipped: ISLE_TEST_POSTGRES_URL is not set (.ci/run starts a server and sets it)")
        }
        return url
    }()

    static var logger: Logger {
        var l = Logger(label: "isle.test.postgres")
        l.logLevel = .critical
        return l
    }

    /// Creates `isle_test_<random>` and returns a running store on it. The pool runs for the rest of
    /// the test process (the cluster is thrown away after the run).
    static func fresh() async throws -> PostgresStore {
        let settings = try await PostgresStore.createDatabase(on: try PostgresSettings(url: try #require(url)), prefix: "isle_test", logger: logger)
        let store = PostgresStore(settings: settings, logger: logger)
        Task.detached { await store.run() }
        return store
    }
}

@Test("PostgreSQL contract cases: run when ISLE_TEST_POSTGRES_URL is set, otherwise skipped with the reason printed")
func postgresAvailability() {
    if PostgresTestDatabase.url == nil {
        print("note: PostgreSQL store tests skipped — set ISLE_TEST_POSTGRES_URL=postgres://user@127.0.0.1:PORT/postgres?sslmode=disable to run them")
    }
}
