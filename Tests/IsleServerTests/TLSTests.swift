import AsyncHTTPClient
import Foundation
import IsleHTTP2Server
import IsleServer
import IsleTesting
import NIOCore
import NIOSSL
import Testing

/// TLS on the API (`--tls-cert`, `--tls-key`), with a real HTTPS client, and a renewed
/// certificate picked up without a restart.
@Suite("TLS on the API", .serialized)
struct TLSTests {
    static func files(_ ca: CertificateAuthority, cert: String, key: String) throws {
        let leaf = try ca.issueServerCertificate()
        try leaf.certificatePEM.write(toFile: cert, atomically: true, encoding: .utf8)
        try leaf.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
        // A key others can read is refused (docs/security.md).
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
    }

    /// AsyncHTTPClient retries a refused handshake until the request's deadline: the refusals are
    /// asked with a short one.
    static func get(_ url: String, trusting pem: String, timeout: Int64 = 10) async throws -> Int {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: tls))
        do {
            let response = try await client.execute(HTTPClientRequest(url: url), timeout: .seconds(timeout))
            let status = Int(response.status.code)
            _ = try await response.body.collect(upTo: 1 << 16)
            try await client.shutdown()
            return status
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    @Test("HTTPS with a real client; a client that does not trust the certificate is refused; a renewed certificate is served to new connections without a restart; a bad renewal keeps the one in use")
    func https() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let cert = dir.appendingPathComponent("cert.pem").path, key = dir.appendingPathComponent("key.pem").path
        let first = try CertificateAuthority(commonName: "First CA")
        try Self.files(first, cert: cert, key: key)
        let credentials = try TLSCredentials(certificatePath: cert, keyPath: key)
        try await ServerFixture.with(server: { c in
            c.tls = credentials
            c.tlsReloadInterval = .seconds(3600)  // the test reloads by hand
        }) { f in
            let url = "https://127.0.0.1:\(await f.server.port)/health"
            #expect(try await Self.get(url, trusting: first.certificatePEM) == 200)
            let second = try CertificateAuthority(commonName: "Second CA")
            await #expect(throws: (any Error).self) { _ = try await Self.get(url, trusting: second.certificatePEM, timeout: 1) }
            // Renewed on disk (as certbot does), then read again.
            try Self.files(second, cert: cert, key: key)
            #expect(try credentials.reloadIfChanged())
            #expect(try await Self.get(url, trusting: second.certificatePEM) == 200)
            await #expect(throws: (any Error).self) { _ = try await Self.get(url, trusting: first.certificatePEM, timeout: 1) }
            // A broken renewal (a key that is not PEM) is refused; the certificate in use stays.
            try "not a key".write(toFile: key, atomically: true, encoding: .utf8)
            #expect(throws: TLSSetupError.self) { try credentials.reloadIfChanged() }
            #expect(try await Self.get(url, trusting: second.certificatePEM) == 200)
        }
    }

    @Test("bad TLS files are named before anything starts")
    func badFiles() throws {
        #expect(throws: TLSSetupError.self) { try TLSCredentials(certificatePath: "/nonexistent/cert.pem", keyPath: "/nonexistent/key.pem") }
    }
}
