import AsyncHTTPClient
import Foundation
public import IsleCore
public import Logging
import NIOCore
public import ServiceLifecycle

/// `isle serve --clock-url`: the server's clock follows an `isle sim --virtual-clock` (its control
/// API's `GET /clock`), so a whole stack's time rules (8-hour lives, renewals, stale dates,
/// retries) run on the simulated clock in end-to-end tests (docs/server.md, "A simulated clock").
/// Never for production: a server that cannot reach the simulator keeps the last time it read.
public final class SimulatorClock: Service {
    /// The server's clock: moved (never back) to the simulator's time as it is read.
    public let clock: ManualWallClock
    let url: String
    let http: HTTPClient
    let logger: Logger

    /// Reads the simulator's time once (it must answer) and starts following it.
    public static func follow(_ controlURL: String, logger: Logger) async throws -> SimulatorClock {
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let url = controlURL.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + "/clock"
        do {
            let start = try await read(http, url)
            return SimulatorClock(clock: ManualWallClock(start), url: url, http: http, logger: logger)
        } catch {
            try? await http.shutdown()
            throw error
        }
    }

    init(clock: ManualWallClock, url: String, http: HTTPClient, logger: Logger) {
        self.clock = clock
        self.url = url
        self.http = http
        self.logger = logger
    }

    struct Unreadable: Error, CustomStringConvertible {
        var description: String
    }

    static func read(_ http: HTTPClient, _ url: String) async throws -> Date {
        let response = try await http.execute(HTTPClientRequest(url: url), timeout: .seconds(5))
        let body = try await response.body.collect(upTo: 1 << 16)
        guard response.status == .ok, let unix = (try? JSONParser.parse(Array(buffer: body)))?["unix"]?.numberValue?.doubleValue else {
            throw Unreadable(description: "\(url) did not answer with the simulator's clock (isle sim's control API, GET /clock): \(response.status.code)")
        }
        return Date(timeIntervalSince1970: unix)
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            var failing = false
            while !Task.isCancelled {
                do {
                    let t = try await Self.read(self.http, self.url)
                    if t > self.clock.now { self.clock.set(t) }
                    if failing { self.logger.notice("the simulator's clock answers again") }
                    failing = false
                } catch {
                    if !failing { self.logger.warning("cannot read the simulator's clock; the server's time stands still", metadata: ["error": "\(error)"]) }
                    failing = true
                }
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
        try? await http.shutdown()
    }
}
