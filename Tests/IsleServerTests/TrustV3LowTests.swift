import AsyncHTTPClient
import Foundation
import IsleCore
import IsleHTTP2Server
@testable import IsleServer
@testable import IsleStore
import IsleDelivery
import IsleTesting
import NIOCore
import NIOSSL
import Synchronization
import Testing

/// Trust v3, the low findings: TLS 1.2 only with forward-secret AEAD suites, a TLS key others can
/// read refused, HSTS over HTTPS, a backup never partial under its name, a PostgreSQL URL in upper
/// case never taken for a file (and its password never echoed), error bodies that echo a bounded
/// piece of the path.
@Suite("Trust v3, low findings: TLS suites and key mode, HSTS, atomic backups, PostgreSQL URL case, bounded path echoes", .serialized)
struct TrustV3LowTests {
    static func temporaryDirectory(_ name: String) throws -> URL {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-low-\(name)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir
    }

    /// A certificate and its key (mode `keyMode`) in `dir`; the CA that signed them.
    static func tlsFiles(in dir: URL, keyMode: Int = 0o600) throws -> (cert: String, key: String, ca: CertificateAuthority) {
        let ca = try CertificateAuthority(commonName: "Low CA")
        let leaf = try ca.issueServerCertificate()
        let cert = dir.appendingPathComponent("cert.pem").path, key = dir.appendingPathComponent("key.pem").path
        try leaf.certificatePEM.write(toFile: cert, atomically: true, encoding: .utf8)
        try leaf.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: keyMode], ofItemAtPath: key)
        return (cert, key, ca)
    }

    /// One HTTPS request with its own client: the status and the `Strict-Transport-Security` header.
    /// AsyncHTTPClient retries a refused handshake until the deadline: refusals are asked with a short one.
    static func get(_ url: String, trusting pem: String, timeout: Int64 = 10, _ configure: (inout TLSConfiguration) -> Void = { _ in }) async throws -> (status: Int, hsts: String?) {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))
        configure(&tls)
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: tls))
        do {
            let response = try await client.execute(HTTPClientRequest(url: url), timeout: .seconds(timeout))
            let answer = (Int(response.status.code), response.headers.first(name: "strict-transport-security"))
            _ = try await response.body.collect(upTo: 1 << 20)
            try await client.shutdown()
            return answer
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    // MARK: 1. TLS

    /// A server on HTTPS with a certificate from a fresh CA: the body gets the CA's PEM and the
    /// certificate and key files.
    static func withHTTPSServer(_ name: String, _ body: (ServerFixture, String, (cert: String, key: String)) async throws -> Void) async throws {
        let dir = try temporaryDirectory(name)
        defer { try? FileManager.default.removeItem(at: dir) }
        let (cert, key, ca) = try tlsFiles(in: dir)
        let credentials = try TLSCredentials(certificatePath: cert, keyPath: key)
        let caPEM = ca.certificatePEM
        try await ServerFixture.with(server: { c in
            c.tls = credentials
            c.tlsReloadInterval = .seconds(3600)
        }) { f in try await body(f, caPEM, (cert, key)) }
    }

    @Test("TLS 1.2 is offered only with ECDHE and AEAD suites: a client limited to CBC-SHA1, or to TLS 1.1, is refused; ECDHE-GCM and ChaCha20 and TLS 1.3 are served")
    func tlsSuites() async throws {
        try await Self.withHTTPSServer("tls") { f, caPEM, files in
            let url = "https://127.0.0.1:\(await f.server.port)/health"
            func tls12(_ suites: [NIOTLSCipher]) -> (inout TLSConfiguration) -> Void {
                { $0.maximumTLSVersion = .tlsv12; $0.cipherSuiteValues = suites }
            }
            // TLS 1.3 (the default client) and the allowed TLS 1.2 suites.
            #expect(try await Self.get(url, trusting: caPEM).status == 200)
            #expect(try await Self.get(url, trusting: caPEM, tls12([.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256])).status == 200)
            #expect(try await Self.get(url, trusting: caPEM, tls12([.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384])).status == 200)
            #expect(try await Self.get(url, trusting: caPEM, tls12([.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256])).status == 200)
            // CBC with SHA-1 MACs: no longer negotiated.
            for suite in [NIOTLSCipher.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, .TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA] {
                await #expect(throws: (any Error).self, "\(suite.rawValue)") { _ = try await Self.get(url, trusting: caPEM, timeout: 1, tls12([suite])) }
            }
            // Below TLS 1.2: refused.
            await #expect(throws: (any Error).self) {
                _ = try await Self.get(url, trusting: caPEM, timeout: 1) { $0.minimumTLSVersion = .tlsv1; $0.maximumTLSVersion = .tlsv11 }
            }
            // The configuration itself: TLS 1.2 at least, ECDHE + AEAD only.
            let configuration = TLSCredentials.serverConfiguration(chain: try NIOSSLCertificate.fromPEMFile(files.cert), key: try NIOSSLPrivateKey(file: files.key, format: .pem))
            #expect(configuration.minimumTLSVersion == .tlsv12)
            #expect(Set(configuration.cipherSuiteValues.filter { $0.rawValue < 0x1301 || $0.rawValue > 0x1303 }) == Set(TLSCredentials.tls12CipherSuites))
        }
    }

    @Test("a TLS key that group or others can read is refused at load, naming the file and chmod 600; 0600 and 0400 load")
    func tlsKeyMode() throws {
        let dir = try Self.temporaryDirectory("key")
        let (cert, key, _) = try Self.tlsFiles(in: dir, keyMode: 0o644)
        for mode in [0o644, 0o640, 0o604] {
            try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: key)
            do {
                _ = try TLSCredentials(certificatePath: cert, keyPath: key)
                Issue.record("a key of mode \(String(mode, radix: 8)) was loaded")
            } catch let e as TLSSetupError {
                #expect(e.reason.contains(key) && e.reason.contains("chmod 600"), "\(e.reason)")
                #expect(!e.reason.contains("PRIVATE KEY"), "the key itself is never in the error")
            }
        }
        // Through a symlink (a mounted secret): the file's mode counts.
        let link = dir.appendingPathComponent("link.pem").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: key)
        #expect(throws: TLSSetupError.self) { try TLSCredentials(certificatePath: cert, keyPath: link) }
        for mode in [0o600, 0o400] {
            try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: key)
            _ = try TLSCredentials(certificatePath: cert, keyPath: key)
            _ = try TLSCredentials(certificatePath: cert, keyPath: link)
        }
        // A renewal with a readable key is refused; the pair in use stays.
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        let credentials = try TLSCredentials(certificatePath: cert, keyPath: key)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: key)
        try (try String(contentsOfFile: key, encoding: .utf8) + "\n").write(toFile: key, atomically: false, encoding: .utf8)
        #expect(throws: TLSSetupError.self) { try credentials.reloadIfChanged() }
        try? FileManager.default.removeItem(at: dir)
    }

    @Test("over HTTPS every answer carries Strict-Transport-Security: max-age=31536000 (errors too, no includeSubDomains); plain HTTP does not")
    func hsts() async throws {
        try await Self.withHTTPSServer("hsts") { f, caPEM, _ in
            let base = "https://127.0.0.1:\(await f.server.port)"
            for (path, status) in [("/health", 200), ("/no-such-page", 404), ("/v1/app", 401)] {
                let answer = try await Self.get(base + path, trusting: caPEM)
                #expect(answer.status == status, "\(path)")
                #expect(answer.hsts == "max-age=31536000", "\(path): \(answer.hsts ?? "no header")")
            }
        }
        try await ServerFixture.with { f in
            let response = try await f.http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(await f.server.port)/health"), timeout: .seconds(10))
            _ = try await response.body.collect(upTo: 1 << 20)
            #expect(response.headers.first(name: "strict-transport-security") == nil, "HSTS over plain HTTP is ignored by browsers and wrong behind a proxy")
        }
    }

    // MARK: 2. Backups

    static func storeWithData(in dir: URL, jobs: Int) async throws -> SQLiteStore {
        let store = try SQLiteStore(path: dir.appendingPathComponent("live.sqlite").path)
        try await store.migrate()
        let t0 = Date(timeIntervalSince1970: 1_767_225_600)
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: t0))
        try await store.insertActivity(ActivityRecord(id: "a0", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok", startedAt: t0))
        let pad = JSONValue.string(String(repeating: "x", count: 1_000))
        let job = NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: "a0", payload: .update(["pad": pad], alert: LiveActivityAlert(title: "T", body: "B"), at: t0), runAt: t0)
        _ = try await store.enqueue(Array(repeating: job, count: jobs), idempotency: nil, now: t0)
        return store
    }

    struct Interrupted: Error {}

    @Test("a backup stopped before it is complete leaves nothing under its name, and no temporary file: it is written beside it (0600) and named only once whole")
    func backupInterrupted() async throws {
        let dir = try Self.temporaryDirectory("backup-stop")
        let store = try await Self.storeWithData(in: dir, jobs: 50)
        let out = try Self.temporaryDirectory("backup-out")
        let target = out.appendingPathComponent("copy.sqlite").path
        var temporary: String?
        do {
            _ = try store.writeBackup(to: target, check: true, beforeNaming: { t in
                temporary = t
                #expect(!FileManager.default.fileExists(atPath: target), "the final name exists before the copy is complete")
                #expect(URL(fileURLWithPath: t).deletingLastPathComponent().standardizedFileURL.path == out.standardizedFileURL.path, "the temporary file is beside the target")
                #expect(FilePermissions.mode(of: t).map { $0 & 0o777 } == 0o600)
                throw Interrupted()
            })
            Issue.record("the backup was not interrupted")
        } catch {
            // The store reports the failure as a backup failure, naming what stopped it.
            #expect("\(error)".contains("Interrupted"), "\(error)")
        }
        let t = try #require(temporary)
        #expect(!FileManager.default.fileExists(atPath: target))
        #expect(!FileManager.default.fileExists(atPath: t))
        #expect(try FileManager.default.contentsOfDirectory(atPath: out.path).isEmpty)
        // Not interrupted: the copy is complete under its name, 0600, and nothing else is left.
        let bytes: Int64 = try store.backup(to: target)
        #expect(bytes > 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: out.path) == ["copy.sqlite"])
        #expect(FilePermissions.mode(of: target).map { $0 & 0o777 } == 0o600)
        #expect(try await SQLiteStore(path: target).activity(id: "a0")?.updateToken == "tok")
        // Still never overwritten.
        #expect(throws: StoreError.self) { let _: Int64 = try store.backup(to: target) }
        try? FileManager.default.removeItem(at: dir)
        try? FileManager.default.removeItem(at: out)
    }

    /// Watches a path from its own thread while a backup runs.
    final class Watch: Sendable {
        let path: String
        let stop = Mutex(false)
        /// The size of the file when it was first seen under its name.
        let firstSize = Mutex<Int64?>(nil)
        /// "started", then "finished", from the watching thread.
        let signals: AsyncStream<String>
        let signal: AsyncStream<String>.Continuation
        init(path: String) {
            self.path = path
            (signals, signal) = AsyncStream.makeStream(of: String.self)
        }
    }

    @Test("while a backup runs, its name never shows a partial file: the first time the name exists, the file is whole")
    func backupNeverPartial() async throws {
        let dir = try Self.temporaryDirectory("backup-watch")
        let store = try await Self.storeWithData(in: dir, jobs: 3_000)
        let target = dir.appendingPathComponent("copy.sqlite").path
        let watch = Watch(path: target)
        let thread = Thread {
            watch.signal.yield("started")
            while !watch.stop.withLock({ $0 }) {
                if let size = ((try? FileManager.default.attributesOfItem(atPath: watch.path))?[.size] as? NSNumber)?.int64Value {
                    watch.firstSize.withLock { $0 = size }
                    break
                }
            }
            watch.signal.yield("finished")
        }
        thread.start()
        #expect(try await nextValue(of: watch.signals, "the watcher's start") == "started")
        let bytes: Int64 = try store.backup(to: target)
        watch.stop.withLock { $0 = true }
        #expect(try await nextValue(of: watch.signals, "the watcher's end") == "finished")
        let first = watch.firstSize.withLock { $0 }
        #expect(first == nil || first == bytes, "the backup's name showed \(first ?? -1) bytes of \(bytes)")
        try? FileManager.default.removeItem(at: dir)
    }

    // MARK: 3. PostgreSQL URLs

    @Test("a PostgreSQL URL is recognised in any case (POSTGRES://, PostgreSQL://) and parsed; no error about a URL echoes its password")
    func postgresURLCase() throws {
        for url in ["POSTGRES://isle:s3cret-pw@db.example:5433/isle", "PostgreSQL://isle:s3cret-pw@db.example:5433/isle", "postgres://isle:s3cret-pw@db.example:5433/isle"] {
            #expect(PostgresSettings.isPostgresURL(url), "\(url)")
            let settings = try PostgresSettings(url: url, environment: [:])
            #expect(settings.host == "db.example" && settings.port == 5433 && settings.username == "isle" && settings.database == "isle" && settings.password == "s3cret-pw")
            #expect(!settings.redacted.contains("s3cret"))
        }
        #expect(PostgresSettings.isPostgresURL("POSTGRES:isle:s3cret-pw@db.example/isle"))
        #expect(!PostgresSettings.isPostgresURL("/var/lib/isle/isle.sqlite"))
        #expect(!PostgresSettings.isPostgresURL("isle.sqlite"))
        #expect(!PostgresSettings.isPostgresURL("/srv/postgres:old/isle.sqlite"))
        for bad in ["POSTGRES://isle:s3cret-pw@db.example", "POSTGRES://:s3cret-pw@db.example/isle", "POSTGRES://isle:s3cret-pw@/isle",
                    "POSTGRES:isle:s3cret-pw@db.example/isle", "postgres://isle:s3cret-pw@db.example/isle?sslmode=maybe",
                    "postgres://isle:s3cret-pw@db.example/isle?pool=0", "postgres://isle:s3cret-pw@db.example/isle?password=s3cret-pw"] {
            do {
                _ = try PostgresSettings(url: bad, environment: [:])
                Issue.record("\(bad) was accepted")
            } catch {
                #expect(!"\(error)".contains("s3cret"), "\(error)")
            }
        }
    }

    // MARK: 4. Error bodies echo a bounded piece of the path

    @Test("a 405 for a 5,000-character path, and a 404 naming a 256-character key, echo at most 100 characters of it")
    func boundedEchoes() async throws {
        try await ServerFixture.with { f in
            let long = String(repeating: "a", count: 5_000)
            let wrongMethod = try await f.call("PATCH", "/v1/activities/\(long)")
            let said = wrongMethod.json["error"]?["message"]?.stringValue ?? ""
            #expect(wrongMethod.status == 405, "\(wrongMethod.json.jsonString.prefix(300))")
            #expect(!said.contains(String(repeating: "a", count: 101)) && said.contains("…") && said.count < 300, "\(said.prefix(300))")

            let key = String(repeating: "k", count: 256)
            let missing = try await f.call("GET", "/v1/activities/by-key/\(key)", key: f.backendKey)
            let message = missing.json["error"]?["message"]?.stringValue ?? ""
            #expect(missing.status == 404, "\(missing.json.jsonString.prefix(300))")
            #expect(!message.contains(String(repeating: "k", count: 101)) && message.contains(String(repeating: "k", count: 100) + "…"), "\(message)")

            // Short ones are echoed whole.
            let short = try await f.call("GET", "/v1/activities/by-key/order-12", key: f.backendKey)
            #expect(short.status == 404 && short.json["error"]?["message"]?.stringValue == "activity with key order-12 was not found", "\(short.json.jsonString)")
        }
    }

    @Test("PathEcho cuts the whole path and its segments, as sent or percent-decoded, to 100 characters")
    func pathEcho() {
        #expect(PathEcho.clipped("/v1/x") == "/v1/x")
        #expect(PathEcho.clipped(String(repeating: "p", count: 100)) == String(repeating: "p", count: 100))
        #expect(PathEcho.clipped(String(repeating: "p", count: 101)) == String(repeating: "p", count: 100) + "…")
        let decoded = String(repeating: "é", count: 150)
        let encoded = decoded.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)!
        let message = PathEcho.clipping("/v1/activities/\(encoded)", in: "activity \(decoded) was not found")
        #expect(message == "activity \(String(repeating: "é", count: 100))… was not found", "\(message)")
    }
}
