public import Foundation
public import IsleAPNs

/// How `isle serve` runs. Built in one place from flags > environment > file > defaults.
public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 8080
    /// The SQLite file.
    public var databasePath = "./isle.sqlite"
    public var apns: APNsEnvironment = .sandbox
    /// Concurrent deliveries in flight.
    public var concurrency = 64
    /// How long a claimed job belongs to a worker before another may take it.
    public var lease: TimeInterval = 60
    /// Retries of transient failures (429, 5xx, connection): exponential backoff from
    /// `retryBase`, capped at `retryMaximumDelay`, with jitter, at most `maximumAttempts` sends.
    public var retryBase: TimeInterval = 1
    public var retryMaximumDelay: TimeInterval = 15 * 60
    public var maximumAttempts = 10
    /// Priority-10 pushes per activity per hour before Isle downgrades to 5 (the device's budget is
    /// not published; these are Isle's defaults), and with frequent updates on.
    public var hourlyHighPriorityBudget = 15
    public var frequentHourlyHighPriorityBudget = 120
    /// How long an idle worker waits before looking for due work again (scheduled pushes, retries).
    public var pollInterval: Duration = .milliseconds(200)
    public var requestTimeout: Duration = .seconds(30)

    public init() {}
}
