import ArgumentParser
import AsyncHTTPClient
import Foundation
import IsleCore
import IsleTesting
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// A topic as an audience (docs/server.md, "Topics as audiences"): `--followers` simulated
/// activities follow one topic, `--channel-share` of them on the topic's broadcast channel (an
/// iOS 18+ phone) and the rest by token (an iOS 17 phone); one backend call updates them all.
/// Measured from the call to the server counting its last send, then to every simulated activity
/// showing the new state; the server's CPU for the whole audience from /proc/PID/stat. Then the
/// same audience all on tokens, for comparison (and the token leg's share of the first run's CPU).
struct AudienceBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audience",
        abstract: "One topic update to a mixed audience (broadcast channel + tokens), with isle serve and isle sim as child processes.")

    @Option(help: "Activities following the topic.") var followers = 100_000
    @Option(help: "The share of them on iOS 18 and later, on the topic's broadcast channel (0…1).") var channelShare = 0.8
    @Flag(inversion: .prefixedNo, help: "Also run the same audience all on tokens.") var compareTokens = true
    @Option(help: "Activities per simulated phone (each phone its own installation, as on real phones; fewer phones, more per phone).") var perPhone = 500
    @Option(help: "isle serve --concurrency.") var concurrency = 256
    @Option(help: "Give up after this many seconds waiting for one update.") var maxSeconds: Double = 300

    struct Figures {
        var sentSeconds: Double
        var shownSeconds: Double
        var serverCPU: Double
        var tokens: Int
        var onChannel: Int
    }

    func run() async throws {
        let isle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("isle").path
        guard FileManager.default.isExecutableFile(atPath: isle) else { throw ValidationError("no isle binary beside isle-bench (swift build -c release --product isle)") }
        guard (1...200_000).contains(followers), (0...1).contains(channelShare) else { throw ValidationError("--followers 1…200000, --channel-share 0…1") }
        print("isle serve and isle sim as child processes (\(ProcessInfo.processInfo.activeProcessorCount) cores); CPU from /proc/PID/stat")
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        defer { _ = http.shutdown() }
        let onChannel = Int((Double(followers) * channelShare).rounded())
        let mixed = try await measure(isle: isle, http: http, followers: followers, onChannel: onChannel)
        Self.report("mixed", mixed)
        guard compareTokens else { return }
        let tokens = try await measure(isle: isle, http: http, followers: followers, onChannel: 0)
        Self.report("all on tokens", tokens)
        print(String(format: "mixed / all on tokens: %.2f× the time, %.2f× the server CPU", mixed.sentSeconds / tokens.sentSeconds, mixed.serverCPU / tokens.serverCPU))
        if onChannel > 0, onChannel < followers {
            // The token leg's share: the mixed run beside its channel's followers alone.
            let channelOnly = try await measure(isle: isle, http: http, followers: onChannel, onChannel: onChannel)
            Self.report("the channel's followers alone", channelOnly)
            let leg = mixed.serverCPU - channelOnly.serverCPU
            print(String(format: "the token leg of the mixed run: %.2f s of its %.2f s server CPU (%.0f %%), %.0f µs per token push; all on tokens: %.0f µs per follower",
                         leg, mixed.serverCPU, 100 * leg / mixed.serverCPU, leg * 1e6 / Double(mixed.tokens), tokens.serverCPU * 1e6 / Double(tokens.tokens)))
        }
    }

    static func report(_ name: String, _ f: Figures) {
        print(String(format: "%@: %d followers (%d on the channel, %d by token): backend call → the last simulated phone showing it %.2f s (the server's last APNs 200; isle sim applies a push before it answers, and every activity was then read back showing it, in %.1f s); server CPU %.2f s for the whole audience (%.1f µs per follower)",
                     name, f.onChannel + f.tokens, f.onChannel, f.tokens, f.sentSeconds, f.shownSeconds, f.serverCPU, f.serverCPU * 1e6 / Double(f.onChannel + f.tokens)))
    }

    func measure(isle: String, http: HTTPClient, followers: Int, onChannel: Int) async throws -> Figures {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-audience-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let ports = try (0..<3).map { _ in try freeLoopbackPort() }
        let schema = #"{"attributesType":"ScoreAttributes","attributes":{"match":"string"},"contentState":{"home":"int","away":"int"}}"#
        try schema.write(toFile: dir + "/schema.json", atomically: true, encoding: .utf8)
        var children: [Child] = []
        defer { for c in children { c.stop() } }
        // One phone holds hundreds of activities and the run times one update to all: priority 5
        // applied at once, and the per-token, per-app and budget limits lifted — the subject is the
        // server's fan-out, not the phone's leeway (isle-bench day tests that).
        let sim = try Child.start(isle, ["sim", "--dir", dir + "/sim", "--single-host", "--apns-port", "\(ports[0])", "--control-port", "\(ports[1])",
                                         "--low-priority-delay", "0", "--per-token-limit", "0",
                                         "--max-activities-per-app", "400000", "--max-activities-per-device", "400000", "--hourly-budget", "100000000"],
                                  log: dir + "/sim.log")
        children.append(sim)
        let control = "http://127.0.0.1:\(ports[1])"
        do { try await SplitBench.waitFor(http, control + "/devices") } catch {
            throw ValidationError("isle sim did not start: \(((try? String(contentsOfFile: dir + "/sim.log", encoding: .utf8)) ?? "").suffix(1000))")
        }
        var env = ProcessInfo.processInfo.environment
        env["ISLE_MASTER_KEY_FILE"] = dir + "/master.key"
        env["ISLE_DATABASE"] = dir + "/isle.sqlite"
        for key in env.keys where key.hasPrefix("OTEL_") { env[key] = nil }
        let (backend, device) = try SplitBench.addApp(isle: isle, dir: dir, environment: env)
        let server = try Child.start(isle, ["serve", "--port", "\(ports[2])", "--apns-url", "https://127.0.0.1:\(ports[0])", "--apns-ca-cert", dir + "/sim/ca.pem",
                                            "--concurrency", "\(concurrency)", "--backend-rate", "off", "--device-rate", "off", "--installation-rate", "off", "--address-rate", "off",
                                            "--max-live-activities-per-installation", "100000", "--max-new-installations-per-address", "0", "--max-new-activities-per-address", "0",
                                            "--log-level", "error"],
                                     environment: env, log: dir + "/serve.log")
        children.append(server)
        let base = "http://127.0.0.1:\(ports[2])"
        do { try await SplitBench.waitFor(http, base + "/health") } catch {
            throw ValidationError("isle serve did not start: \(((try? String(contentsOfFile: dir + "/serve.log", encoding: .utf8)) ?? "").suffix(1000))")
        }
        _ = try await SplitBench.json(http, "PUT", base + "/v1/topics/match", key: backend, body: ["storagePolicy": 1])
        let tokens = followers - onChannel
        let started = ContinuousClock.now
        // Phones of --per-phone activities each, its own installation: iOS 26 for the channel's
        // followers, iOS 17.5 (no broadcast channels) for a fifth of the audience, iOS 26 with tokens
        // for the rest of an all-token run.
        let oldCount = min(tokens, followers - Int((Double(followers) * channelShare).rounded()))
        let schemaJSON = try JSONParser.parse(Array(schema.utf8))
        var groups: [(phones: [Phone], count: Int, channel: Bool)] = []
        var channel: String?
        var made = 0
        for (count, os, onTheChannel) in [(onChannel, "26.0", true), (oldCount, "17.5", false), (tokens - oldCount, "26.0", false)] where count > 0 {
            var phones: [Phone] = []
            for _ in 0..<((count + perPhone - 1) / perPhone) {
                let n = made
                made += 1
                let id = try await SplitBench.json(http, "POST", control + "/devices", key: nil, body: ["name": .string("fan-\(n)"), "osVersion": .string(os), "model": "iPhone 15"])["id"]?.stringValue ?? ""
                _ = try await SplitBench.json(http, "POST", control + "/devices/\(id)/apps", key: nil, body: ["bundleID": "com.example.scores", "schemas": [schemaJSON]])
                let secret = try await SplitBench.json(http, "PUT", base + "/v1/installations/fan-\(n)", key: device, body: ["liveActivitiesEnabled": true])["installationSecret"]?.stringValue ?? ""
                phones.append(Phone(device: id, installation: "fan-\(n)", secret: secret))
            }
            if onTheChannel, channel == nil, let first = phones.first {
                channel = try await SplitBench.json(http, "POST", base + "/v1/topics/match/channel", key: device, body: ["installationID": .string(first.installation)],
                                                    headers: [("Isle-Installation-Secret", first.secret)])["channelID"]?.stringValue
            }
            groups.append((phones, count, onTheChannel))
        }
        for g in groups {
            try await follow(http, control: control, base: base, device: device, phones: g.phones, count: g.count, channel: g.channel ? channel : nil)
        }
        let allPhones = groups.flatMap(\.phones)
        print(String(format: "%d followers on %d phones registered in %.0f s (%d on the channel, %d by token)", followers, allPhones.count, SplitBench.seconds(ContinuousClock.now - started), onChannel, tokens))

        let broadcasts = channel == nil ? 0 : 1
        // Warm-up: one update through both legs (connections, caches).
        try await update(http, base: base, backend: backend, home: 1, sends: tokens + broadcasts)
        let before = try SplitBench.cpu(of: server.pid)
        let simBefore = try SplitBench.cpu(of: sim.pid)
        let t0 = Date()
        try await update(http, base: base, backend: backend, home: 2, sends: tokens + broadcasts)
        let cpu = try SplitBench.cpu(of: server.pid) - before
        let simCPU = try SplitBench.cpu(of: sim.pid) - simBefore
        // The last APNs answer of this update, as the server recorded it (its clock is this
        // machine's): a delivery's time is when it was sent, its latency how long the answer took.
        let last = try Child.output("/usr/bin/sqlite3", [dir + "/isle.sqlite", "SELECT MAX(at + latency_ms / 1000.0) FROM deliveries WHERE status = 200"])
        guard let lastAt = Double(last) else { throw ValidationError("no delivery recorded: \(last)") }
        let sent = lastAt - t0.timeIntervalSince1970
        print(String(format: "  isle sim's CPU meanwhile: %.2f s", simCPU))
        // Every simulated activity shows the new score: read back from the simulator's phones once
        // (isle sim applies each push before it answers, so the last 200 was the last phone).
        let checking = ContinuousClock.now
        var behind = 0
        for phone in allPhones {
            let d = try await Self.big(http, control + "/devices/" + phone.device)
            for a in d["activities"]?.arrayValue ?? [] {
                let home: Int64? = a["contentState"]?["home"]?.numberValue?.int64Value
                let live: Bool = a["state"]?.stringValue == "active"
                if live, home != 2 { behind += 1 }
            }
        }
        guard behind == 0 else { throw ValidationError("\(behind) simulated activities do not show the update after the server's last send") }
        let shown = SplitBench.seconds(ContinuousClock.now - checking)
        return Figures(sentSeconds: sent, shownSeconds: shown, serverCPU: cpu, tokens: tokens, onChannel: onChannel)
    }

    /// One topic update, and its `sends` deliveries counted sent by the server.
    func update(_ http: HTTPClient, base: String, backend: String, home: Int, sends: Int) async throws {
        let before = try await SplitBench.sent(http, base)
        let accepted = try await SplitBench.json(http, "POST", base + "/v1/topics/match/update", key: backend,
                                                 body: ["contentState": ["home": .int(Int64(home)), "away": 0], "alert": ["title": "Goal", "body": "scored"]])
        guard accepted["accepted"]?.numberValue?.int64Value == Int64(sends) else { throw ValidationError("the update: \(accepted.jsonString)") }
        let deadline = ContinuousClock.now + .seconds(Int64(maxSeconds))
        while ContinuousClock.now < deadline {
            if try await SplitBench.sent(http, base) >= before + sends { return }
            // Not often: each /metrics the server renders is CPU taken from the deliveries (the
            // time of the last send is read from its deliveries afterwards, not from this poll).
            try await Task.sleep(for: .milliseconds(250))
        }
        throw ValidationError("the update's \(sends) sends did not finish within \(maxSeconds) s")
    }

    struct Phone: Sendable {
        var device: String
        var installation: String
        var secret: String
    }

    /// Starts `count` activities on `phones`, --per-phone each (on `channel`, or with a token), and registers each as following "match".
    func follow(_ http: HTTPClient, control: String, base: String, device: String, phones: [Phone], count: Int, channel: String?) async throws {
        guard count > 0 else { return }
        let next = Counter()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<16 {
                group.addTask {
                    while true {
                        let i = next.take()
                        guard i < count else { return }
                        let phone = phones[i / perPhone], installation = phone.installation, secret = phone.secret
                        var request: JSONObject = ["attributesType": "ScoreAttributes", "attributes": ["match": .string("m-\(i)")], "contentState": ["home": 0, "away": 0]]
                        var registration: JSONObject = ["attributesType": "ScoreAttributes", "installationID": .string(installation), "topics": ["match"]]
                        if let channel {
                            request["pushType"] = ["channel": .string(channel)]
                            registration["channelID"] = .string(channel)
                        } else {
                            request["waitForPushToken"] = true
                        }
                        let started = try await SplitBench.json(http, "POST", control + "/devices/\(phone.device)/apps/com.example.scores/activities", key: nil, body: .object(request))
                        if channel == nil {
                            guard let token = started["updateToken"]?.stringValue else { throw ValidationError("the simulator gave no token: \(started.jsonString)") }
                            registration["token"] = .string(token)
                        }
                        _ = try await SplitBench.json(http, "POST", base + "/v1/activities", key: device, body: .object(registration), headers: [("Isle-Installation-Secret", secret)])
                    }
                }
            }
            try await group.waitForAll()
        }
    }

    /// A GET whose answer may be large (a phone with 100,000 activities).
    static func big(_ http: HTTPClient, _ url: String) async throws -> JSONValue {
        let response = try await http.execute(HTTPClientRequest(url: url), timeout: .seconds(120))
        return try JSONParser.parse(Array(buffer: try await response.body.collect(upTo: 1 << 30)))
    }
}
