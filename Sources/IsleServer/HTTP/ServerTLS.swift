import Foundation
import HummingbirdCore
import IsleStore
import IsleDelivery
import Logging
import NIOCore
import NIOSSL
import ServiceLifecycle
import Synchronization

/// The API's TLS certificate and key (`isle serve --tls-cert --tls-key`), read from their files
/// and read again when they change (a renewal by certbot or a secret mount), without a restart:
/// new connections get the new certificate, open ones keep theirs. A bad new pair is refused and
/// the one in use kept (docs/server.md, "TLS").
public final class TLSCredentials: Sendable {
    public let certificatePath: String
    public let keyPath: String
    struct Loaded {
        var context: NIOSSLContext
        var stamp: String
    }
    private let state: Mutex<Loaded>

    /// Reads the pair now; a missing or bad file is an error naming it.
    public init(certificatePath: String, keyPath: String) throws {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        state = Mutex(try Self.load(certificatePath, keyPath))
    }

    var context: NIOSSLContext { state.withLock { $0.context } }

    static func stamp(_ paths: [String]) -> String {
        paths.map { p in
            // The file itself, through symlinks: a mounted secret swaps a directory the link points into.
            let a = try? FileManager.default.attributesOfItem(atPath: URL(fileURLWithPath: p).resolvingSymlinksInPath().path)
            return "\((a?[.modificationDate] as? Date)?.timeIntervalSince1970 ?? 0)/\((a?[.size] as? NSNumber)?.intValue ?? -1)"
        }.joined(separator: ",")
    }

    /// The TLS 1.2 suites offered: ECDHE only (forward secrecy: a key stolen later does not open
    /// recorded traffic) and AEAD only (no CBC with SHA-1 MACs), for ECDSA and RSA certificates
    /// alike. TLS 1.3's suites are all of that already and are not configurable.
    static let tls12CipherSuites: [NIOTLSCipher] = [
        .TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, .TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        .TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, .TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        .TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, .TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ]

    /// The server's TLS settings for a certificate chain and its key: TLS 1.2 at least, with
    /// ``tls12CipherSuites`` only.
    static func serverConfiguration(chain: [NIOSSLCertificate], key: NIOSSLPrivateKey) -> TLSConfiguration {
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        configuration.minimumTLSVersion = .tlsv12
        configuration.cipherSuiteValues = tls12CipherSuites
        return configuration
    }

    static func load(_ cert: String, _ key: String) throws -> Loaded {
        let stamp = stamp([cert, key])
        // The key is the server's identity: a copy another user of the machine can read lets them
        // impersonate it. Refused like a readable master key (checked through symlinks: a mounted
        // secret's mode is the file's).
        if let mode = FilePermissions.mode(of: URL(fileURLWithPath: key).resolvingSymlinksInPath().path), mode & 0o077 != 0 {
            throw TLSSetupError(reason: "--tls-key: \(key) can be read by other users of this machine (mode \(String(mode & 0o777, radix: 8))), and it is the server's private key; run: chmod 600 \(key)")
        }
        let chain: [NIOSSLCertificate]
        do { chain = try NIOSSLCertificate.fromPEMFile(cert) } catch { throw TLSSetupError(reason: "--tls-cert: \(cert) is not a PEM certificate chain (\(error))") }
        guard !chain.isEmpty else { throw TLSSetupError(reason: "--tls-cert: \(cert) holds no certificate") }
        let privateKey: NIOSSLPrivateKey
        do { privateKey = try NIOSSLPrivateKey(file: key, format: .pem) } catch { throw TLSSetupError(reason: "--tls-key: \(key) is not a PEM private key (\(error))") }
        do {
            return Loaded(context: try NIOSSLContext(configuration: serverConfiguration(chain: chain, key: privateKey)), stamp: stamp)
        } catch {
            throw TLSSetupError(reason: "--tls-cert/--tls-key: the certificate and the key do not make a TLS context (do they belong together?): \(error)")
        }
    }

    /// Reads the files again (SIGHUP), changed or not; the pair in use stays when the new one does not load.
    public func reload() throws {
        let loaded = try Self.load(certificatePath, keyPath)
        state.withLock { $0 = loaded }
    }

    /// Reads the files again if they changed since the last read; true when the new pair is in use.
    @discardableResult
    public func reloadIfChanged() throws -> Bool {
        let now = Self.stamp([certificatePath, keyPath])
        guard now != state.withLock({ $0.stamp }) else { return false }
        let loaded = try Self.load(certificatePath, keyPath)
        state.withLock { $0 = loaded }
        return true
    }
}

public struct TLSSetupError: Error, CustomStringConvertible {
    public var reason: String
    public var description: String { reason }
}

/// TLS in front of the HTTP channel, with the certificate in use at each new connection.
struct ReloadingTLSChannel<Base: ServerChildChannel>: ServerChildChannel {
    typealias Value = Base.Value
    let base: Base
    let credentials: TLSCredentials

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        let context = credentials.context
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
            try channel.pipeline.syncOperations.addHandler(CloseOnTLSError())
        }.flatMap {
            base.setup(channel: channel, logger: logger)
        }
    }

    func handle(value: Value, logger: Logger) async {
        await base.handle(value: value, logger: logger)
    }
}

/// A TLS failure (a client that refused the certificate, a handshake that is not TLS) ends the
/// connection at once, rather than leaving it open until a deadline (or a graceful stop) closes it.
final class CloseOnTLSError: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is NIOSSLError || error is BoringSSLError { context.close(promise: nil) }
        context.fireErrorCaught(error)
    }
}

/// Looks at the certificate files every `interval` and reloads them when they change.
final class TLSReloader: Service {
    let credentials: TLSCredentials
    let interval: Duration
    let logger: Logger

    init(credentials: TLSCredentials, interval: Duration, logger: Logger) {
        self.credentials = credentials
        self.interval = interval
        self.logger = logger
    }

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try? await Task.sleep(for: self.interval)
                do {
                    if try self.credentials.reloadIfChanged() {
                        self.logger.notice("TLS certificate reloaded", metadata: ["certificate": "\(self.credentials.certificatePath)"])
                    }
                } catch {
                    self.logger.error("the new TLS certificate or key cannot be used; the one in use is kept", metadata: ["error": "\(error)"])
                }
            }
        }
    }
}
