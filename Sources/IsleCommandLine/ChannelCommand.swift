import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore

struct ChannelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channel",
        abstract: "Manage broadcast channels and broadcast to them (iOS 18+).",
        subcommands: [Create.self, List.self, Read.self, Delete.self, Send.self]
    )

    static func channelID(_ id: String) throws(CLIError) -> String {
        let trimmed = id.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty, Data(base64Encoded: trimmed) != nil else { throw CLIError("--channel: \"\(id)\" is not a base64 channel id") }
        return trimmed
    }

    static func policy(_ value: Int) throws(CLIError) -> MessageStoragePolicy {
        guard let p = MessageStoragePolicy(rawValue: value) else {
            throw CLIError("--storage-policy: \(value) is not a policy; use 0 (no message stored) or 1 (most recent message stored)")
        }
        return p
    }

    static func run<R: Sendable>(_ connection: ConnectionOptions, _ body: (APNsClient, String) async throws(APNsError) -> R) async throws -> R {
        let bundleID = try connection.resolvedBundleID()
        return try await connection.withClient { client in
            do throws(APNsError) { return try await body(client, bundleID) } catch { throw Report.failure(error, target: try? connection.environment()) }
        }
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a channel; prints its id.")
        @OptionGroup var connection: ConnectionOptions
        @Option(name: .customLong("storage-policy"), help: "0: no message stored (higher budget; expiration 0). 1: the most recent message is stored up to 8 h.")
        var storagePolicy: Int = 0

        func run() async throws {
            let policy = try ChannelCommand.policy(storagePolicy)
            let channel = try await ChannelCommand.run(connection) { (c, b) throws(APNsError) in try await c.createChannel(bundleID: b, storagePolicy: policy) }
            say(channel.id)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the app's channel ids.")
        @OptionGroup var connection: ConnectionOptions

        func run() async throws {
            let ids = try await ChannelCommand.run(connection) { (c, b) throws(APNsError) in try await c.listChannels(bundleID: b) }
            for id in ids { say(id) }
            if ids.isEmpty { warn("no channels") }
        }
    }

    struct Read: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show a channel's storage policy.")
        @OptionGroup var connection: ConnectionOptions
        @Option(help: "The channel id (base64).")
        var channel: String

        func run() async throws {
            let id = try ChannelCommand.channelID(channel)
            let c = try await ChannelCommand.run(connection) { (c, b) throws(APNsError) in try await c.readChannel(bundleID: b, channelID: id) }
            say("\(c.id)  message-storage-policy \(c.storagePolicy.rawValue) (\(c.storagePolicy == .noMessageStored ? "no message stored" : "most recent message stored"))")
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a channel (irreversible).")
        @OptionGroup var connection: ConnectionOptions
        @Option(help: "The channel id (base64).")
        var channel: String

        func run() async throws {
            let id = try ChannelCommand.channelID(channel)
            try await ChannelCommand.run(connection) { (c, b) throws(APNsError) in try await c.deleteChannel(bundleID: b, channelID: id) }
            say("deleted \(id)")
        }
    }

    struct Send: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Broadcast an update or end to every activity subscribed to a channel.")
        @OptionGroup var connection: ConnectionOptions
        @Option(help: "The channel id (base64).")
        var channel: String
        @Option(help: "update (default) or end.")
        var event: String = "update"
        @Option(name: .customLong("content-state"), help: ArgumentHelp("The ContentState as JSON, or @file.", valueName: "json"))
        var contentState: String?
        @Option(name: .customLong("alert-title")) var alertTitle: String?
        @Option(name: .customLong("alert-body")) var alertBody: String?
        @Option(name: .customLong("stale-date"), help: "Unix seconds, ISO-8601, or +30m.")
        var staleDate: String?
        @Option(name: .customLong("dismissal-date"), help: "With end: when to remove the activities.")
        var dismissalDate: String?
        @Option(name: .customLong("relevance-score")) var relevanceScore: Double?
        @Option(help: "5 (default) or 10.")
        var priority: Int = 5
        @Option(name: .customLong("storage-policy"), help: "The channel's policy, if known, to check the expiration rule (0 or 1).")
        var storagePolicy: Int?
        @Option(help: "apns-expiration: 0 (default) or a date (policy 1 channels only).")
        var expiration: String = "0"
        @Option(help: ArgumentHelp("Schema to check the content-state against.", valueName: "file"))
        var schema: String?

        func run() async throws {
            guard let ev = LiveActivityEvent(rawValue: event), ev != .start else {
                throw CLIError("--event: \"\(event)\" — a broadcast carries update or end (broadcasts cannot start activities)")
            }
            let now = CLIContext.current.now()
            var payload = LiveActivityPayload(event: ev, timestamp: now)
            if let cs = contentState { payload.contentState = try Inputs.json(cs, flag: "--content-state") } else if ev == .update {
                throw CLIError("missing --content-state: the ContentState as JSON (or @file)")
            }
            switch (alertTitle, alertBody) {
            case (let t?, let b?): payload.alert = LiveActivityAlert(title: t, body: b, sound: .default)
            case (nil, nil): break
            default: throw CLIError("an alert needs both --alert-title and --alert-body")
            }
            payload.staleDate = try staleDate.map { (d) throws(CLIError) in try Inputs.date(d, flag: "--stale-date", now: now) }
            payload.dismissalDate = try dismissalDate.map { (d) throws(CLIError) in try Inputs.date(d, flag: "--dismissal-date", now: now) }
            payload.relevanceScore = relevanceScore
            let id = try ChannelCommand.channelID(channel)
            let push = BroadcastPush(
                bundleID: try connection.resolvedBundleID(), channelID: id, payload: payload, priority: try Inputs.priority(priority),
                expiration: expiration == "0" ? .immediately : .at(try Inputs.date(expiration, flag: "--expiration", now: now)),
                storagePolicy: try storagePolicy.map { (p) throws(CLIError) in try ChannelCommand.policy(p) }, schema: try Inputs.schema(schema))
            let response = try await ChannelCommand.run(connection) { (c, _) throws(APNsError) in try await c.broadcast(push) }
            Report.response(response)
        }
    }
}
