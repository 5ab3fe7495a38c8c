import Foundation

extension IsleClient {
    /// Where an activity's registration with the server stands.
    public enum RegistrationStatus: Sendable, Hashable, CustomStringConvertible {
        /// The SDK never reported this activity (it is not tracked, or has no token yet).
        case unknown
        /// Waiting to be sent, or being retried (network, server away, rate limit).
        case pending
        /// The server has it under this id (hand it to your backend if it binds keys itself).
        case registered(serverID: String)
        /// The server refused it for good, with its reason; nothing more is sent for it.
        case refused(Refusal)

        public var description: String {
            switch self {
            case .unknown: "unknown"
            case .pending: "pending"
            case .registered(let id): "registered as \(id)"
            case .refused(let r): "refused: \(r)"
            }
        }
    }

    /// The server's answer when it refuses a report for good (a 4xx other than a rate limit).
    public struct Refusal: Error, Sendable, Hashable, Codable, CustomStringConvertible {
        /// The HTTP status; nil when the SDK refused before sending (nothing to send it to).
        public var status: Int?
        /// The server's error code (`ticketRequired`, `invalidTicket`, `externalKeyInUse`, …).
        public var code: String
        public var message: String
        public init(status: Int?, code: String, message: String) {
            self.status = status
            self.code = code
            self.message = message
        }
        public var description: String { "\(status.map { "\($0) " } ?? "")\(code): \(message)" }
    }

    /// What the SDK asks the app's ticket provider for: the backend's registration ticket that
    /// binds `externalKey` to this activity (docs/security.md).
    public struct TicketRequest: Sendable, Hashable {
        public var externalKey: String
        public var attributesType: String
        /// ActivityKit's id of the activity.
        public var activityID: String
        /// This installation, for a backend that binds its tickets to one.
        public var installationID: String
    }

    /// Deleting the installation did not go through: nothing was deleted on the device either.
    public struct DeletionError: Error, Sendable, CustomStringConvertible {
        public var reason: String
        public var description: String { "the installation was not deleted: \(reason)" }
    }

    /// What the running system offers, so an app (or its backend) only uses what will work.
    public struct Capabilities: Sendable, Hashable, Codable {
        /// Live Activities at all (iOS 16.1).
        public var liveActivities: Bool
        /// Push-to-start tokens (iOS 17.2).
        public var pushToStart: Bool
        /// `input-push-token` in a push-to-start (iOS 18): the started activity gets an update token.
        public var pushToStartUpdateToken: Bool
        /// Activities on a broadcast channel (iOS 18).
        public var broadcastChannels: Bool
        /// The widget push token (iOS 26).
        public var widgetPushToken: Bool
        public init(liveActivities: Bool, pushToStart: Bool, pushToStartUpdateToken: Bool, broadcastChannels: Bool, widgetPushToken: Bool) {
            self.liveActivities = liveActivities
            self.pushToStart = pushToStart
            self.pushToStartUpdateToken = pushToStartUpdateToken
            self.broadcastChannels = broadcastChannels
            self.widgetPushToken = widgetPushToken
        }
    }
}
