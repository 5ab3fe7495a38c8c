public import Foundation
import Crypto
import SwiftASN1
import X509

/// A certificate authority made in process, for loopback TLS: a CA certificate that clients
/// trust, and server certificates for `localhost` / `127.0.0.1` / `::1` signed by it.
public struct CertificateAuthority: Sendable {
    /// The CA certificate in PEM: give this to a client as its only trust root.
    public let certificatePEM: String
    private let key: P256.Signing.PrivateKey
    private let certificate: Certificate

    /// Each CA's name ends with a random suffix: a client trusting two of them (two simulators, one
    /// per APNs environment) finds each server's issuer by name, and two CAs of one name would
    /// make TLS check a certificate against the wrong key.
    public init(commonName: String = "Isle Local CA", now: Date = Date()) throws {
        let key = P256.Signing.PrivateKey()
        self.key = key
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

    /// A server certificate and key (PEM) for the given DNS names and IP addresses.
    public func issueServerCertificate(
        dnsNames: [String] = ["localhost"],
        ipAddresses: [[UInt8]] = [[127, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]],
        now: Date = Date()
    ) throws -> (certificatePEM: String, privateKeyPEM: String) {
        let leafKey = P256.Signing.PrivateKey()
        // The issuing CA's key identifier: strict verifiers (OpenSSL's X509_V_FLAG_X509_STRICT,
        // Python's default since 3.13) refuse a leaf without an Authority Key Identifier.
        let authorityKeyID = try certificate.extensions.subjectKeyIdentifier?.keyIdentifier ?? SubjectKeyIdentifier(hash: certificate.publicKey).keyIdentifier
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
            notValidAfter: now.addingTimeInterval(365 * 86400),
            issuer: certificate.subject,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames(names)
                SubjectKeyIdentifier(hash: Certificate.PublicKey(leafKey.publicKey))
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyID)
            },
            issuerPrivateKey: Certificate.PrivateKey(key)
        )
        return (try leaf.serializeAsPEM().pemString, leafKey.pemRepresentation)
    }
}
