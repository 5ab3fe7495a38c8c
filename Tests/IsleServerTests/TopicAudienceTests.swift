import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleTesting
import Testing

/// Topics as audiences (docs/server.md, "Topics as audiences"), through the server against the
/// simulated phones: followers on iOS 18 and later share the topic's channel, older ones are
/// reached by token, and one backend call reaches all of them.
@Suite("Topics as audiences")
struct TopicAudienceTests {
    static let topic = "match-42"

    /// A phone on `os` with the pizza app, in the foreground.
    static func phone(_ f: ServerFixture, _ name: String, os: String) throws -> String {
        let id = try f.sim.world.createDevice(name: name, osVersion: os, model: "iPhone 15")
        try f.sim.world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema]), on: id)
        return id
    }

    /// What IsleClient's follow does: on iOS 18 and later the topic's channel, else a token.
    static func follow(_ f: ServerFixture, device: String, installation: String, channelFirst: Bool) async throws -> (device: String, activity: String, isle: String, channel: String?) {
        let secret = try await f.installation(installation)
        var channel: String?
        if channelFirst {
            let asked = try await f.call("POST", "/v1/topics/\(topic)/channel", key: f.deviceKey, body: ["installationID": .string(installation)],
                                         headers: [("Isle-Installation-Secret", secret)])
            #expect(asked.status == 200, "\(asked.json.jsonString)")
            channel = asked.json["channelID"]?.stringValue
        }
        let a: SimulatedActivity
        var body: JSONObject = ["attributesType": "PizzaDeliveryAttributes", "topics": [.string(topic)], "attributes": Pizza.attributes, "contentState": Pizza.state("Kick-off")]
        if let channel {
            a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                contentState: Pizza.state("Kick-off"), pushType: .channel(channel))
            body["channelID"] = .string(channel)
        } else {
            a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                contentState: Pizza.state("Kick-off"))
            body["token"] = .string(try await f.sim.world.waitForPushToken(activityID: a.id, on: device))
        }
        let r = try await f.register(.object(body), installation: installation)
        #expect(r.status == 201, "\(r.json.jsonString)")
        return (device, a.id, r.json["id"]?.stringValue ?? "", channel)
    }

    static func shows(_ f: ServerFixture, _ followers: [(device: String, activity: String, isle: String, channel: String?)], _ driver: String) async throws {
        try await eventually(within: .seconds(20), "every follower shows \(driver)") {
            try followers.allSatisfy { p in try f.sim.world.device(p.device).activities.first { $0.id == p.activity }?.contentState["driverName"]?.stringValue == driver }
        }
    }

    @Test("iOS 17 and iOS 18 followers: one call, one broadcast and a push per token, both legs counted; every phone shows each update; the end closes the channel")
    func mixedVersions() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(100) }) { f in
            // Not open yet: a follower is told so (and follows by token).
            _ = try await f.installation("early")
            let early = try await f.call("POST", "/v1/topics/\(Self.topic)/channel", key: f.deviceKey, body: ["installationID": "early"], headers: f.secretHeader("early"))
            #expect(early.status == 404 && early.json["error"]?["code"] == "topicNotOpen", "\(early.json.jsonString)")
            let opened = try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["storagePolicy": 1, "closeAfterIdle": 3600])
            #expect(opened.status == 200 && opened.json["channels"]?.arrayValue?.isEmpty == true, "\(opened.json.jsonString)")
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["closeAfterIdle": 5]).json["error"]?["field"] == "closeAfterIdle")

            // Two phones on iOS 18 ask at once: one channel is made, both get it.
            let new = [try Self.phone(f, "new-1", os: "18.0"), try Self.phone(f, "new-2", os: "26.0")]
            let old = [try Self.phone(f, "old-1", os: "17.2"), try Self.phone(f, "old-2", os: "16.4")]
            async let n1 = Self.follow(f, device: new[0], installation: "inst-new-1", channelFirst: true)
            async let n2 = Self.follow(f, device: new[1], installation: "inst-new-2", channelFirst: true)
            let onChannel = try await [n1, n2]
            #expect(onChannel[0].channel != nil && onChannel[0].channel == onChannel[1].channel)
            let channel = try #require(onChannel[0].channel)
            guard case .found = f.sim.world.readChannel(bundleID: Pizza.bundleID, id: channel) else { Issue.record("APNs has no such channel"); return }
            var everyone = onChannel
            for (i, d) in old.enumerated() { everyone.append(try await Self.follow(f, device: d, installation: "inst-old-\(i)", channelFirst: false)) }
            let followers = everyone
            // An older phone cannot start on a channel: the simulator refuses as ActivityKit does.
            #expect(throws: SimulatorError.self) {
                _ = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: old[0], attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                    contentState: Pizza.state("x"), pushType: .channel(channel))
            }

            for (n, score) in ["1–0", "1–1", "2–1"].enumerated() {
                let r = try await f.call("POST", "/v1/topics/\(Self.topic)/update", key: f.backendKey, body: ["contentState": Pizza.state(score), "alert": ["title": "Goal", "body": .string(score)]])
                #expect(r.status == 202, "\(r.json.jsonString)")
                #expect(r.json["accepted"] == 3 && r.json["audience"] == ["broadcasts": 1, "channelFollowers": 2, "tokenFollowers": 2], "update \(n): \(r.json.jsonString)")
                try await Self.shows(f, followers, score)
            }
            // The server's records follow both legs.
            for p in followers {
                try await eventually("\(p.isle)'s record follows") { try await f.call("GET", "/v1/activities/\(p.isle)", key: f.backendKey).json["contentState"]?["driverName"] == "2–1" }
            }
            // An activity on the channel has no token: by id it is refused, saying what reaches it.
            let byID = try await f.call("POST", "/v1/activities/\(followers[0].isle)/update", key: f.backendKey, body: ["contentState": Pizza.state("x")])
            #expect(byID.status == 409 && byID.json["error"]?["code"] == "activityOnChannel", "\(byID.json.jsonString)")
            // Events for both legs: the broadcast (its channel) and each token push (its activity).
            try await eventually("delivery events of both legs") {
                let events = try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue ?? []
                let delivered = events.filter { $0["type"] == "push.delivered" }
                return delivered.filter { $0["data"]?["channelID"]?.stringValue == channel }.count == 3
                    && Set(delivered.compactMap { $0["activityID"]?.stringValue ?? $0["data"]?["activityID"]?.stringValue }).isSuperset(of: followers[2...].map(\.isle))
            }
            let view = try await f.call("GET", "/v1/topics/\(Self.topic)", key: f.backendKey)
            #expect(view.json["channelFollowers"] == 2 && view.json["tokenFollowers"] == 2 && view.json["channels"]?.arrayValue?.first?["channelID"]?.stringValue == channel, "\(view.json.jsonString)")

            // The end: every phone's activity ends; the topic ends; its channel closes once the end went out.
            let end = try await f.call("POST", "/v1/topics/\(Self.topic)/end", key: f.backendKey, body: ["contentState": Pizza.state("Full time")])
            #expect(end.status == 202 && end.json["audience"]?["broadcasts"] == 1, "\(end.json.jsonString)")
            try await eventually(within: .seconds(20), "every follower ended") {
                try followers.allSatisfy { p in try f.sim.world.device(p.device).activities.first { $0.id == p.activity }?.state == .ended }
            }
            try await eventually(within: .seconds(20), "the channel closed at APNs and in Isle") {
                guard case .failure = f.sim.world.readChannel(bundleID: Pizza.bundleID, id: channel) else { return false }
                return try await f.call("GET", "/v1/topics/\(Self.topic)", key: f.backendKey).json["channels"]?.arrayValue?.isEmpty == true
            }
            let ended = try await f.call("POST", "/v1/topics/\(Self.topic)/channel", key: f.deviceKey, body: ["installationID": "inst-new-1"], headers: f.secretHeader("inst-new-1"))
            #expect(ended.status == 409 && ended.json["error"]?["code"] == "topicEnded", "\(ended.json.jsonString)")
            // Opened again, a new channel is made for the next follower.
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey).status == 200)
            let again = try await f.call("POST", "/v1/topics/\(Self.topic)/channel", key: f.deviceKey, body: ["installationID": "inst-new-1"], headers: f.secretHeader("inst-new-1"))
            #expect(again.status == 200 && again.json["channelID"]?.stringValue != channel, "\(again.json.jsonString)")
            // Closed by the backend: its channel goes at once.
            #expect(try await f.call("DELETE", "/v1/topics/\(Self.topic)", key: f.backendKey).status == 204)
            #expect(try await f.call("GET", "/v1/topics/\(Self.topic)", key: f.backendKey).status == 404)
            #expect(try await f.call("GET", "/v1/channels", key: f.backendKey).json.arrayValue?.isEmpty == true)
        }
    }

    @Test("the channel limit: the idlest topic channel nobody follows is closed to make room; with none, 409 channelLimit; an idle channel with a live follower stays until it has none")
    func channelLimit() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(100); $0.channelLimit = 2 }) { f in
            let phone = try Self.phone(f, "new", os: "18.2")
            for t in ["a", "b", "c"] { #expect(try await f.call("PUT", "/v1/topics/\(t)", key: f.backendKey, body: ["closeAfterIdle": 60]).status == 200) }
            let secret = try await f.installation("inst")
            func ask(_ topic: String) async throws -> ServerFixture.Answer {
                try await f.call("POST", "/v1/topics/\(topic)/channel", key: f.deviceKey, body: ["installationID": "inst"], headers: [("Isle-Installation-Secret", secret)])
            }
            let a = try await ask("a")
            f.clock.advance(by: 1)
            let b = try await ask("b")
            #expect(a.status == 200 && b.status == 200)
            let bChannel = try #require(b.json["channelID"]?.stringValue)
            // A follower on b's channel.
            let act = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: phone, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                      contentState: Pizza.state("x"), pushType: .channel(bChannel))
            let reg = try await f.register(["attributesType": "PizzaDeliveryAttributes", "channelID": .string(bChannel), "topics": ["b"]], installation: "inst")
            #expect(reg.status == 201)
            // At the limit, the app's own channel makes room by closing a's (idlest, unfollowed).
            let own = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 0])
            #expect(own.status == 201, "\(own.json.jsonString)")
            #expect(try await f.call("GET", "/v1/topics/a", key: f.backendKey).json["channels"]?.arrayValue?.isEmpty == true)
            // Now b has a live follower and the other is the app's own: c is refused, and told to use tokens.
            let c = try await ask("c")
            #expect(c.status == 409 && c.json["error"]?["code"] == "channelLimit", "\(c.json.jsonString)")
            // Idle past its time, b stays while its follower lives…
            let swept = f.server.app.topicSweeps
            f.clock.advance(by: 120)
            try await eventually("two topic sweeps after the clock moved") { f.server.app.topicSweeps >= swept + 2 }
            #expect(try await f.call("GET", "/v1/topics/b", key: f.backendKey).json["channels"]?.arrayValue?.count == 1)
            // …and closes once it has none.
            _ = act
            #expect(try await f.call("POST", "/v1/activities/\(reg.json["id"]?.stringValue ?? "")/ended", key: f.deviceKey, headers: f.secretHeader("inst")).status == 200)
            try await eventually(within: .seconds(20), "b's idle channel closed") {
                try await f.call("GET", "/v1/topics/b", key: f.backendKey).json["channels"]?.arrayValue?.isEmpty == true
            }
            guard case .failure = f.sim.world.readChannel(bundleID: Pizza.bundleID, id: bChannel) else { Issue.record("b's channel is still at APNs"); return }
            #expect(try await ask("c").status == 200)
        }
    }

    @Test("starting an audience: a scheduled push-to-start to a topic's installations starts the iOS 18 phone on the topic's channel (input-push-channel) and the iOS 17 one with a token; the next topic update reaches both")
    func startAudience() async throws {
        try await ServerFixture.with { f in
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["storagePolicy": 1]).status == 200)
            var made: [(device: String, installation: String, secret: String)] = []
            for (n, os) in ["17.4", "18.1"].enumerated() {
                let device = try Self.phone(f, "fan-\(n)", os: os)
                let pts = try #require(try f.sim.world.app(Pizza.bundleID, on: device).pushToStartTokens["PizzaDeliveryAttributes"])
                let installation = "fan-\(n)"
                let r = try await f.call("PUT", "/v1/installations/\(installation)", key: f.deviceKey,
                                         body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(pts)], "broadcastChannels": .bool(os.hasPrefix("18")), "topics": [.string(Self.topic)]])
                #expect(r.status == 200 && r.json["topics"] == [.string(Self.topic)] && r.json["broadcastChannels"] == .bool(os.hasPrefix("18")), "\(r.json.jsonString)")
                made.append((device, installation, r.json["installationSecret"]?.stringValue ?? ""))
            }
            let phones = made
            // An installation following nothing is not started.
            _ = try await f.installation("bystander")
            let kickOff = Int64(f.clock.now.timeIntervalSince1970) + 3600
            let start = try await f.call("POST", "/v1/topics/\(Self.topic)/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Kick-off"),
                "alert": ["title": "Derby", "body": "Kick-off"], "externalKey": "derby", "sendAt": .int(kickOff)])
            #expect(start.status == 202 && start.json["accepted"] == 2, "\(start.json.jsonString)")
            let started = start.json["activities"]?.arrayValue ?? []
            let onChannel = started.first { $0["installationID"] == "fan-1" }?["channelID"]?.stringValue
            #expect(onChannel != nil && started.first { $0["installationID"] == "fan-0" }?["channelID"] == .null, "\(started)")
            let view = try await f.call("GET", "/v1/topics/\(Self.topic)", key: f.backendKey)
            #expect(view.json["channels"]?.arrayValue?.first?["channelID"]?.stringValue == onChannel, "the start made the topic's channel: \(view.json.jsonString)")
            f.clock.advance(by: 3600)
            try await eventually(within: .seconds(20), "both phones started the match") {
                try phones.allSatisfy { p in try f.sim.world.device(p.device).activities.contains { $0.startedBy == .push && $0.contentState["driverName"] == "Kick-off" } }
            }
            let new = try #require(try f.sim.world.device(phones[1].device).activities.first { $0.startedBy == .push })
            #expect(new.channelID == onChannel && new.updateToken == nil, "the iOS 18 phone's activity is on the channel")
            // The iOS 17 phone's app hands back the started activity's token (IsleClient does), linked by key.
            let old = try #require(try f.sim.world.device(phones[0].device).activities.first { $0.startedBy == .push })
            let token = try await f.sim.world.waitForPushToken(activityID: old.id, on: phones[0].device)
            let linked = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: ["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "externalKey": "derby",
                                                                                         "installationID": "fan-0"], headers: [("Isle-Installation-Secret", phones[0].secret)])
            #expect(linked.status == 200, "linked to the started record: \(linked.json.jsonString)")
            let score = try await f.call("POST", "/v1/topics/\(Self.topic)/update", key: f.backendKey, body: ["contentState": Pizza.state("1–0")])
            #expect(score.json["audience"] == ["broadcasts": 1, "channelFollowers": 1, "tokenFollowers": 1], "\(score.json.jsonString)")
            try await eventually(within: .seconds(20), "both phones show the score") {
                try f.sim.world.device(phones[1].device).activities.first { $0.id == new.id }?.contentState["driverName"] == "1–0"
                    && f.sim.world.device(phones[0].device).activities.first { $0.id == old.id }?.contentState["driverName"] == "1–0"
            }
            // A start to a user with the topic: the same choice per installation.
            #expect(try await f.call("PUT", "/v1/installations/fan-1/user", key: f.backendKey, body: ["userID": "ben"]).status == 200)
            let userStart = try await f.call("POST", "/v1/users/ben/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Second half"),
                "alert": ["title": "Derby", "body": "Second half"], "topics": [.string(Self.topic)]])
            #expect(userStart.json["activities"]?.arrayValue?.first?["channelID"]?.stringValue == onChannel, "\(userStart.json.jsonString)")
        }
    }

    @Test("offline followers catch up on both legs, against the simulator's default leeway: a Most-Recent-Message topic's broadcast carries an expiration, a No-Message-Stored one 0", arguments: [1, 0])
    func offlineFollowers(storagePolicy: Int) async throws {
        // The simulator's defaults (its leeway on): what a new user runs (docs/simulator.md).
        try await ServerFixture.with(configure: { $0.device = SimulatorConfiguration() }, server: { $0.sweepInterval = .milliseconds(100) }) { f in
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["storagePolicy": .int(Int64(storagePolicy))]).status == 200)
            var made: [(device: String, activity: String, isle: String, channel: String?)] = []
            for (n, os) in ["18.2", "26.0", "17.4", "16.4"].enumerated() {
                let device = try Self.phone(f, "fan-\(n)", os: os)
                made.append(try await Self.follow(f, device: device, installation: "fan-\(n)", channelFirst: !os.hasPrefix("1") || os.hasPrefix("18.")))
            }
            let followers = made
            let channel = try #require(followers[0].channel)
            // One of each leg goes offline; the others stay.
            let offline = [followers[1], followers[3]]
            for p in offline { try await f.sim.world.setOnline(p.device, false) }
            let r = try await f.call("POST", "/v1/topics/\(Self.topic)/update", key: f.backendKey, body: ["contentState": Pizza.state("1–0"), "alert": ["title": "Goal", "body": "1–0"]])
            #expect(r.status == 202 && r.json["audience"] == ["broadcasts": 1, "channelFollowers": 2, "tokenFollowers": 2], "\(r.json.jsonString)")
            try await eventually(within: .seconds(30), "the online followers show the goal") {
                f.clock.advance(by: 1)   // what APNs holds back (reordering) comes due
                return try [followers[0], followers[2]].allSatisfy { p in try f.sim.world.device(p.device).activities.first { $0.id == p.activity }?.contentState["driverName"] == "1–0" }
            }
            let broadcast = try #require(f.sim.apns.requestLog.last { $0.path.hasPrefix("/4/broadcasts") && $0.headers.contains(["apns-channel-id", channel]) && $0.status == 200 })
            let expiration = broadcast.headers.first { $0.first == "apns-expiration" }?.last
            if storagePolicy == 0 {
                #expect(expiration == "0", "APNs takes only 0 on a No-Message-Stored channel")
            } else {
                let e = try #require(expiration.flatMap { Int64($0) })
                #expect(e > Int64(f.clock.now.timeIntervalSince1970) && e <= Int64(f.clock.now.timeIntervalSince1970) + 8 * 3600, "stored at most 8 hours: \(e)")
            }
            // A quarter of an hour later they come back.
            f.clock.advance(by: 900)
            for p in offline { try await f.sim.world.setOnline(p.device, true) }
            let reached = storagePolicy == 1 ? offline : [followers[3]]
            try await eventually(within: .seconds(30), "the followers that were offline show the goal") {
                f.clock.advance(by: 1)
                return try reached.allSatisfy { p in try f.sim.world.device(p.device).activities.first { $0.id == p.activity }?.contentState["driverName"] == "1–0" }
            }
            if storagePolicy == 0 {
                // Apple's rule for a No-Message-Stored channel: an offline phone misses the message.
                #expect(try f.sim.world.device(followers[1].device).activities.first { $0.id == followers[1].activity }?.contentState["driverName"] == "Kick-off")
            }
        }
    }

    @Test("a late follower catches up: an app that starts following by token after the topic's update (started while offline, or just later) is brought up to the topic's latest content; one that registers it already is sent nothing")
    func lateFollower() async throws {
        // The simulator's defaults (its leeway on): what a new user runs (docs/simulator.md).
        try await ServerFixture.with(configure: { $0.device = SimulatorConfiguration() }) { f in
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["storagePolicy": 1]).status == 200)
            let early = try await Self.follow(f, device: try Self.phone(f, "early", os: "17.4"), installation: "early", channelFirst: false)
            #expect(try await f.call("POST", "/v1/topics/\(Self.topic)/update", key: f.backendKey, body: ["contentState": Pizza.state("1–0"), "alert": ["title": "Goal", "body": "1–0"]]).status == 202)
            try await eventually(within: .seconds(30), "the follower shows the goal") {
                f.clock.advance(by: 1)
                return try f.sim.world.device(early.device).activities.first { $0.id == early.activity }?.contentState["driverName"] == "1–0"
            }
            // An iOS 16.4 phone's app starts following only now, from its kick-off state.
            let late = try await Self.follow(f, device: try Self.phone(f, "late", os: "16.4"), installation: "late", channelFirst: false)
            try await eventually(within: .seconds(30), "the late follower shows the latest content") {
                f.clock.advance(by: 1)   // priority 5: the phone applies it when it sees fit
                return try f.sim.world.device(late.device).activities.first { $0.id == late.activity }?.contentState["driverName"] == "1–0"
            }
            let caughtUp = try await f.call("GET", "/v1/activities/\(late.isle)?deliveries=10", key: f.backendKey).json
            #expect(caughtUp["deliveries"]?.arrayValue?.count == 1 && caughtUp["contentState"]?["driverName"] == "1–0", "\(caughtUp.jsonString)")
            // One that already shows it (its app read the backend) is sent nothing.
            let device = try Self.phone(f, "current", os: "17.4")
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state("1–0"))
            let r = try await f.register(["attributesType": "PizzaDeliveryAttributes", "topics": [.string(Self.topic)], "attributes": Pizza.attributes, "contentState": Pizza.state("1–0"),
                                          "token": .string(try await f.sim.world.waitForPushToken(activityID: a.id, on: device))], installation: "current")
            #expect(r.status == 201)
            let id = try #require(r.json["id"]?.stringValue)
            #expect(try await f.call("GET", "/v1/jobs?activity=\(id)", key: f.backendKey).json["jobs"]?.arrayValue?.isEmpty == true)
            #expect(try await f.call("GET", "/v1/activities/\(id)?deliveries=10", key: f.backendKey).json["deliveries"]?.arrayValue?.isEmpty == true)
        }
    }

    @Test("a follower by token whose token changed while its app was not running: one goal fails on the old token (410), the next skips it (unreachable); when the app hands the new token over it gets the latest goal, not the last one it took")
    func rotatedFollower() async throws {
        try await ServerFixture.with(configure: { $0.device = SimulatorConfiguration() }) { f in
            #expect(try await f.call("PUT", "/v1/topics/\(Self.topic)", key: f.backendKey, body: ["storagePolicy": 1]).status == 200)
            let follower = try await Self.follow(f, device: try Self.phone(f, "fan", os: "17.4"), installation: "fan", channelFirst: false)
            @Sendable func goal(_ score: String) async throws {
                #expect(try await f.call("POST", "/v1/topics/\(Self.topic)/update", key: f.backendKey, body: ["contentState": Pizza.state(score), "alert": ["title": "Goal", "body": .string(score)]]).status == 202)
            }
            @Sendable func shows() throws -> String? {
                try f.sim.world.device(follower.device).activities.first { $0.id == follower.activity }?.contentState["driverName"]?.stringValue
            }
            try await goal("1–0")
            try await eventually(within: .seconds(30), "the follower shows the first goal") { try shows() == "1–0" }
            let token = try f.sim.world.rotateUpdateToken(activityID: follower.activity, on: follower.device)
            try await goal("2–0")
            try await eventually(within: .seconds(30), "the goal failed on the old token") {
                f.clock.advance(by: 31)   // past the wait for a rotated token
                return try await f.call("GET", "/v1/activities/\(follower.isle)", key: f.backendKey).json["state"] == "unreachable"
            }
            try await goal("3–0")
            #expect(try shows() == "1–0")
            // The app runs again and hands over its new token.
            let r = try await f.call("PUT", "/v1/activities/\(follower.isle)/token", key: f.deviceKey, body: ["token": .string(token)], headers: f.secretHeader("fan"))
            #expect(r.status == 200, "\(r.json.jsonString)")
            try await eventually(within: .seconds(30), "the follower shows the latest goal") {
                f.clock.advance(by: 1)
                return try shows() == "3–0"
            }
        }
    }
}

