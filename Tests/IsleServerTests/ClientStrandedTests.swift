import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Synchronization
import Testing

/// IsleClient is never stranded (docs/client.md, "Never stranded"): the server's rows removed by
/// retention, the server restored from an older backup, a server that answers 404 then 200. In
/// each, the app's installation, push-to-start token and live activities are on the server again,
/// each activity once, and the backend's by-key update reaches the phone.
@Suite("IsleClient: never stranded")
struct ClientStrandedTests {
    typealias Kit = ClientTests.Kit
    static let type = "PizzaDeliveryAttributes"

    /// What the client did, request by request (the test's eyes).
    final class Log: Sendable {
        let entries = Mutex<[IsleClient.LogEntry]>([])
        func outcomes(_ outcome: String) -> [IsleClient.LogEntry] { entries.withLock { $0.filter { $0.outcome == outcome } } }
    }

    /// The client's clock for the daily refresh.
    final class Clock: Sendable {
        let time = Mutex(Date())
        func advance(_ seconds: TimeInterval) { time.withLock { $0 = $0.addingTimeInterval(seconds) } }
    }

    /// A launched client on the fixture's server, with its own clock for the daily refresh.
    static func launch(_ f: ServerFixture, storage: String, log: Log, now: Clock? = nil) async throws -> (IsleClient, Task<Void, Never>) {
        let port = await f.server.port
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(port)")!, deviceKey: f.deviceKey, environment: nil, lifecycle: nil)
        c.firstRetry = 0.05
        c.maximumRetry = 0.4
        c.requestTimeout = 5
        c.log = { entry in log.entries.withLock { $0.append(entry) } }
        if let now { c.now = { now.time.withLock { $0 } } }
        let client = try IsleClient(configuration: c, storage: FileStorage(path: storage))
        return (client, Task { await client.run() })
    }

    /// Waits (with a deadline) until the activity is registered or refused, and answers which.
    static func settled(_ client: IsleClient, _ id: String) async throws -> IsleClient.RegistrationStatus {
        try await eventually("activity \(id) registered or refused") {
            switch await client.registrationStatus(of: id) {
            case .registered, .refused: true
            default: false
            }
        }
        return await client.registrationStatus(of: id)
    }

    static func store(_ f: ServerFixture) throws -> SQLiteStore { try SQLiteStore(path: f.databasePath) }

    static func hex(_ data: Data?) -> String? { data.map { $0.map { String(format: "%02x", $0) }.joined() } }

    /// Live activities on the server holding this token.
    static func rows(_ f: ServerFixture, installation: String, token: String?) async throws -> [ActivityRecord] {
        try await store(f).liveActivities(bundleID: Pizza.bundleID, installationID: installation).filter { $0.updateToken == token }
    }

    @Test("the retention sweep removed the installation: the next activity's 404 registers it again (same id, its push-to-start token back), then the activity")
    func prunedInstallation() async throws {
        try await ServerFixture.with { f in
            let kit = ClientLifeTests.kit(f)
            let storage = ClientTests.storagePath()
            let log = Log()
            let (client, runner) = try await Self.launch(f, storage: storage, log: log)
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            try await eventually("the installation registered") { let idle = await client.pendingReports == 0; let registered = await client.isInstallationRegistered; return idle && registered }
            let installation = await client.installationID
            let pushToStart = try #require(try await Self.store(f).installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens[Self.type])
            // 181 days on, the sweep removes it (it holds no live activity), push-to-start token and all.
            let pruned = try await Self.store(f).prune(now: Pizza.t0.addingTimeInterval(181 * 86_400), retention: Retention(), limit: 1000)
            #expect(pruned >= 1)
            #expect(try await Self.store(f).installation(bundleID: Pizza.bundleID, id: installation) == nil)
            // The person orders: the registration's 404 is not a refusal.
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            guard case .registered(let id) = try await Self.settled(client, activity.id) else {
                Issue.record("not registered: \(await client.registrationStatus(of: activity.id)); \(log.entries.withLock { $0 })")
                return
            }
            #expect(!log.outcomes("installation unknown").isEmpty)
            let back = try #require(try await Self.store(f).installation(bundleID: Pizza.bundleID, id: installation))
            #expect(back.pushToStartTokens[Self.type] == pushToStart, "the push-to-start token is on the server again")
            #expect(await client.installationID == installation, "same installation id, same secret")
            #expect(try await Self.rows(f, installation: installation, token: Self.hex(activity.pushToken)).map(\.id) == [id])
            #expect(await client.refusedReports.isEmpty)
            // The backend's update by the activity's server id reaches the phone.
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Anne Johnson")]).status == 202)
            try await f.waitForDevice("Anne") { d in d.activities.first { $0.id == activity.id }?.contentState["driverName"] == "Anne Johnson" }
            await client.stop()
            runner.cancel()
        }
    }

    @Test("restored from an older backup: a rotation's 404 registers the activity again with the new token; the daily refresh brings back one that nothing reported; never a second row")
    func restoredFromBackup() async throws {
        // The server comes back on the same port after each stop (the app's URL stays right).
        try await ClientTests.withRestartableServer { f, _ in
            let kit = ClientLifeTests.kit(f)
            let storage = ClientTests.storagePath()
            let log = Log()
            let now = Clock()
            let (client, runner) = try await Self.launch(f, storage: storage, log: log, now: now)
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            try await eventually("the installation registered") { let idle = await client.pendingReports == 0; let registered = await client.isInstallationRegistered; return idle && registered }
            let installation = await client.installationID
            // The operator's backup, taken now: the installation, no activity yet.
            await f.stop()
            // A stopped database is its file and its write-ahead log.
            let backup = f.databasePath + ".backup"
            for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: f.databasePath + suffix) {
                try FileManager.default.copyItem(atPath: f.databasePath + suffix, toPath: backup + suffix)
            }
            try await f.start()
            // Two orders, registered after the backup.
            let rotating = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            let quiet = try kit.request(attributes: ClientTests.PizzaAttributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "777"), content: ClientTests.state)
            for a in [rotating, quiet] {
                guard case .registered = try await Self.settled(client, a.id) else { Issue.record("not registered"); return }
            }
            // The disk fails; the operator restores the older backup: both activities are gone.
            await f.stop()
            for suffix in ["", "-wal", "-shm"] {
                try? FileManager.default.removeItem(atPath: f.databasePath + suffix)
                if FileManager.default.fileExists(atPath: backup + suffix) { try FileManager.default.copyItem(atPath: backup + suffix, toPath: f.databasePath + suffix) }
            }
            try await f.start()
            #expect(try await Self.store(f).liveActivities(bundleID: Pizza.bundleID, installationID: installation).isEmpty)
            // ActivityKit rotates one token: the rotation's 404 registers that activity again, with the new token.
            let rotated = try f.sim.world.rotateUpdateToken(activityID: rotating.id, on: f.device)
            do {
                try await eventually("the rotated activity registered again") { try await !Self.rows(f, installation: installation, token: rotated).isEmpty }
            } catch {
                Issue.record("\(error); the client's requests: \(log.entries.withLock { $0 }.suffix(12).map(\.description))")
                throw error
            }
            #expect(!log.outcomes("activity unknown").isEmpty)
            // The other reported nothing; the next day of use brings it back.
            #expect(try await Self.rows(f, installation: installation, token: Self.hex(quiet.pushToken)).isEmpty)
            now.advance(25 * 3600)
            await client.refresh()
            try await eventually("the quiet activity registered again") { try await !Self.rows(f, installation: installation, token: Self.hex(quiet.pushToken)).isEmpty }
            // Another day: everything is sent again, and the server answers the rows it has.
            now.advance(25 * 3600)
            await client.refresh()
            try await eventually("the second refresh sent") { await client.pendingReports == 0 }
            try await eventually("the refresh's registrations answered") {
                log.outcomes("sent").filter { $0.report == "register" }.count >= 5
            }
            #expect(try await Self.rows(f, installation: installation, token: rotated).count == 1)
            #expect(try await Self.rows(f, installation: installation, token: Self.hex(quiet.pushToken)).count == 1)
            #expect(try await Self.store(f).liveActivities(bundleID: Pizza.bundleID, installationID: installation).count == 2)
            // The backend reaches both by their (new) server ids.
            for (a, driver) in [(rotating, "Rita"), (quiet, "Quinn")] {
                let id = try #require(await client.serverID(of: a.id))
                #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state(driver)]).status == 202)
                try await f.waitForDevice(driver) { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == .string(driver) }
            }
            #expect(await client.refusedReports.isEmpty)
            await client.stop()
            runner.cancel()
        }
    }

    @Test("a server that answers 404 then 200 (for the installation, then for the activity): registered once, nothing refused, no duplicate")
    func notFoundThenOK() async throws {
        try await ServerFixture.with { f in
            let faults = f.faults
            let kit = ClientLifeTests.kit(f)
            let log = Log()
            let (client, runner) = try await Self.launch(f, storage: ClientTests.storagePath(), log: log)
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            try await eventually("the installation registered") { let idle = await client.pendingReports == 0; let registered = await client.isInstallationRegistered; return idle && registered }
            let installation = await client.installationID
            // The registration's lookup of the installation says "none" once.
            faults.arm(.installationMissing, times: 1)
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            guard case .registered(let id) = try await Self.settled(client, activity.id) else { Issue.record("not registered"); return }
            #expect(!log.outcomes("installation unknown").isEmpty)
            // The rotation's lookup of the activity says "none" once: registered again, the row it has answered.
            faults.arm(.activityMissing, times: 1)
            let rotated = try f.sim.world.rotateUpdateToken(activityID: activity.id, on: f.device)
            try await eventually("the rotation reached the server") { try await !Self.rows(f, installation: installation, token: rotated).isEmpty }
            try await eventually("nothing left to send") { await client.pendingReports == 0 }
            let live = try await Self.store(f).liveActivities(bundleID: Pizza.bundleID, installationID: installation)
            #expect(live.count == 1, "one activity, not two: \(live.map(\.id))")
            #expect(await client.serverID(of: activity.id) == live.first?.id)
            #expect(live.first?.id == id || !log.outcomes("activity unknown").isEmpty)
            #expect(await client.refusedReports.isEmpty)
            #expect(faults.injected >= 2)
            await client.stop()
            runner.cancel()
        }
    }

    @Test("the installation is sent again after a day of use though nothing changed, and not before")
    func dailyRefresh() async throws {
        try await ServerFixture.with { f in
            let kit = ClientLifeTests.kit(f)
            let log = Log()
            let now = Clock()
            let (client, runner) = try await Self.launch(f, storage: ClientTests.storagePath(), log: log, now: now)
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            try await eventually("the installation registered") { let idle = await client.pendingReports == 0; let registered = await client.isInstallationRegistered; return idle && registered }
            let sent = { @Sendable in log.entries.withLock { $0.filter { $0.report == "installation" && $0.outcome == "sent" }.count } }
            let first = sent()
            now.advance(23 * 3600)
            await client.refresh()
            try await eventually("idle") { await client.pendingReports == 0 }
            #expect(sent() == first, "nothing changed and less than a day passed: nothing sent")
            now.advance(2 * 3600)
            await client.refresh()
            try await eventually("sent again after a day") { sent() == first + 1 }
            await client.stop()
            runner.cancel()
        }
    }
}
