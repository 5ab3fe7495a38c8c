import NIOSSL

/// A TLS failure to APNs in words a person can act on: which certificate was refused and why, never
/// the TLS library's internal error chain (it names source files of the build and BoringSSL's
/// internal codes). The full error goes to the debug log only.
enum TLSFailure {
    static func describe(_ error: any Error, host: String) -> String {
        if let extra = error as? NIOSSLExtraError, extra == .failedToValidateHostname {
            return "the TLS certificate \(host) presented is for another host name"
        }
        let text = String(describing: error)
        if text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("certificate verify failed") || text.contains("unable to get local issuer") {
            return "the TLS certificate \(host) presented is not signed by a CA this server trusts (or is expired, or not yet valid)"
        }
        if text.contains("WRONG_VERSION_NUMBER") || text.contains("wrong version number") {
            return "\(host) does not speak TLS on that port"
        }
        if text.contains("ALPN") || text.contains("NO_APPLICATION_PROTOCOL") {
            return "\(host) did not agree to HTTP/2 during the TLS handshake"
        }
        return "the TLS handshake with \(host) failed"
    }

    /// What to do, for a TLS failure to this APNs (in the client's terms; a program using the client
    /// adds how its own settings name the trusted CA).
    static func advice(for environment: APNsEnvironment) -> String {
        switch environment {
        case .custom(let url, _, _, let roots):
            if roots != nil {
                return "This client trusts only the CA certificates it was given for \(url): give it the CA that signed that server's certificate."
            }
            return "\(url) is checked against this machine's CA certificates: give the client the CA that signed its certificate."
        case .production, .sandbox:
            return "Update this machine's CA certificates (the ca-certificates package) and check its clock; a proxy that intercepts TLS must not stand between this client and APNs."
        }
    }
}
