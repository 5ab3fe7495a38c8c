public import Foundation
import GRDB
public import IsleCore
public import IsleDelivery

// Topics as audiences (docs/server.md, "Topics as audiences"), on SQLite.
extension SQLiteStore: TopicRepository {
    /// Nothing waits to be broadcast on the channel `c` (its lane's open jobs, or a scheduled one).
    static let nothingQueued = """
        NOT EXISTS (SELECT 1 FROM jobs j WHERE j.lane = 'c:' || c.channel_id AND j.state IN ('queued', 'claimed'))
        AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'scheduled' AND j.channel_id = c.channel_id)
        """

    public func putTopic(_ t: TopicRecord, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: """
                INSERT INTO topics (bundle_id, topic, storage_policy, close_after_idle, created_at, ended_at, last_push_at) VALUES (?, ?, ?, ?, ?, NULL, NULL)
                ON CONFLICT (bundle_id, topic) DO UPDATE SET storage_policy = excluded.storage_policy, close_after_idle = excluded.close_after_idle, ended_at = NULL
                """, arguments: [t.bundleID, t.topic, t.storagePolicy, Int(t.closeAfterIdle), t.createdAt.timeIntervalSince1970])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    static func topic(_ r: Row) throws -> TopicRecord {
        TopicRecord(bundleID: r["bundle_id"], topic: r["topic"], storagePolicy: r["storage_policy"], closeAfterIdle: TimeInterval(r["close_after_idle"] as Int64),
                    createdAt: Date(timeIntervalSince1970: r["created_at"]), endedAt: (r["ended_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
                    lastPushAt: (r["last_push_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
                    lastContent: try (r["last_content"] as String?).map { try BadRow.json($0, table: "topics", id: r["topic"], column: "last_content") })
    }

    static func topicChannel(_ r: Row) throws -> TopicChannel {
        TopicChannel(channelID: r["channel_id"], bundleID: r["bundle_id"], topic: r["topic"],
                     environment: try BadRow.decode(r["environment"] as String, as: PushEnvironment.self, table: "topic_channels", id: r["channel_id"], column: "environment"),
                     createdAt: Date(timeIntervalSince1970: r["created_at"]), lastUsedAt: Date(timeIntervalSince1970: r["last_used_at"]))
    }

    public func topic(bundleID: String, topic: String) async throws -> TopicRecord? {
        try readNow { db in try Row.fetchOne(db, sql: "SELECT * FROM topics WHERE bundle_id = ? AND topic = ?", arguments: [bundleID, topic]).map(Self.topic) }
    }

    public func topics(bundleID: String) async throws -> [TopicRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM topics WHERE bundle_id = ? ORDER BY topic", arguments: [bundleID]).map(Self.topic) }
    }

    public func topicChannels(bundleID: String, topic: String) async throws -> [TopicChannel] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM topic_channels WHERE bundle_id = ? AND topic = ? ORDER BY environment", arguments: [bundleID, topic]).map(Self.topicChannel)
        }
    }

    public func addTopicChannel(_ link: TopicChannel, channel: ChannelRecord) async throws -> TopicChannel {
        try await writer.write { db in
            if let standing = try Row.fetchOne(db, sql: "SELECT * FROM topic_channels WHERE bundle_id = ? AND topic = ? AND environment = ?",
                                               arguments: [link.bundleID, link.topic, link.environment.rawValue]) {
                return try Self.topicChannel(standing)
            }
            try db.execute(sql: "INSERT INTO channels (id, bundle_id, storage_policy, created_at, environment) VALUES (?, ?, ?, ?, ?)",
                           arguments: [channel.id, channel.bundleID, channel.storagePolicy, channel.createdAt.timeIntervalSince1970, channel.environment?.rawValue])
            try db.execute(sql: "INSERT INTO topic_channels (channel_id, bundle_id, topic, environment, created_at, last_used_at) VALUES (?, ?, ?, ?, ?, ?)",
                           arguments: [link.channelID, link.bundleID, link.topic, link.environment.rawValue, link.createdAt.timeIntervalSince1970, link.lastUsedAt.timeIntervalSince1970])
            return link
        }
    }

    public func topicPushed(bundleID: String, topic: String, at: Date, content: JSONValue?) async throws {
        try await writer.write { db in
            try db.execute(sql: "UPDATE topics SET last_push_at = ?, last_content = COALESCE(?, last_content) WHERE bundle_id = ? AND topic = ?",
                           arguments: [at.timeIntervalSince1970, content?.jsonString, bundleID, topic])
            try db.execute(sql: "UPDATE topic_channels SET last_used_at = MAX(last_used_at, ?) WHERE bundle_id = ? AND topic = ?", arguments: [at.timeIntervalSince1970, bundleID, topic])
        }
    }

    public func endTopic(bundleID: String, topic: String, at: Date) async throws {
        try await writer.write { db in
            try db.execute(sql: "UPDATE topics SET ended_at = ?, last_push_at = ? WHERE bundle_id = ? AND topic = ?", arguments: [at.timeIntervalSince1970, at.timeIntervalSince1970, bundleID, topic])
        }
    }

    public func deleteTopic(bundleID: String, topic: String, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: "DELETE FROM topics WHERE bundle_id = ? AND topic = ?", arguments: [bundleID, topic])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    public func removeTopicChannel(channelID: String) async throws {
        try await writer.write { db in
            try db.execute(sql: "DELETE FROM topic_channels WHERE channel_id = ?", arguments: [channelID])
            try db.execute(sql: "DELETE FROM channels WHERE id = ?", arguments: [channelID])
        }
    }

    public func channelCount(bundleID: String, environment: PushEnvironment, defaultEnvironment: PushEnvironment) async throws -> Int {
        try readNow { db in
            try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM channels WHERE bundle_id = ? AND COALESCE(environment, ?) = ?",
                             arguments: [bundleID, defaultEnvironment.rawValue, environment.rawValue]) ?? 0
        }
    }

    public func closableTopicChannels(now: Date, lifetime: TimeInterval, limit: Int) async throws -> [TopicChannel] {
        try readNow { db in
            try Row.fetchAll(db, sql: """
                SELECT c.* FROM topic_channels c LEFT JOIN topics t ON t.bundle_id = c.bundle_id AND t.topic = c.topic
                WHERE ((t.topic IS NULL OR t.ended_at IS NOT NULL)
                        AND \(Self.nothingQueued))
                   OR (t.topic IS NOT NULL AND t.ended_at IS NULL AND c.last_used_at + t.close_after_idle <= ?
                        AND \(Self.nothingQueued)
                        AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.channel_id = c.channel_id AND a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at > ?))
                ORDER BY c.last_used_at LIMIT ?
                """, arguments: [now.timeIntervalSince1970, now.timeIntervalSince1970 - lifetime, limit]).map(Self.topicChannel)
        }
    }

    public func idlestTopicChannel(bundleID: String, environment: PushEnvironment, now: Date, lifetime: TimeInterval) async throws -> TopicChannel? {
        try readNow { db in
            try Row.fetchOne(db, sql: """
                SELECT c.* FROM topic_channels c
                WHERE c.bundle_id = ? AND c.environment = ?
                  AND \(Self.nothingQueued)
                  AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.channel_id = c.channel_id AND a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at > ?)
                ORDER BY c.last_used_at LIMIT 1
                """, arguments: [bundleID, environment.rawValue, now.timeIntervalSince1970 - lifetime]).map(Self.topicChannel)
        }
    }
}
