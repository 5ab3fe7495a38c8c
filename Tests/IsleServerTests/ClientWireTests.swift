import Foundation
@testable import IsleClient
import IsleCore
import IsleDelivery
import IsleWire
import Testing

/// IsleClient's requests and answers (its `ClientWire` types, Foundation only) against the server's
/// one definition (IsleWire's `API`): every request the client can write reads into the server's
/// type with the server's strict decoder (an unknown or misspelt field would be refused), and every
/// answer the server writes reads into the client's type.
@Suite("IsleClient's wire types are the server's")
struct ClientWireTests {
    static func serverReads<T: Decodable>(_ type: T.Type, _ data: Data) throws -> T {
        try WireDecoder.decode(type, from: try JSONParser.parse(Array(data)))
    }

    static let token = String(repeating: "ab", count: 32)

    @Test("every request the client writes, with every field, reads into the server's type")
    func requests() throws {
        let report = ClientWire.InstallationReport(pushToStartTokens: ["PizzaDeliveryAttributes": Self.token], widgetToken: Self.token, controlsToken: Self.token, liveActivitiesEnabled: true,
                                                   frequentPushesEnabled: false, environment: "sandbox", ticket: "a.b.c")
        let r = try Self.serverReads(API.InstallationReport.self, ClientWire.encode(report))
        #expect(r.pushToStartTokens?.tokens["PizzaDeliveryAttributes"] == .some(Self.token))
        #expect(r.widgetToken?.value?.text == Self.token && r.controlsToken?.value?.text == Self.token && r.liveActivitiesEnabled == true && r.frequentPushesEnabled == false && r.environment == .sandbox && r.ticket?.text == "a.b.c")
        // An empty report (nothing changed) is still a valid body.
        _ = try Self.serverReads(API.InstallationReport.self, ClientWire.encode(ClientWire.InstallationReport()))

        let registration = ClientWire.ActivityRegistration(attributesType: "PizzaDeliveryAttributes", installationID: "phone", token: Self.token, externalKey: "order-1",
                                                           topics: ["kitchen"], environment: "production", ticket: "a.b.c")
        let a = try Self.serverReads(API.ActivityRegistration.self, ClientWire.encode(registration))
        #expect(a.attributesType.text == "PizzaDeliveryAttributes" && a.installationID.text == "phone" && a.token?.text == Self.token)
        #expect(a.externalKey?.text == "order-1" && a.topics?.names == ["kitchen"] && a.environment == .production && a.ticket?.text == "a.b.c")
        var onChannel = registration
        onChannel.token = nil
        onChannel.channelID = "Y2hhbm5lbA=="
        #expect(try Self.serverReads(API.ActivityRegistration.self, ClientWire.encode(onChannel)).channelID?.text == "Y2hhbm5lbA==")

        #expect(try Self.serverReads(API.TokenReport.self, ClientWire.encode(ClientWire.TokenReport(token: Self.token))).token.text == Self.token)
    }

    @Test("every answer the client reads, as the server writes it, reads into the client's type")
    func answers() throws {
        let installation = API.Installation(id: "phone", bundleID: "com.example.pizza", userID: nil, pushToStartTypes: [], hasWidgetToken: false, liveActivitiesEnabled: true,
                                            frequentPushesEnabled: false, updatedAt: Date(timeIntervalSince1970: 1_790_000_000), environment: nil)
        for secret in ["isle_inst_secret", nil] {
            let body = WireEncoder.encode(API.InstallationRegistration(installation: installation, installationSecret: secret)).jsonBytes
            let read = try #require(ClientWire.Answer.read(Data(body), status: 200, installation: true))
            #expect(read == ClientWire.Answer(id: "phone", installationSecret: secret))
        }
        let activity = API.Activity(id: "act_1", externalKey: "order-1", installationID: "phone", attributesType: "PizzaDeliveryAttributes", attributes: nil, contentState: nil,
                                    state: .active, stateReason: nil, hasToken: true, topics: [], relevanceScore: nil, staleDate: nil,
                                    startedAt: Date(timeIntervalSince1970: 1_790_000_000), endedAt: nil, dismissedAt: nil, environment: .sandbox)
        for status in [200, 201] {
            let read = try #require(ClientWire.Answer.read(Data(WireEncoder.encode(activity).jsonBytes), status: status, installation: false))
            #expect(read.id == "act_1")
        }
        let refusal = API.ErrorEnvelope(error: API.ErrorBody(code: "notFound", message: "no installation phone", field: "installationID"))
        let read = try #require(ClientWire.Answer.read(Data(WireEncoder.encode(refusal).jsonBytes), status: 404, installation: false))
        #expect(read.error == ClientWire.ErrorEnvelope.Body(code: "notFound", message: "no installation phone", field: "installationID"))
    }

    @Test("the client's request fields are the document's, route by route")
    func fields() throws {
        let doc = APIDocument.json
        func properties(_ component: String) -> Set<String> { Set(doc["components"]?["schemas"]?[component]?["properties"]?.objectValue?.keys ?? []) }
        func keys<T: Encodable>(_ value: T) throws -> Set<String> { Set(try JSONParser.parse(Array(ClientWire.encode(value))).objectValue?.keys ?? []) }
        let all = try keys(ClientWire.InstallationReport(pushToStartTokens: ["T": Self.token], widgetToken: Self.token, controlsToken: Self.token, liveActivitiesEnabled: true,
                                                         frequentPushesEnabled: true,
                                                         environment: "sandbox", ticket: "a.b.c", broadcastChannels: true, topics: ["t"]))
        #expect(all == properties("InstallationReport"))
        let registration = try keys(ClientWire.ActivityRegistration(attributesType: "T", installationID: "i", token: Self.token, channelID: "c", externalKey: "k", topics: ["t"],
                                                                    environment: "sandbox", ticket: "a.b.c"))
        // What the client never sends: the app's attributes and content state (ActivityKit keeps them), a relevance score.
        #expect(registration == properties("ActivityRegistration").subtracting(["attributes", "contentState", "relevanceScore"]))
        #expect(try keys(ClientWire.TokenReport(token: Self.token)) == properties("TokenReport"))
    }
}
