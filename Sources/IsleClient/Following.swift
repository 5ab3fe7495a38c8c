import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// How an activity that follows a topic gets its updates (docs/client.md, "Following a topic").
public enum FollowPushType: Sendable, Hashable {
    /// Its own push token: before iOS 18, or when the topic has no channel for it.
    case token
    /// The topic's broadcast channel (iOS 18 and later): start the activity with
    /// `pushType: .channel(id)`.
    case channel(String)
}

/// What the server says about a topic's channel for this installation.
public enum TopicPushType: Sendable, Hashable {
    /// The topic's broadcast channel in this installation's APNs environment.
    case channel(String)
    /// Follow by token, and why: the topic is not open as an audience, it ended, the app is at
    /// its channel limit, or the server could not be reached.
    case token(reason: String)
}

/// An activity started to follow a topic.
public struct Following<Handle: LiveActivityHandle>: Sendable {
    public let activity: Handle
    public let topic: String
    public let pushType: FollowPushType
    /// Why it follows by token on a system that has broadcast channels (nil on the channel, and
    /// before iOS 18, where a token is the only way).
    public let tokenReason: String?
}

extension IsleClient {
    /// The topic's broadcast channel for this installation's APNs environment, made by the
    /// server when this is the first follower to ask; or why to follow by token instead. Registers
    /// the installation first when the server does not know it yet. Never throws: a token always
    /// works.
    public func pushType(forTopic topic: String) async -> TopicPushType {
        if state.secret == nil {
            // The installation first (its secret proves the request). The app is starting an
            // activity now: at most a few seconds, then a token (the installation is sent later).
            noteInstallation()
            let deadline = Date().addingTimeInterval(min(configuration.requestTimeout, 3))
            while state.secret == nil, !stopped, Date() < deadline {
                _ = await flush()
                // Another task (run()) may be sending it: its answer lands while this waits.
                if state.secret == nil { try? await Task.sleep(for: .milliseconds(20)) }
            }
        }
        guard state.secret != nil else { return .token(reason: "the installation is not registered with the server yet (is it offline?)") }
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        let path = "/v1/topics/\(topic.addingPercentEncoding(withAllowedCharacters: allowed) ?? topic)/channel"
        guard let url = URL(string: configuration.serverURL.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + path) else {
            return .token(reason: "the server URL cannot take \(path)")
        }
        var request = URLRequest(url: url, timeoutInterval: configuration.requestTimeout)
        request.httpMethod = "POST"
        request.setValue("Bearer \(configuration.deviceKey)", forHTTPHeaderField: "Authorization")
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue(state.secret, forHTTPHeaderField: "Isle-Installation-Secret")
        request.setValue(UUID().uuidString.lowercased(), forHTTPHeaderField: "Idempotency-Key")
        request.httpBody = ClientWire.encode(ClientWire.TopicChannelRequest(installationID: state.installationID))
        let data: Data
        let response: HTTPURLResponse
        do {
            let (d, r) = try await transfer(request)
            guard let http = r as? HTTPURLResponse else { return .token(reason: "the server's answer was not HTTP") }
            (data, response) = (d, http)
        } catch {
            log("topic channel", "POST", path, nil, "token")
            return .token(reason: "the server could not be reached (\(error.localizedDescription))")
        }
        if response.statusCode == 200, let answer = try? JSONDecoder().decode(ClientWire.FollowChannel.self, from: data) {
            log("topic channel", "POST", path, 200, "channel")
            return .channel(answer.channelID)
        }
        log("topic channel", "POST", path, response.statusCode, "token")
        if let refusal = try? JSONDecoder().decode(ClientWire.ErrorEnvelope.self, from: data) {
            return .token(reason: "\(refusal.error.code): \(refusal.error.message)")
        }
        return .token(reason: "the server answered \(response.statusCode)")
    }

    /// Starts a Live Activity that follows `topic`, in one call: on iOS 18 and later (`channels`;
    /// nil: ``Configuration/capabilities``) it asks the
    /// server for the topic's broadcast channel and `start`s the activity on it; before iOS 18, or
    /// when the topic has no channel for it (not open, ended, the channel limit, offline), with a
    /// token. Either way the activity is then tracked under the topic, so the backend's
    /// `POST /v1/topics/{topic}/update` reaches it. Should the system refuse the channel (closed
    /// meanwhile), the activity is started with a token instead.
    ///
    /// `start` is where the app calls ActivityKit (`Activity.request(…, pushType:)`); on Apple
    /// platforms ``follow(topic:attributes:content:externalKey:ticket:otherTopics:)`` does it for you.
    @MainActor
    public func follow<H: LiveActivityHandle>(topic: String, externalKey: String? = nil, ticket: String? = nil, otherTopics: [String] = [],
                                             channels: Bool? = nil,
                                             start: @MainActor (FollowPushType) async throws -> H) async throws -> Following<H> {
        var pushType = FollowPushType.token
        var reason: String?
        if channels ?? configuration.capabilities.broadcastChannels {
            switch await self.pushType(forTopic: topic) {
            case .channel(let id): pushType = .channel(id)
            case .token(let why): reason = why
            }
        }
        let handle: H
        if case .channel = pushType {
            do {
                handle = try await start(pushType)
            } catch {
                reason = "the system did not start the activity on the topic's channel (\(error)); it follows by token"
                pushType = .token
                handle = try await start(.token)
            }
        } else {
            handle = try await start(.token)
        }
        let topics = [topic] + otherTopics.filter { $0 != topic }
        switch pushType {
        case .channel(let id): await track(activity: handle, channelID: id, topics: topics, externalKey: externalKey, ticket: ticket)
        case .token: await track(activity: handle, topics: topics, externalKey: externalKey, ticket: ticket)
        }
        return Following(activity: handle, topic: topic, pushType: pushType, tokenReason: reason)
    }
}
