import AsyncHTTPClient
import Foundation
import IsleCore
import IsleDelivery
import IsleServer
import IsleStore
import IsleTesting
import NIOCore
import Testing

/// A real `isle serve` as an operator runs it (docs/server.md, "Signals", "Logs"): settings from a
/// config file (the master key too), JSON logs, the access log, SIGHUP with a good and a bad file,
/// SIGTERM.
@Suite("isle serve as an operator runs it: SIGHUP, JSON logs, the access log")
struct ServeOperationsTests {
    @Test("SIGHUP: a new log level takes effect, a bad file or value is refused and the running configuration kept; every log line is a JSON object; access lines name the route and key id, never the path or the key")
    func sighupAndJSONLogs() async throws {
        let isle = try #require(IsleBinary.path, "the isle executable is not built (swift build)")
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-ops-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let database = dir.appendingPathComponent("isle.sqlite").path
        let master = MasterKey.generate()
        let keyFile = dir.appendingPathComponent("master.key").path
        try Self.write(master.base64, to: keyFile)
        let store = try SQLiteStore(path: database)
        try await store.migrate()
        let provider = TestProviderKey()
        try await store.upsertApp(AppRecord(bundleID: Pizza.bundleID, teamID: provider.teamID, keyID: provider.keyID, keyPEM: master.seal(provider.privateKeyPEM, bundleID: Pizza.bundleID),
                                            schemas: [Pizza.schema], createdAt: Date()))
        let backend = try await ServerSetup.createKey(store: store, bundleID: Pizza.bundleID, scope: .backend)

        // The flag's name ("log-format") and camelCase ("masterKeyFile") in one file.
        let config = dir.appendingPathComponent("isle.json").path
        func configure(_ text: String) throws { try Self.write(text, to: config) }
        try configure(#"{"database": "\#(database)", "masterKeyFile": "\#(keyFile)", "logLevel": "info", "log-format": "json"}"#)
        let server = try await IsleServerProcess.start(isle, ["serve", "--config", config], environment: ["ISLE_TEST_SERVER_LOG_DIR": dir.path])
        defer { server.kill(SIGKILL) }
        let log = dir.appendingPathComponent("isle-serve-\(server.port).log").path
        @Sendable func lines() -> [String] { ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init) }
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        defer { _ = http.shutdown() }
        @Sendable func get(_ path: String, key: String? = nil) async throws -> Int {
            var r = HTTPClientRequest(url: "http://127.0.0.1:\(server.port)\(path)")
            if let key { r.headers.add(name: "authorization", value: "Bearer \(key)") }
            let response = try await http.execute(r, timeout: .seconds(30))
            _ = try await response.body.collect(upTo: 1 << 20)
            return Int(response.status.code)
        }

        // At info without --access-log, no access line (they are at debug).
        #expect(try await get("/v1/app", key: backend.secret) == 200)
        #expect(!lines().contains { $0.contains("\"http.route\"") })

        // SIGHUP with debug: access lines appear (at debug without --access-log).
        try configure(#"{"database": "\#(database)", "masterKeyFile": "\#(keyFile)", "logLevel": "debug", "log-format": "json"}"#)
        server.kill(SIGHUP)
        try await eventually(within: .seconds(20), "the reload logged") { lines().contains { $0.contains("configuration reloaded") } }
        let secret = backend.secret
        try await eventually(within: .seconds(20), "an access line for GET /v1/app") {
            _ = try await get("/v1/app", key: secret)
            return lines().contains { $0.contains("\"http.route\":\"/v1/app\"") || $0.contains("\"http.route\":\"v1/app\"") }
        }
        let access = try #require(lines().first { $0.contains("\"http.route\"") && $0.contains("app") && $0.contains("key.id") })
        #expect(access.contains(backend.id) && access.contains("\"http.status\":\"200\"") && access.contains("\"http.method\":\"GET\""), "\(access)")
        // A path with an id is logged by its route, not its path.
        #expect(try await get("/v1/activities/order-secret-42", key: backend.secret) == 404)
        try await eventually(within: .seconds(20), "the 404's access line") { lines().contains { $0.contains("\"http.status\":\"404\"") } }
        #expect(!lines().contains { $0.contains("order-secret-42") }, "a path reached the log")

        // A bad value, then a file that does not parse: refused, the server goes on at debug.
        try configure(#"{"database": "\#(database)", "masterKeyFile": "\#(keyFile)", "logLevel": "loud"}"#)
        server.kill(SIGHUP)
        try await eventually(within: .seconds(20), "the bad value refused") { lines().contains { $0.contains("configuration not reloaded") && $0.contains("log-level: loud") } }
        try configure("{not json")
        server.kill(SIGHUP)
        try await eventually(within: .seconds(20), "the bad file refused") { lines().filter { $0.contains("configuration not reloaded") }.count >= 2 }
        #expect(try await get("/health") == 200)
        let before = lines().count
        #expect(try await get("/health") == 200)
        try await eventually(within: .seconds(20), "still logging at debug, still JSON") { lines().count > before }

        server.kill(SIGTERM)
        #expect(await server.waitForExit() == 0)
        // Every line of the output is one JSON object with the stable keys; no secret anywhere.
        let all = lines()
        #expect(all.count > 5)
        for line in all {
            guard let o = (try? JSONParser.parse(Array(line.utf8)))?.objectValue else { Issue.record("not a JSON object: \(line)"); continue }
            for key in ["time", "level", "logger", "message"] { #expect(o[key]?.stringValue != nil, "\(key) missing: \(line)") }
        }
        #expect(!all.contains { $0.contains(backend.secret) || $0.contains(master.base64) })
        #expect(all.contains { $0.contains("\"message\":\"listening\"") }, "the banner is a record in JSON mode")
        // A graceful stop says so, at its start and at its end.
        #expect(all.contains { $0.contains("\"message\":\"stopping: no new claims") } && all.last?.contains("\"message\":\"stopped\"") == true, "\(all.suffix(3))")
    }

    static func write(_ text: String, to path: String) throws {
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
    }
}
