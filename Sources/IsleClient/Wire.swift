import Foundation

/// The requests IsleClient sends and the answers it reads, as `Codable` types: the device's part of
/// the server's API (its OpenAPI document, `/openapi.json`, made from the server's own types in
/// IsleWire). The server's tests encode each of these and read it with the server's strict
/// decoder, and read the server's answers with these, so the two cannot drift apart; every request
/// the client sends in those tests is also checked against the document's schemas.
/// Foundation only: the client has no dependency.
enum ClientWire {
    /// `PUT /v1/installations/{installation}`. An absent field keeps what the server has.
    struct InstallationReport: Codable, Equatable {
        var pushToStartTokens: [String: String]?
        var widgetToken: String?
        var controlsToken: String?
        var liveActivitiesEnabled: Bool?
        var frequentPushesEnabled: Bool?
        var environment: String?
        var ticket: String?
        var broadcastChannels: Bool?
        var topics: [String]?
    }

    /// `POST /v1/activities`: an activity on its update token, or on a broadcast channel.
    struct ActivityRegistration: Codable, Equatable {
        var attributesType: String
        var installationID: String
        var token: String?
        var channelID: String?
        var externalKey: String?
        var topics: [String]?
        var environment: String?
        var ticket: String?
    }

    /// `PUT /v1/activities/{activity}/token`.
    struct TokenReport: Codable, Equatable {
        var token: String
    }

    /// `POST /v1/topics/{topic}/channel`: the topic's channel for this installation.
    struct TopicChannelRequest: Codable, Equatable {
        var installationID: String
    }

    /// Its answer: the channel to start the activity on.
    struct FollowChannel: Codable, Equatable {
        var topic: String
        var channelID: String
        var environment: String
    }

    /// The answer to an installation's registration: its fields, and its secret once.
    struct InstallationAnswer: Codable, Equatable {
        var id: String
        var installationSecret: String?
    }

    /// The answer to an activity's registration, token or state report: the activity as the
    /// server keeps it (the fields the client uses).
    struct ActivityAnswer: Codable, Equatable {
        var id: String
        var state: String
    }

    /// Every refusal: `{"error": {"code", "message", "field"?}}`.
    struct ErrorEnvelope: Codable, Equatable {
        struct Body: Codable, Equatable {
            var code: String
            var message: String
            var field: String?
        }
        var error: Body
    }

    /// What an answer says, read as the route's type: the server's id for what was written and an
    /// installation's secret (2xx), or the refusal.
    struct Answer: Equatable {
        var id: String?
        var installationSecret: String?
        var error: ErrorEnvelope.Body?

        init(id: String? = nil, installationSecret: String? = nil, error: ErrorEnvelope.Body? = nil) {
            self.id = id
            self.installationSecret = installationSecret
            self.error = error
        }

        /// Reads `body`, answered with `status` to a report of `kind`; nil when it is not what the
        /// route answers (a proxy's page, a cut-off body).
        static func read(_ body: Data, status: Int, installation: Bool) -> Answer? {
            let decoder = JSONDecoder()
            if (200..<300).contains(status) {
                if body.isEmpty { return Answer() }
                if installation, let a = try? decoder.decode(InstallationAnswer.self, from: body) { return Answer(id: a.id, installationSecret: a.installationSecret) }
                if let a = try? decoder.decode(ActivityAnswer.self, from: body) { return Answer(id: a.id) }
                return nil
            }
            return (try? decoder.decode(ErrorEnvelope.self, from: body)).map { Answer(error: $0.error) }
        }
    }

    static func encode<T: Encodable>(_ value: T) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(value)) ?? Data("{}".utf8)
    }
}
