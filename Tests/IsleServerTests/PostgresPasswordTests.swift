import Foundation
import IsleTesting
import Testing

/// `isle serve` against a PostgreSQL server that asks for a password (docs/security.md): a wrong or missing
/// password fails at once, saying so — before, the pool retried until a call's 35-second deadline
/// and said only that PostgreSQL did not answer. The password is never printed.
@Suite("isle serve: PostgreSQL that asks for a password")
struct PostgresPasswordTests {
    @Test("a wrong or missing password exits at once naming 28P01 and what to fix, never the password")
    func wrongPassword() async throws {
        guard let ctl = ProcessInfo.processInfo.environment["ISLE_TEST_POSTGRES_CTL"].flatMap({ $0.isEmpty ? nil : $0 }) else {
            print("note: the PostgreSQL password test is skipped: ISLE_TEST_POSTGRES_CTL is not set (.ci/run sets it)")
            return
        }
        let isle = try #require(IsleBinary.path, "the isle executable is not built (swift build)")
        let dir = "/tmp/isle-pw-pg-\(UUID().uuidString.prefix(8))"
        let urlFile = dir + ".url"
        try await IsleServerProcess.run("/bin/bash", [ctl, "start"], environment: ["ISLE_PG_DIR": dir, "ISLE_PG_PASSWORD": "right-horse"], output: urlFile)
        defer { try? FileManager.default.removeItem(atPath: urlFile) }
        do {
            let url = try String(contentsOfFile: urlFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            for (password, says) in [("wrong-horse", "check the password"), ("", "no password was given")] {
                let log = FileManager.default.temporaryDirectory.appendingPathComponent("isle-pw-\(UUID().uuidString).log").path
                do {
                    try await withDeadline(.seconds(20), "isle serve to give up on a refused password") {
                        try await IsleServerProcess.run(isle, ["serve", "--port", "0", "--database", url], environment: ["PGPASSWORD": password], output: log)
                    }
                    Issue.record("isle serve ran with a refused password")
                } catch let e as DeadlineExceeded where e.after == .zero {
                    // run() reports a non-zero exit as DeadlineExceeded naming what the command printed.
                }
                let said = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
                #expect(said.contains("28P01") && said.contains("password of user postgres") && said.contains(says), "\(said)")
                #expect(!password.isEmpty ? !said.contains(password) : true)
                #expect(said.split(separator: "\n").count <= 2, "one line saying why: \(said)")
            }
        } catch {
            try? await IsleServerProcess.run("/bin/bash", [ctl, "stop"], environment: ["ISLE_PG_DIR": dir])
            throw error
        }
        try await IsleServerProcess.run("/bin/bash", [ctl, "stop"], environment: ["ISLE_PG_DIR": dir])
    }
}
