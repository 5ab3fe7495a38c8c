import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// ``APNsTransport`` over AsyncHTTPClient: HTTP/2 negotiated by ALPN, pooled connections,
/// many requests in flight per connection.
///
/// A connection carries one provider token: APNs answers 429 `TooManyProviderTokenUpdates`
/// when a connection sees its token change within 20 minutes (docs/protocol.md §1.3), and
/// AsyncHTTPClient picks connections by host alone. So each token of a signing key gets its own
/// `HTTPClient` (its own connections); when a newer token appears, the older one's client
/// finishes its requests and shuts down.
public final class AsyncHTTPClientTransport: APNsTransport {
    private struct Generation {
        var token: UInt64
        var client: HTTPClient
        var inFlight = 0
    }

    private struct State {
        /// Per signing key, the client for its newest token.
        var current: [UInt64: Generation] = [:]
        /// Clients of replaced tokens, until their last request ends.
        var retired: [Generation] = []
        /// Tokens replaced by newer ones (a few): a request still carrying one is a straggler.
        var retiredTokens: Set<UInt64> = []
        var isShutDown = false
    }

    private let configuration: HTTPClient.Configuration
    private let state = Mutex(State())
    private let connectTimeout: Duration
    public static let maximumResponseBody = 64 * 1024

    /// - Parameters:
    ///   - trustRootsPEM: CA certificates to trust instead of the system's (for a fake APNs).
    ///   - connectTimeout: how long to wait for TCP + TLS.
    public init(trustRootsPEM: String? = nil, connectTimeout: Duration = .seconds(10)) throws(APNsTransportError) {
        self.connectTimeout = connectTimeout
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let trustRootsPEM {
            do {
                let roots = try NIOSSLCertificate.fromPEMBytes(Array(TrustRoots.normalized(trustRootsPEM).utf8))
                guard !roots.isEmpty else { throw APNsTransportError(kind: .tlsFailed, reason: "no certificate found in the trust roots PEM") }
                tls.trustRoots = .certificates(roots)
            } catch let e as APNsTransportError {
                throw e
            } catch {
                throw APNsTransportError(kind: .tlsFailed, reason: "the trust roots are not valid PEM certificates")
            }
        }
        var configuration = HTTPClient.Configuration(tlsConfiguration: tls, redirectConfiguration: .disallow, decompression: .disabled)
        configuration.httpVersion = .automatic
        configuration.timeout.connect = .nanoseconds(Int64(connectTimeout.components.seconds) * 1_000_000_000 + connectTimeout.components.attoseconds / 1_000_000_000)
        configuration.connectionPool = .init(idleTimeout: .minutes(60))
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 16
        self.configuration = configuration
    }

    /// The client for this token, counted in flight (nil once shut down), and a replaced client
    /// with nothing in flight, to shut down.
    private func client(for credential: ProviderCredential) -> (HTTPClient, idle: HTTPClient?)? {
        state.withLock { s -> (HTTPClient, idle: HTTPClient?)? in
            if s.isShutDown { return nil }
            if var g = s.current[credential.key], g.token == credential.token {
                g.inFlight += 1
                s.current[credential.key] = g
                return (g.client, nil)
            }
            if let i = s.retired.firstIndex(where: { $0.token == credential.token }) {
                // Built with a token just replaced: its own client still finishes.
                s.retired[i].inFlight += 1
                return (s.retired[i].client, nil)
            }
            if s.retiredTokens.contains(credential.token) {
                let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
                s.retired.append(Generation(token: credential.token, client: client, inFlight: 1))
                return (client, nil)
            }
            var idle: HTTPClient?
            if let old = s.current[credential.key] {
                if s.retiredTokens.count >= 64 { s.retiredTokens.removeAll() }
                s.retiredTokens.insert(old.token)
                if old.inFlight > 0 { s.retired.append(old) } else { idle = old.client }
            }
            let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
            s.current[credential.key] = Generation(token: credential.token, client: client, inFlight: 1)
            return (client, idle)
        }
    }

    /// A request on `credential`'s client ended; a replaced client with nothing left is returned to shut down.
    private func done(_ credential: ProviderCredential) -> HTTPClient? {
        state.withLock { s -> HTTPClient? in
            if var g = s.current[credential.key], g.token == credential.token {
                g.inFlight -= 1
                s.current[credential.key] = g
                return nil
            }
            guard let i = s.retired.firstIndex(where: { $0.token == credential.token }) else { return nil }
            s.retired[i].inFlight -= 1
            return s.retired[i].inFlight <= 0 ? s.retired.remove(at: i).client : nil
        }
    }

    public func execute(_ request: APNsTransportRequest, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse {
        let credential = ProviderCredential(authorization: request.value("authorization"))
        guard let (client, idle) = client(for: credential) else {
            throw APNsTransportError(kind: .cancelled, reason: "the transport was shut down")
        }
        if let idle { try? await idle.shutdown() }
        let result: Result<APNsTransportResponse, APNsTransportError>
        do throws(APNsTransportError) {
            result = .success(try await execute(request, timeout: timeout, on: client))
        } catch {
            result = .failure(error)
        }
        if let finished = done(credential) { try? await finished.shutdown() }
        return try result.get()
    }

    private func execute(_ request: APNsTransportRequest, timeout: Duration, on client: HTTPClient) async throws(APNsTransportError) -> APNsTransportResponse {
        var r = HTTPClientRequest(url: request.url)
        r.method = HTTPMethod(rawValue: request.method)
        for (name, value) in request.headers { r.headers.add(name: name, value: value) }
        if !request.body.isEmpty || request.method == "POST" {
            r.body = .bytes(ByteBuffer(bytes: request.body))
        }
        let amount = TimeAmount.nanoseconds(Int64(timeout.components.seconds) * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000)
        do {
            let response = try await client.execute(r, timeout: amount)
            let body = try await response.body.collect(upTo: Self.maximumResponseBody)
            return APNsTransportResponse(
                status: Int(response.status.code),
                headers: response.headers.map { ($0.name.lowercased(), $0.value) },
                body: Array(buffer: body)
            )
        } catch let error as HTTPClientError {
            switch error {
            case .connectTimeout:
                throw APNsTransportError(kind: .timedOut, reason: "could not connect (TCP + TLS) within \(connectTimeout)")
            case .deadlineExceeded, .readTimeout, .writeTimeout:
                throw APNsTransportError(kind: .timedOut, reason: "no answer within \(timeout)")
            case .cancelled:
                throw APNsTransportError(kind: .cancelled, reason: "the request was cancelled")
            case .remoteConnectionClosed:
                throw APNsTransportError(kind: .connectionFailed, reason: "the connection closed before a response")
            default:
                throw APNsTransportError(kind: .other, reason: "\(error)")
            }
        } catch is CancellationError {
            throw APNsTransportError(kind: .cancelled, reason: "the request was cancelled")
        } catch let error as NIOSSLError {
            throw APNsTransportError(kind: .tlsFailed, reason: TLSFailure.describe(error, host: Self.host(of: request.url)))
        } catch let error as BoringSSLError {
            throw APNsTransportError(kind: .tlsFailed, reason: TLSFailure.describe(error, host: Self.host(of: request.url)))
        } catch let error as NIOSSLExtraError {
            throw APNsTransportError(kind: .tlsFailed, reason: TLSFailure.describe(error, host: Self.host(of: request.url)))
        } catch {
            let text = String(describing: error)
            let kind: APNsTransportError.Kind = text.contains("connect") || text.contains("Connection") ? .connectionFailed : .other
            throw APNsTransportError(kind: kind, reason: text)
        }
    }

    public func shutdown() async throws {
        let all = state.withLock { s -> [HTTPClient] in
            s.isShutDown = true
            defer {
                s.current = [:]
                s.retired = []
            }
            return s.current.values.map(\.client) + s.retired.map(\.client)
        }
        for client in all { try await client.shutdown() }
    }

    /// The host and port of a URL, for messages.
    static func host(of url: String) -> String {
        let rest = url.hasPrefix("https://") ? url.dropFirst("https://".count) : Substring(url)
        return String(rest.prefix { $0 != "/" })
    }
}
