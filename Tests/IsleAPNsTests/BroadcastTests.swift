import Foundation
import IsleAPNs
import IsleCore
import IsleHTTP2Server
import IsleTesting
import Testing

@Suite("Broadcast and channel management (docs/protocol.md §7)")
struct BroadcastTests {
    let channel = "dHN0LXNyY2gtY2hubA=="

    @Test("broadcast: path, required headers, exact body")
    func broadcast() async throws {
        try await withSinkAndClient { sink, client in
            let requestID = APNsID.random()
            let payload = Samples.update(alert: true)
            let r0 = try await client.broadcast(BroadcastPush(bundleID: Samples.bundleID, channelID: channel, payload: payload, priority: .high, storagePolicy: .noMessageStored, requestID: requestID))
            #expect(r0.requestID == requestID)
            let r = try #require(sink.requests.first)
            #expect(r.method == "POST")
            #expect(r.path == "/4/broadcasts/apps/com.example.pizza")
            #expect(r.value("apns-channel-id") == channel)
            #expect(r.value("apns-push-type") == "liveactivity")
            #expect(r.value("apns-priority") == "10")
            #expect(r.value("apns-expiration") == "0")
            #expect(r.value("apns-request-id") == requestID.text)
            #expect(r.value("apns-topic") == nil)
            #expect(r.body == payload.encoded)
        }
    }

    @Test("storage policy 0 requires expiration 0; policy 1 may store", arguments: [
        (MessageStoragePolicy.noMessageStored, true, false),
        (.noMessageStored, false, true),
        (.mostRecentMessageStored, false, true),
        (.mostRecentMessageStored, true, true),
    ])
    func expirationRule(_ policy: MessageStoragePolicy, _ storing: Bool, _ allowed: Bool) async throws {
        try await withSinkAndClient { sink, client in
            let expiration: APNsExpiration = storing ? .at(Samples.now.addingTimeInterval(3600)) : .immediately
            let push = BroadcastPush(bundleID: Samples.bundleID, channelID: channel, payload: Samples.update(), expiration: expiration, storagePolicy: policy)
            do throws(APNsError) {
                try await client.broadcast(push)
                #expect(allowed)
                #expect(sink.requests.first?.value("apns-expiration") == (storing ? "1767229200" : "0"))
            } catch {
                #expect(!allowed)
                #expect(error.description.contains("BadExpirationDate"))
                #expect(sink.requestCount == 0)
            }
        }
    }

    @Test("a broadcast cannot start an activity; bad channel ids are refused")
    func refusals() async throws {
        try await withSinkAndClient { sink, client in
            let start = LiveActivityPayload(event: .start, timestamp: Samples.now, contentState: [:], alert: .init(title: "a", body: "b"), attributesType: "P", attributes: [:])
            await #expect(throws: APNsError.self) { try await client.broadcast(BroadcastPush(bundleID: Samples.bundleID, channelID: channel, payload: start)) }
            await #expect(throws: APNsError.self) { try await client.broadcast(BroadcastPush(bundleID: Samples.bundleID, channelID: "not base64!", payload: Samples.update())) }
            await #expect(throws: APNsError.self) { try await client.broadcast(BroadcastPush(bundleID: Samples.bundleID, channelID: "", payload: Samples.update())) }
            #expect(sink.requestCount == 0)
        }
    }

    @Test("broadcast errors keep their reason", arguments: [(400, "ChannelNotRegistered"), (400, "FeatureNotEnabled"), (403, "TopicMismatch"), (503, "Service Unavailable")])
    func errors(_ status: Int, _ reason: String) async throws {
        try await withSinkAndClient { sink, client in
            sink.enqueueError(status: status, reason: reason)
            do throws(APNsError) {
                try await client.broadcast(BroadcastPush(bundleID: Samples.bundleID, channelID: channel, payload: Samples.update()))
                Issue.record("no error")
            } catch {
                #expect(error.response?.reason?.rawValue == reason)
                #expect(error.response?.reason?.isKnown == true)
            }
        }
    }

    @Test("create, read, list, delete channels")
    func channels() async throws {
        try await withSinkAndClient { sink, client in
            sink.enqueue(HTTP2ServerResponse(status: 201, headers: [("apns-channel-id", channel)]))
            let created = try await client.createChannel(bundleID: Samples.bundleID, storagePolicy: .mostRecentMessageStored)
            #expect(created == BroadcastChannel(id: channel, storagePolicy: .mostRecentMessageStored))
            let c = sink.requests[0]
            #expect(c.method == "POST" && c.path == "/1/apps/com.example.pizza/channels")
            #expect(c.bodyText == #"{"message-storage-policy":1,"push-type":"LiveActivity"}"#)
            #expect(c.value("apns-request-id") != nil)

            sink.enqueue(HTTP2ServerResponse(status: 200, body: Array(#"{"message-storage-policy":0,"push-type":"LiveActivity"}"#.utf8)))
            let read = try await client.readChannel(bundleID: Samples.bundleID, channelID: channel)
            #expect(read.storagePolicy == .noMessageStored)
            #expect(sink.requests[1].method == "GET" && sink.requests[1].value("apns-channel-id") == channel)

            sink.enqueue(HTTP2ServerResponse(status: 200, body: Array(#"{"channels":["a2V5MQ==","a2V5Mg=="]}"#.utf8)))
            #expect(try await client.listChannels(bundleID: Samples.bundleID) == ["a2V5MQ==", "a2V5Mg=="])
            #expect(sink.requests[2].path == "/1/apps/com.example.pizza/all-channels")

            sink.enqueue(HTTP2ServerResponse(status: 200))
            #expect(try await client.listChannels(bundleID: Samples.bundleID) == [])

            sink.enqueue(HTTP2ServerResponse(status: 204))
            try await client.deleteChannel(bundleID: Samples.bundleID, channelID: channel)
            #expect(sink.requests[4].method == "DELETE" && sink.requests[4].value("apns-channel-id") == channel)

            sink.enqueueError(status: 400, reason: "CannotCreateChannelConfig")
            await #expect(throws: APNsError.self) { try await client.createChannel(bundleID: Samples.bundleID, storagePolicy: .noMessageStored) }
            // A management path must use the bare bundle id (TopicDisallowed otherwise).
            await #expect(throws: APNsError.self) { try await client.listChannels(bundleID: "com.example.pizza.push-type.liveactivity") }
        }
    }
}
