import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL

/// ``APNsTransport`` over AsyncHTTPClient: HTTP/2 negotiated by ALPN, pooled connections,
/// many requests in flight per connection.
public final class AsyncHTTPClientTransport: APNsTransport {
    private let client: HTTPClient
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
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    public func execute(_ request: APNsTransportRequest, timeout: Duration) async throws(APNsTransportError) -> APNsTransportResponse {
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

    public func shutdown() async throws { try await client.shutdown() }

    /// The host and port of a URL, for messages.
    static func host(of url: String) -> String {
        let rest = url.hasPrefix("https://") ? url.dropFirst("https://".count) : Substring(url)
        return String(rest.prefix { $0 != "/" })
    }
}
