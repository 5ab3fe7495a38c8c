import Foundation
import IsleCore
import IsleDelivery
import IsleStore
import Testing

/// Topics as audiences in every store: one channel per topic and environment however many
/// requests race to make it, and the channels to close chosen by the documented rules
/// (docs/server.md, "Topics as audiences").
@Suite("Store contract: topics and their channels")
struct TopicStoreTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let app = "com.example.topics"
    let lifetime: TimeInterval = 8 * 3600

    func link(_ id: String, _ topic: String, _ env: PushEnvironment, at: Date? = nil) -> (TopicChannel, ChannelRecord) {
        (TopicChannel(channelID: id, bundleID: app, topic: topic, environment: env, createdAt: at ?? t0, lastUsedAt: at ?? t0),
         ChannelRecord(id: id, bundleID: app, storagePolicy: 0, createdAt: at ?? t0, environment: env))
    }

    @Test("a topic opened, changed, ended and opened again; racing requests make one channel per environment; counts per environment", arguments: StoreKind.allCases)
    func topicsAndChannels(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        #expect(try await s.topic(bundleID: app, topic: "match") == nil)
        try await s.putTopic(TopicRecord(bundleID: app, topic: "match", storagePolicy: 1, closeAfterIdle: 600, createdAt: t0), idempotency: nil)
        try await s.putTopic(TopicRecord(bundleID: app, topic: "match", storagePolicy: 1, closeAfterIdle: 900, createdAt: t0.addingTimeInterval(5)), idempotency: nil)
        var t = try #require(try await s.topic(bundleID: app, topic: "match"))
        #expect(t.closeAfterIdle == 900 && t.storagePolicy == 1 && t.createdAt == t0 && t.endedAt == nil)
        // Eight requests race to make the sandbox channel, each with its own: one stands.
        let standing = try await withThrowingTaskGroup(of: String.self) { group in
            for i in 0..<8 {
                group.addTask {
                    let (l, c) = self.link("ch-\(i)", "match", .sandbox)
                    return try await s.addTopicChannel(l, channel: c).channelID
                }
            }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(standing.count == 1)
        let (p, pc) = link("ch-prod", "match", .production)
        #expect(try await s.addTopicChannel(p, channel: pc).channelID == "ch-prod")
        let channels = try await s.topicChannels(bundleID: app, topic: "match")
        #expect(channels.map(\.environment) == [.production, .sandbox] && channels.contains { $0.channelID == standing.first })
        // Every channel row is there once: the losers' never were.
        #expect(try await s.channels(bundleID: app).count == 2)
        #expect(try await s.channelCount(bundleID: app, environment: .sandbox, defaultEnvironment: .sandbox) == 1)
        try await s.insertChannel(ChannelRecord(id: "own", bundleID: app, storagePolicy: 0, createdAt: t0), idempotency: nil)
        #expect(try await s.channelCount(bundleID: app, environment: .sandbox, defaultEnvironment: .sandbox) == 2)
        #expect(try await s.channelCount(bundleID: app, environment: .production, defaultEnvironment: .sandbox) == 1)
        // Pushed: both channels used then.
        try await s.topicPushed(bundleID: app, topic: "match", at: t0.addingTimeInterval(90), content: ["home": 1, "away": 0])
        try await s.topicPushed(bundleID: app, topic: "match", at: t0.addingTimeInterval(100), content: nil)
        #expect(try await s.topicChannels(bundleID: app, topic: "match").allSatisfy { $0.lastUsedAt == t0.addingTimeInterval(100) })
        #expect(try await s.topic(bundleID: app, topic: "match")?.lastPushAt == t0.addingTimeInterval(100))
        // The latest content stays until a newer one (a push without content keeps it). Compared as a
        // value: PostgreSQL's JSONB keeps an object's keys sorted, like the activity's own content.
        #expect(try await s.topic(bundleID: app, topic: "match")?.lastContent == .object(["home": 1, "away": 0]))
        // Ended, then opened again.
        try await s.endTopic(bundleID: app, topic: "match", at: t0.addingTimeInterval(200))
        t = try #require(try await s.topic(bundleID: app, topic: "match"))
        #expect(t.endedAt == t0.addingTimeInterval(200))
        try await s.putTopic(t, idempotency: nil)
        #expect(try await s.topic(bundleID: app, topic: "match")?.endedAt == nil)
        #expect(try await s.topics(bundleID: app).map(\.topic) == ["match"])
        try await s.removeTopicChannel(channelID: "ch-prod")
        #expect(try await s.topicChannels(bundleID: app, topic: "match").count == 1)
        #expect(try await s.channel(id: "ch-prod") == nil)
    }

    @Test("channels to close: an ended or forgotten topic's once nothing is queued for them; an idle one only with no live follower; the idlest free one for room", arguments: StoreKind.allCases)
    func closing(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for (name, idle) in [("ended", 600.0), ("idle", 600), ("followed", 600), ("busy", 600), ("forgotten", 600)] {
            try await s.putTopic(TopicRecord(bundleID: app, topic: name, storagePolicy: 0, closeAfterIdle: idle, createdAt: t0), idempotency: nil)
            let (l, c) = link("ch-\(name)", name, .sandbox)
            _ = try await s.addTopicChannel(l, channel: c)
        }
        let now = t0.addingTimeInterval(3600)
        // "followed": a live follower on its channel, started 1 hour ago.
        try await s.insertActivity(ActivityRecord(id: "f", bundleID: app, attributesType: "T", state: .active, channelID: "ch-followed", startedAt: now.addingTimeInterval(-3600), topics: ["followed"]))
        // "busy" used recently; "ended" ended with its end still queued.
        try await s.topicPushed(bundleID: app, topic: "busy", at: now.addingTimeInterval(-60), content: nil)
        try await s.endTopic(bundleID: app, topic: "ended", at: now)
        let end = NewPushJob(bundleID: app, kind: .broadcast, channelID: "ch-ended", payload: .end(["x": 1], at: now), runAt: now)
        _ = try await s.enqueue([end], idempotency: nil, now: now)
        try await s.deleteTopic(bundleID: app, topic: "forgotten", idempotency: nil)
        var due = Set(try await s.closableTopicChannels(now: now, lifetime: lifetime, limit: 100).map(\.channelID))
        #expect(due == ["ch-idle", "ch-forgotten"])
        // The end goes out: now the ended topic's channel is due too.
        let claimed = try await s.claim(limit: 10, now: now, lease: 60, worker: "w", excludingApps: [])
        #expect(claimed.count == 1)
        #expect(try await s.complete(JobCompletion(claim: claimed[0], result: .finished(.sent, reason: nil), delivery: nil, highPriorityAt: nil)))
        due = Set(try await s.closableTopicChannels(now: now, lifetime: lifetime, limit: 100).map(\.channelID))
        #expect(due == ["ch-idle", "ch-forgotten", "ch-ended"])
        // Past the follower's 8 hours, the followed one is idle too (its follower is no longer live).
        due = Set(try await s.closableTopicChannels(now: now.addingTimeInterval(8 * 3600), lifetime: lifetime, limit: 100).map(\.channelID))
        #expect(due.contains("ch-followed") && due.contains("ch-busy"))
        // Room under the limit: the least recently used channel nobody follows and nothing waits for.
        let idlest = try await s.idlestTopicChannel(bundleID: app, environment: .sandbox, now: now, lifetime: lifetime)
        #expect(["ch-idle", "ch-forgotten", "ch-ended"].contains(idlest?.channelID ?? ""), "\(String(describing: idlest))")
        #expect(try await s.idlestTopicChannel(bundleID: app, environment: .production, now: now, lifetime: lifetime) == nil)
    }

    @Test("installations following a topic for starts, with their broadcast-channel capability, kept across writes", arguments: StoreKind.allCases)
    func installationTopics(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await s.upsertInstallation(InstallationRecord(id: "a", bundleID: app, updatedAt: t0, broadcastChannels: true, topics: ["ars", "che"]))
        try await s.upsertInstallation(InstallationRecord(id: "b", bundleID: app, updatedAt: t0, broadcastChannels: false, topics: ["che"]))
        try await s.upsertInstallation(InstallationRecord(id: "c", bundleID: app, updatedAt: t0))
        try await s.upsertInstallation(InstallationRecord(id: "d", bundleID: "com.example.other", updatedAt: t0, topics: ["che"]))
        #expect(try await s.installations(bundleID: app, topic: "che").map(\.id) == ["a", "b"])
        #expect(try await s.installations(bundleID: app, topic: "ars").map(\.id) == ["a"])
        #expect(try await s.installations(bundleID: app, topic: "spurs").isEmpty)
        let a = try #require(try await s.installation(bundleID: app, id: "a"))
        #expect(a.broadcastChannels == true && a.topics == ["ars", "che"])
        #expect(try await s.installation(bundleID: app, id: "c")?.broadcastChannels == nil)
        // A later write replaces the list.
        _ = try await s.modifyInstallation(bundleID: app, id: "a", create: { a }, { $0.topics = [] })
        #expect(try await s.installations(bundleID: app, topic: "ars").isEmpty)
    }
}

