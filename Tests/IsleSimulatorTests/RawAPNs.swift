import AsyncHTTPClient
import Crypto
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import NIOCore
import NIOSSL
import Synchronization

/// An HTTP/2 client for the fake APNs that builds every request and JWT by hand. It shares no
/// code with IsleAPNs: the simulator is tested on its own.
final class RawAPNs: Sendable {
    let client: HTTPClient
    /// The device host; broadcasts and channel management have their own, as at Apple.
    let baseURL: String
    let broadcastURL: String
    let managementURL: String
    let key: P256.Signing.PrivateKey
    let keyID: String
    let teamID: String

    init(sim: IsleSim, key: P256.Signing.PrivateKey = P256.Signing.PrivateKey(), keyID: String = "KEY0000001", teamID: String = "TEAM000001", register: Bool = true) throws {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(sim.caCertificatePEM!.utf8)))
        var config = HTTPClient.Configuration(tlsConfiguration: tls)
        config.httpVersion = .automatic
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: config)
        baseURL = sim.apnsURL
        broadcastURL = sim.broadcastURL
        managementURL = sim.managementURL
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
        if register { try sim.apns.register(RegisteredKey(keyID: keyID, teamID: teamID, publicKeyPEM: key.publicKey.pemRepresentation)) }
    }

    func shutdown() async throws { try await client.shutdown() }

    static func b64url(_ bytes: some Sequence<UInt8>) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// Like a real client, one token per iat is minted once and reused (ECDSA signatures are
    /// randomised, so minting again would make a different token).
    let cache = Mutex<[Int64: String]>([:])

    func jwt(iat: Date, iatLiteral: String? = nil, kid: String? = nil, signer: P256.Signing.PrivateKey? = nil) -> String {
        let plain = iatLiteral == nil && kid == nil && signer == nil
        let seconds = Int64(iat.timeIntervalSince1970)
        guard plain else { return makeJWT(iat: iat, iatLiteral: iatLiteral, kid: kid, signer: signer) }
        // Looked up and minted under one lock: concurrent senders of one second must share one token
        // (a check-then-set let two of them mint two, and the fake APNs rightly answered 429).
        return cache.withLock { cache in
            if let cached = cache[seconds] { return cached }
            let token = makeJWT(iat: iat, iatLiteral: nil, kid: nil, signer: nil)
            cache[seconds] = token
            return token
        }
    }

    func makeJWT(iat: Date, iatLiteral: String?, kid: String?, signer: P256.Signing.PrivateKey?) -> String {
        let header = #"{"alg":"ES256","kid":"\#(kid ?? keyID)"}"#
        let claims = #"{"iss":"\#(teamID)","iat":\#(iatLiteral ?? String(Int64(iat.timeIntervalSince1970)))}"#
        let input = Self.b64url(header.utf8) + "." + Self.b64url(claims.utf8)
        let sig = try! (signer ?? key).signature(for: Array(input.utf8))
        return input + "." + Self.b64url(sig.rawRepresentation)
    }

    struct Answer {
        var status: Int
        var headers: [(String, String)]
        var body: [UInt8]
        var reason: String? { (try? JSONParser.parse(body))?["reason"]?.stringValue }
        var json: JSONValue? { try? JSONParser.parse(body) }
        func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name }?.1 }
    }

    func send(_ path: String, headers: [(String, String)], body: [UInt8] = []) async throws -> Answer {
        try await send("POST", path, headers: headers, body: body)
    }

    /// Sends to the host Apple serves `path` on (`/3/` device, `/4/` broadcast, `/1/` channel
    /// management), or to `host` when given (a client that mixes them up).
    func send(_ method: String, _ path: String, headers: [(String, String)], body: [UInt8] = [], host: String? = nil) async throws -> Answer {
        let base = host ?? (path.hasPrefix("/4/") ? broadcastURL : path.hasPrefix("/1/") ? managementURL : baseURL)
        var request = HTTPClientRequest(url: base + path)
        request.method = .init(rawValue: method)
        for (n, v) in headers { request.headers.add(name: n, value: v) }
        if !body.isEmpty { request.body = .bytes(ByteBuffer(bytes: body)) }
        let response = try await client.execute(request, timeout: .seconds(10))
        let bytes = try await response.body.collect(upTo: 1 << 20)
        return Answer(status: Int(response.status.code), headers: response.headers.map { ($0.name, $0.value) }, body: Array(buffer: bytes))
    }
}

/// The pizza app of Apple's samples, as installed on simulated devices in these tests.
enum Pizza {
    static let bundleID = "com.example.pizza"
    static let schema = try! ActivitySchema(jsonText: """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes": { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange" } }
        """)
    static let attributes: JSONValue = ["numberOfPizzas": 3, "totalAmount": "$42.00", "orderNumber": "12345"]
    static func state(_ driver: String = "Bill James") -> JSONValue { ["driverName": .string(driver), "deliveryTimer": [788_918_400, 788_919_900]] }
    static let t0 = Date(timeIntervalSince1970: 1_767_225_600)

    static func update(_ t: Date, driver: String = "Anne Johnson", extra: JSONObject = [:]) -> JSONValue {
        var aps: JSONObject = ["timestamp": .int(Int64(t.timeIntervalSince1970)), "event": "update", "content-state": state(driver)]
        for (k, v) in extra { aps[k] = v }
        return ["aps": .object(aps)]
    }

    static func install(_ world: SimulatorWorld, on device: String, environment: SimulatedEnvironment = .sandbox, frequent: Bool = false,
                        localization: [String: String] = [:], widgets: [SimulatedWidget.Configuration] = []) throws -> SimulatedApp {
        try world.install(.init(bundleID: bundleID, environment: environment, schemas: [schema], declaresFrequentUpdates: frequent, localization: localization, widgets: widgets), on: device)
    }
}
