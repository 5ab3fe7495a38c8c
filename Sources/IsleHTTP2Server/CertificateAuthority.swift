public import Foundation
import Crypto
import SwiftASN1
import X509

/// A certificate authority made in process, for loopback TLS: a CA certificate that clients
/// trust, and server certificates for `localhost` / `127.0.0.1` / `::1` signed by it.
public struct CertificateAuthority: Sendable {
    /// The CA certificate in PEM: give this to a client as its only trust root.
    public let certificatePEM: String
    private let key: Certificate.PrivateKey
    private let certificate: Certificate

    /// The CA's private key in PEM (PKCS#8), to keep beside `certificatePEM` (owner-only) so the same
    /// CA can issue again after a restart.
    public func privateKeyPEM() throws -> String { try key.serializeAsPEM().pemString }

    /// Whether `name` may go into a certificate as a DNS name: letters, digits and hyphens in
    /// labels of 1–63, dots between them, at most 253 characters; a leading `*.` is a wildcard.
    public static func isValidDNSName(_ name: String) -> Bool {
        // An address is not a DNS name (a certificate names it as an IP address).
        if name.split(separator: ".").allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isNumber) }) || name.contains(":") { return false }
        var n = Substring(name)
        if n.hasPrefix("*.") { n = n.dropFirst(2) }
        guard !n.isEmpty, n.utf8.count <= 253 else { return false }
        return n.split(separator: ".", omittingEmptySubsequences: false).allSatisfy { label in
            (1...63).contains(label.utf8.count) && label.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) || $0 == 0x2D }
                && label.first != "-" && label.last != "-"
        }
    }

    /// Each CA's name ends with a random suffix: a client trusting two of them (two simulators, one
    /// per APNs environment) finds each server's issuer by name, and two CAs of one name would
    /// make TLS check a certificate against the wrong key.
    public init(commonName: String = "Isle Local CA", now: Date = Date()) throws {
        let key = P256.Signing.PrivateKey()
        self.key = Certificate.PrivateKey(key)
        let unique = commonName + " " + UUID().uuidString.prefix(8).lowercased()
        let name = try DistinguishedName {
            OrganizationName("Isle")
            CommonName(unique)
        }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: now.addingTimeInterval(10 * 365 * 86400),
            issuer: name,
            subject: name,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: Certificate.PublicKey(key.publicKey))
            },
            issuerPrivateKey: Certificate.PrivateKey(key)
        )
        self.certificate = certificate
        certificatePEM = try certificate.serializeAsPEM().pemString
    }

    /// A CA the team already has (its certificate and private key, PEM): the server certificates
    /// it issues chain to a root the team's machines and containers already trust.
    /// Throws ``CertificateAuthorityError`` naming what is wrong: not PEM, not a CA, a key that is
    /// not the certificate's, a CA that may not sign certificates, or one that is not valid now.
    public init(certificatePEM: String, privateKeyPEM: String, now: Date = Date()) throws(CertificateAuthorityError) {
        let certificate: Certificate
        do { certificate = try Certificate(pemEncoded: certificatePEM) } catch {
            throw CertificateAuthorityError("the CA certificate is not a PEM X.509 certificate (-----BEGIN CERTIFICATE-----)", field: "caCert")
        }
        let key: Certificate.PrivateKey
        do { key = try Certificate.PrivateKey(pemEncoded: privateKeyPEM) } catch {
            throw CertificateAuthorityError("the CA key is not a PEM private key (P-256, P-384, P-521 or RSA; PKCS#8 or SEC1)", field: "caKey")
        }
        guard key.publicKey == certificate.publicKey else {
            throw CertificateAuthorityError("the CA key is not the CA certificate's key", field: "caKey")
        }
        guard case .isCertificateAuthority = try? certificate.extensions.basicConstraints else {
            throw CertificateAuthorityError("the CA certificate is not a CA (its Basic Constraints do not say CA:TRUE)", field: "caCert")
        }
        if let usage = try? certificate.extensions.keyUsage, !usage.keyCertSign {
            throw CertificateAuthorityError("the CA certificate's Key Usage does not allow signing certificates (keyCertSign)", field: "caCert")
        }
        guard certificate.notValidBefore <= now, now < certificate.notValidAfter else {
            throw CertificateAuthorityError("the CA certificate is not valid now (valid \(certificate.notValidBefore) to \(certificate.notValidAfter))", field: "caCert")
        }
        self.key = key
        self.certificate = certificate
        self.certificatePEM = certificatePEM.hasSuffix("\n") ? certificatePEM : certificatePEM + "\n"
    }

    /// A server certificate and key (PEM) for the given DNS names and IP addresses.
    public func issueServerCertificate(
        dnsNames: [String] = ["localhost"],
        ipAddresses: [[UInt8]] = [[127, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]],
        now: Date = Date()
    ) throws -> (certificatePEM: String, privateKeyPEM: String) {
        let leafKey = P256.Signing.PrivateKey()
        // A leaf no longer than its CA (strict verifiers check the chain's validity nesting).
        let notAfter = min(now.addingTimeInterval(365 * 86400), certificate.notValidAfter)
        // The issuing CA's key identifier: strict verifiers (OpenSSL's X509_V_FLAG_X509_STRICT,
        // Python's default since 3.13) refuse a leaf without an Authority Key Identifier.
        let authorityKeyID = (try? certificate.extensions.subjectKeyIdentifier)?.keyIdentifier ?? SubjectKeyIdentifier(hash: certificate.publicKey).keyIdentifier
        let subject = try DistinguishedName {
            OrganizationName("Isle")
            CommonName(dnsNames.first ?? "localhost")
        }
        var names: [GeneralName] = dnsNames.map { .dnsName($0) }
        names += ipAddresses.map { .ipAddress(ASN1OctetString(contentBytes: ArraySlice($0))) }
        let leaf = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(leafKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600),
            notValidAfter: notAfter,
            issuer: certificate.subject,
            subject: subject,
            // Signed as the CA's key signs: ECDSA with its curve's hash, or RSA with SHA-256.
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(names)
                SubjectKeyIdentifier(hash: Certificate.PublicKey(leafKey.publicKey))
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyID)
            },
            issuerPrivateKey: key
        )
        // An intermediate CA goes with the leaf, so a client that trusts only its root can build the chain.
        var chain = try leaf.serializeAsPEM().pemString
        if certificate.issuer != certificate.subject { chain += "\n" + (try certificate.serializeAsPEM().pemString) }
        return (chain, leafKey.pemRepresentation)
    }
}

/// Why a CA given by the team cannot sign the simulator's certificate.
public struct CertificateAuthorityError: Error, Sendable, Hashable, CustomStringConvertible {
    public var reason: String
    /// Which input: `caCert` or `caKey`.
    public var field: String
    public init(_ reason: String, field: String) {
        self.reason = reason
        self.field = field
    }
    public var description: String { reason }
}
