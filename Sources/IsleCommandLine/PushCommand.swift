import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore

struct PushCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push",
        abstract: "Send one Live Activity or widgets push, checked before it leaves.",
        subcommands: [Start.self, Update.self, End.self, Widgets.self]
    )

    /// Options every Live Activity push takes.
    struct ActivityOptions: ParsableArguments {
        @Option(help: "The push token (hex): the activity's update token, or the push-to-start token for start.")
        var token: String

        @Option(name: .customLong("content-state"), help: ArgumentHelp("The ContentState as JSON, or @file (@- for stdin).", valueName: "json"))
        var contentState: String?

        @Option(name: .customLong("alert-title"), help: "Alert title (plain text).")
        var alertTitle: String?
        @Option(name: .customLong("alert-body"), help: "Alert body (plain text).")
        var alertBody: String?
        @Option(name: .customLong("alert-title-loc-key"), help: "Alert title as a localization key.")
        var alertTitleLocKey: String?
        @Option(name: .customLong("alert-title-loc-args"), parsing: .singleValue, help: "An argument for the title key (repeat for more).")
        var alertTitleLocArgs: [String] = []
        @Option(name: .customLong("alert-body-loc-key"), help: "Alert body as a localization key.")
        var alertBodyLocKey: String?
        @Option(name: .customLong("alert-body-loc-args"), parsing: .singleValue, help: "An argument for the body key (repeat for more).")
        var alertBodyLocArgs: [String] = []
        @Option(help: "Alert sound: default, or a sound file name in the app bundle.")
        var sound: String?

        @Option(name: .customLong("stale-date"), help: "When the activity becomes stale: Unix seconds, ISO-8601, or +30m.")
        var staleDate: String?
        @Option(name: .customLong("relevance-score"), help: "Ordering among the app's activities (higher first).")
        var relevanceScore: Double?
        @Option(help: "When the data was generated (default: now). Unix seconds, ISO-8601, or +/-N[smhd].")
        var timestamp: String?

        @Option(help: "apns-priority: 5 (default; no budget) or 10 (immediate; spends the hourly budget).")
        var priority: Int?
        @Option(help: "apns-expiration: 0 to try once, or a date until which APNs retries.")
        var expiration: String?
        @Option(name: .customLong("apns-id"), help: "The apns-id to send (a UUID; random by default).")
        var apnsID: String?
        @Option(help: ArgumentHelp("The attributes type's schema (JSON) to check content-state and attributes against.", valueName: "file"))
        var schema: String?

        @Flag(name: .customLong("dry-run"), help: "Print the request as a curl command instead of sending it.")
        var dryRun = false
        @Flag(name: .customLong("show-secrets"), help: "With --dry-run, print the real JWT instead of <redacted>.")
        var showSecrets = false

        func alert() throws(CLIError) -> LiveActivityAlert? {
            let title: AlertText? = try text(plain: alertTitle, key: alertTitleLocKey, args: alertTitleLocArgs, what: "title")
            let body: AlertText? = try text(plain: alertBody, key: alertBodyLocKey, args: alertBodyLocArgs, what: "body")
            switch (title, body) {
            case (nil, nil):
                if sound != nil { throw CLIError("--sound needs an alert: add --alert-title and --alert-body") }
                return nil
            case (let t?, let b?):
                let s: AlertSound? = sound.map { $0 == "default" ? .default : .named($0) }
                return LiveActivityAlert(title: t, body: b, sound: s)
            case (nil, _): throw CLIError("an alert needs a title too: add --alert-title or --alert-title-loc-key")
            case (_, nil): throw CLIError("an alert needs a body too: add --alert-body or --alert-body-loc-key")
            }
        }

        func text(plain: String?, key: String?, args: [String], what: String) throws(CLIError) -> AlertText? {
            if plain != nil, key != nil { throw CLIError("--alert-\(what) and --alert-\(what)-loc-key exclude each other") }
            if key == nil, !args.isEmpty { throw CLIError("--alert-\(what)-loc-args needs --alert-\(what)-loc-key") }
            if let plain { return .plain(plain) }
            if let key { return .localized(key: key, arguments: args) }
            return nil
        }
    }

    struct Start: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Start a Live Activity with a push-to-start token (iOS 17.2+).")
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var activity: ActivityOptions
        @Option(help: ArgumentHelp("The static attributes as JSON, or @file.", valueName: "json"))
        var attributes: String
        @Option(name: .customLong("attributes-type"), help: "The ActivityAttributes struct name, exactly as in Swift (default: the schema's).")
        var attributesType: String?
        @Flag(name: .customLong("input-push-token"), help: "Ask the device for a new update token (iOS 18+).")
        var inputPushToken = false
        @Option(name: .customLong("input-push-channel"), help: "Subscribe the new activity to this broadcast channel (iOS 18+).")
        var inputPushChannel: String?

        func run() async throws {
            let schema = try Inputs.schema(activity.schema)
            guard let type = attributesType ?? schema?.attributesType else {
                throw CLIError("missing --attributes-type: the ActivityAttributes struct name (or give --schema)")
            }
            guard let alert = try activity.alert() else {
                throw CLIError("a start push needs an alert (the device drops a start without one): add --alert-title and --alert-body")
            }
            var payload = try PushCommand.payload(.start, activity)
            payload.alert = alert
            payload.attributesType = type
            payload.attributes = try Inputs.json(attributes, flag: "--attributes")
            payload.inputPushToken = inputPushToken
            payload.inputPushChannel = inputPushChannel
            try await PushCommand.send(payload, activity, connection, schema: schema)
        }
    }

    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Update a Live Activity's content.")
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var activity: ActivityOptions

        func run() async throws {
            var payload = try PushCommand.payload(.update, activity)
            payload.alert = try activity.alert()
            try await PushCommand.send(payload, activity, connection, schema: try Inputs.schema(activity.schema))
        }
    }

    struct End: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "End a Live Activity, optionally with final content and a dismissal date.")
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var activity: ActivityOptions
        @Option(name: .customLong("dismissal-date"), help: "When to remove it from the Lock Screen (past = at once; at most 4 h after the end).")
        var dismissalDate: String?

        func run() async throws {
            var payload = try PushCommand.payload(.end, activity)
            payload.alert = try activity.alert()
            let now = CLIContext.current.now()
            payload.dismissalDate = try dismissalDate.map { (d) throws(CLIError) in try Inputs.date(d, flag: "--dismissal-date", now: now) }
            try await PushCommand.send(payload, activity, connection, schema: try Inputs.schema(activity.schema))
        }
    }

    struct Widgets: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make WidgetKit reload the app's timelines (iOS 26 widget push token).")
        @OptionGroup var connection: ConnectionOptions
        @Option(help: "The widget push token (hex).")
        var token: String
        @Option(help: "apns-priority: 10 (default) or 5.")
        var priority: Int = 10
        @Flag(name: .customLong("dry-run"), help: "Print the request as a curl command instead of sending it.")
        var dryRun = false
        @Flag(name: .customLong("show-secrets"), help: "With --dry-run, print the real JWT.")
        var showSecrets = false

        func run() async throws {
            let push = APNsPush.widgetsReload(token: try Inputs.token(token), bundleID: try connection.resolvedBundleID(), priority: try Inputs.priority(priority))
            try await PushCommand.deliver(push, connection, dryRun: dryRun, showSecrets: showSecrets)
        }
    }

    static func payload(_ event: LiveActivityEvent, _ a: ActivityOptions) throws(CLIError) -> LiveActivityPayload {
        let now = CLIContext.current.now()
        let timestamp = try a.timestamp.map { (t) throws(CLIError) in try Inputs.date(t, flag: "--timestamp", now: now) } ?? now
        var payload = LiveActivityPayload(event: event, timestamp: timestamp)
        if let cs = a.contentState {
            payload.contentState = try Inputs.json(cs, flag: "--content-state")
        } else if event != .end {
            throw CLIError("missing --content-state: the ContentState as JSON (or @file)")
        }
        payload.staleDate = try a.staleDate.map { (d) throws(CLIError) in try Inputs.date(d, flag: "--stale-date", now: now) }
        payload.relevanceScore = a.relevanceScore
        return payload
    }

    static func send(_ payload: LiveActivityPayload, _ a: ActivityOptions, _ connection: ConnectionOptions, schema: ActivitySchema?) async throws {
        let token = try Inputs.token(a.token)
        let priority = try Inputs.priority(a.priority ?? 5)
        let now = CLIContext.current.now()
        var expiration: APNsExpiration?
        if let e = a.expiration { expiration = e == "0" ? .immediately : .at(try Inputs.date(e, flag: "--expiration", now: now)) }
        var apnsID: APNsID?
        if let id = a.apnsID {
            guard let u = APNsID(id) else { throw CLIError("--apns-id: \"\(id)\" is not a UUID (8-4-4-4-12 hex digits)") }
            apnsID = u
        }
        let push = APNsPush.liveActivity(payload, token: token, bundleID: try connection.resolvedBundleID(), priority: priority, expiration: expiration, apnsID: apnsID, schema: schema)
        let report = PayloadValidator(options: .init(priority: priority, schema: schema, now: now)).validate(payload)
        if report.isValid { Report.warnings(report) }
        try await deliver(push, connection, dryRun: a.dryRun, showSecrets: a.showSecrets)
    }

    static func deliver(_ push: APNsPush, _ connection: ConnectionOptions, dryRun: Bool, showSecrets: Bool) async throws {
        try await connection.withClient { client in
            if dryRun {
                let request: APNsTransportRequest
                do throws(APNsError) { request = try client.request(for: push) } catch { throw Report.failure(error, target: try? connection.environment()) }
                say(Curl.command(request, caCert: connection.caCertPath, showSecrets: showSecrets))
                return
            }
            do throws(APNsError) {
                Report.response(try await client.send(push))
            } catch {
                throw Report.failure(error, target: try? connection.environment())
            }
        }
    }
}

/// The request as a curl command (the WWDC "send your first push from the terminal").
enum Curl {
    static func command(_ r: APNsTransportRequest, caCert: String?, showSecrets: Bool) -> String {
        var lines = ["curl --http2 --silent --show-error --include \\"]
        if let caCert { lines.append("  --cacert \(quote(caCert)) \\") }
        if r.method != "POST" || r.body.isEmpty { lines.append("  --request \(r.method) \\") }
        for (name, value) in r.headers {
            let v = name == "authorization" && !showSecrets ? "bearer <redacted: add --show-secrets, or run isle jwt>" : value
            lines.append("  --header \(quote("\(name): \(v)")) \\")
        }
        if !r.body.isEmpty { lines.append("  --data \(quote(String(decoding: r.body, as: UTF8.self))) \\") }
        lines.append("  \(quote(r.url))")
        return lines.joined(separator: "\n")
    }

    static func quote(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: #"'\''"#) + "'" }
}
