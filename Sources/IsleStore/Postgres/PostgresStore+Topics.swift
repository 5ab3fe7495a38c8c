public import Foundation
public import IsleCore
public import IsleDelivery
import Logging
import PostgresNIO

// Topics as audiences (docs/server.md, "Topics as audiences"), on PostgreSQL: several instances
// may make a topic's channel at once; the unique (app, topic, environment) index keeps one.
extension PostgresStore: TopicRepository {
    /// Nothing waits to be broadcast on the channel `c` (its lane's open jobs, or a scheduled one).
    static let nothingQueued = """
        NOT EXISTS (SELECT 1 FROM jobs j WHERE j.lane = 'c:' || c.channel_id AND j.state IN ('queued', 'claimed'))
        AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'scheduled' AND j.channel_id = c.channel_id)
        """

    public func putTopic(_ t: TopicRecord, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("""
                INSERT INTO topics (bundle_id, topic, storage_policy, close_after_idle, created_at, ended_at, last_push_at) VALUES ($1, $2, $3, $4, $5, NULL, NULL)
                ON CONFLICT (bundle_id, topic) DO UPDATE SET storage_policy = excluded.storage_policy, close_after_idle = excluded.close_after_idle, ended_at = NULL
                """, [.text(t.bundleID), .text(t.topic), .int(Int64(t.storagePolicy)), .int(Int64(t.closeAfterIdle)), .date(t.createdAt)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    static func topic(_ r: PGRow) throws -> TopicRecord {
        TopicRecord(bundleID: try r.string("bundle_id"), topic: try r.string("topic"), storagePolicy: Int(try r.int("storage_policy")),
                    closeAfterIdle: TimeInterval(try r.int("close_after_idle")), createdAt: try r.date("created_at"), endedAt: try r.optionalDate("ended_at"),
                    lastPushAt: try r.optionalDate("last_push_at"),
                    lastContent: try r.optionalString("last_content").map { try BadRow.json($0, table: "topics", id: try r.string("topic"), column: "last_content") })
    }

    static func topicChannel(_ r: PGRow) throws -> TopicChannel {
        TopicChannel(channelID: try r.string("channel_id"), bundleID: try r.string("bundle_id"), topic: try r.string("topic"),
                     environment: try BadRow.decode(try r.string("environment"), as: PushEnvironment.self, table: "topic_channels", id: try r.string("channel_id"), column: "environment"),
                     createdAt: try r.date("created_at"), lastUsedAt: try r.date("last_used_at"))
    }

    public func topic(bundleID: String, topic: String) async throws -> TopicRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM topics WHERE bundle_id = $1 AND topic = $2", [.text(bundleID), .text(topic)], logger: log).map(Self.topic) }
    }

    public func topics(bundleID: String) async throws -> [TopicRecord] {
        let log = logger
        return try await read { conn in try await conn.rows("SELECT * FROM topics WHERE bundle_id = $1 ORDER BY topic", [.text(bundleID)], logger: log).map(Self.topic) }
    }

    public func topicChannels(bundleID: String, topic: String) async throws -> [TopicChannel] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM topic_channels WHERE bundle_id = $1 AND topic = $2 ORDER BY environment", [.text(bundleID), .text(topic)], logger: log).map(Self.topicChannel)
        }
    }

    public func addTopicChannel(_ link: TopicChannel, channel: ChannelRecord) async throws -> TopicChannel {
        let log = logger
        return try await transaction { conn in
            let inserted = try await conn.row("""
                INSERT INTO topic_channels (channel_id, bundle_id, topic, environment, created_at, last_used_at) VALUES ($1, $2, $3, $4, $5, $6)
                ON CONFLICT (bundle_id, topic, environment) DO NOTHING RETURNING channel_id
                """, [.text(link.channelID), .text(link.bundleID), .text(link.topic), .text(link.environment.rawValue), .date(link.createdAt), .date(link.lastUsedAt)], logger: log)
            guard inserted != nil else {
                let standing = try await conn.row("SELECT * FROM topic_channels WHERE bundle_id = $1 AND topic = $2 AND environment = $3",
                                                  [.text(link.bundleID), .text(link.topic), .text(link.environment.rawValue)], logger: log)
                guard let standing else { throw StoreError(.conflict, "the topic's channel changed meanwhile; ask again") }
                return try Self.topicChannel(standing)
            }
            try await conn.rows("INSERT INTO channels (id, bundle_id, storage_policy, created_at, environment) VALUES ($1, $2, $3, $4, $5)",
                                [.text(channel.id), .text(channel.bundleID), .int(Int64(channel.storagePolicy)), .date(channel.createdAt), .text(channel.environment?.rawValue)], logger: log)
            return link
        }
    }

    public func topicPushed(bundleID: String, topic: String, at: Date, content: JSONValue?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("UPDATE topics SET last_push_at = $1, last_content = COALESCE($4::jsonb, last_content) WHERE bundle_id = $2 AND topic = $3",
                                [.date(at), .text(bundleID), .text(topic), .json(content?.jsonString)], logger: log)
            try await conn.rows("UPDATE topic_channels SET last_used_at = GREATEST(last_used_at, $1) WHERE bundle_id = $2 AND topic = $3", [.date(at), .text(bundleID), .text(topic)], logger: log)
        }
    }

    public func endTopic(bundleID: String, topic: String, at: Date) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("UPDATE topics SET ended_at = $1, last_push_at = $1 WHERE bundle_id = $2 AND topic = $3", [.date(at), .text(bundleID), .text(topic)], logger: log)
        }
    }

    public func deleteTopic(bundleID: String, topic: String, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("DELETE FROM topics WHERE bundle_id = $1 AND topic = $2", [.text(bundleID), .text(topic)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    public func removeTopicChannel(channelID: String) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("DELETE FROM topic_channels WHERE channel_id = $1", [.text(channelID)], logger: log)
            try await conn.rows("DELETE FROM channels WHERE id = $1", [.text(channelID)], logger: log)
        }
    }

    public func channelCount(bundleID: String, environment: PushEnvironment, defaultEnvironment: PushEnvironment) async throws -> Int {
        let log = logger
        return try await read { conn in
            Int(try await conn.row("SELECT COUNT(*) AS n FROM channels WHERE bundle_id = $1 AND COALESCE(environment, $2) = $3",
                                   [.text(bundleID), .text(defaultEnvironment.rawValue), .text(environment.rawValue)], logger: log)?.int("n") ?? 0)
        }
    }

    public func closableTopicChannels(now: Date, lifetime: TimeInterval, limit: Int) async throws -> [TopicChannel] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT c.* FROM topic_channels c LEFT JOIN topics t ON t.bundle_id = c.bundle_id AND t.topic = c.topic
                WHERE ((t.topic IS NULL OR t.ended_at IS NOT NULL) AND \(Self.nothingQueued))
                   OR (t.topic IS NOT NULL AND t.ended_at IS NULL AND c.last_used_at + make_interval(secs => t.close_after_idle) <= $1 AND \(Self.nothingQueued)
                        AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.channel_id = c.channel_id AND a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at > $2))
                ORDER BY c.last_used_at LIMIT $3
                """, [.date(now), .date(now.addingTimeInterval(-lifetime)), .int(Int64(limit))], logger: log).map(Self.topicChannel)
        }
    }

    public func idlestTopicChannel(bundleID: String, environment: PushEnvironment, now: Date, lifetime: TimeInterval) async throws -> TopicChannel? {
        let log = logger
        return try await read { conn in
            try await conn.row("""
                SELECT c.* FROM topic_channels c
                WHERE c.bundle_id = $1 AND c.environment = $2 AND \(Self.nothingQueued)
                  AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.channel_id = c.channel_id AND a.state IN (\(ActivityLifecycle.pushChangesSQL)) AND a.started_at > $3)
                ORDER BY c.last_used_at LIMIT 1
                """, [.text(bundleID), .text(environment.rawValue), .date(now.addingTimeInterval(-lifetime))], logger: log).map(Self.topicChannel)
        }
    }
}
