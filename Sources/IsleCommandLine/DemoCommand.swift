import ArgumentParser
import Foundation
import IsleDemo
import Logging
import ServiceLifecycle
import Synchronization

struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Play a Live Activity scenario end to end: the Isle server, the fake APNs and a simulated iPhone, on this machine.",
        discussion: """
            Starts the server on a temporary SQLite file and the simulator with one iPhone that has the pizza-delivery app, then plays seven steps through the public HTTP APIs: \
            the app starts an activity, ETA updates and an alert, a priority-10 burst the server downgrades, a stale date, the end and dismissal, a second order started by \
            push-to-start, and a widget reload. Each step checks what the phone shows; the exit status is 1 if any does not hold. No network, no Apple account.
            """
    )

    @Option(help: ArgumentHelp("Virtual seconds per real second while time passes (600 = 10 minutes in a second).", valueName: "factor"))
    var speed: Double = 600
    @Flag(help: "Wait for Enter between steps.")
    var step = false
    @Flag(help: "Print JSON lines (one object per event) instead of the terminal view.")
    var json = false
    @Option(name: .customLong("keep-database"), help: ArgumentHelp("Keep the server's SQLite database at this path when the demo ends (e.g. to try isle db copy).", valueName: "path"))
    var keepDatabase: String?

    func validate() throws {
        guard speed > 0, speed.isFinite || speed == .infinity else { throw ValidationError("--speed must be a number above 0") }
    }

    func run() async throws {
        var options = Demo.Options()
        options.speed = speed
        options.step = step
        options.json = json
        options.keepDatabase = keepDatabase
        let context = CLIContext.current
        let demo = Demo(options: options, out: context.out, progress: { context.err("isle demo: \($0)") }, waitForEnter: { await Self.readEnter() })
        // Ctrl-C or SIGTERM stops the demo cleanly: its services shut down and its temporary
        // database is removed.
        var quiet = Logger(label: "isle.demo")
        quiet.logLevel = .critical
        let group = ServiceGroup(configuration: .init(services: [.init(service: DemoService(demo: demo), successTerminationBehavior: .gracefullyShutdownGroup)],
                                                           gracefulShutdownSignals: [.sigterm, .sigint], logger: quiet))
        do {
            try await group.run()
        } catch let failure as Demo.Failure {
            throw CLIError("demo failed at \(failure)")
        } catch is CancellationError {
            throw CLIError("demo interrupted", exitCode: 130)
        }
    }

    /// Waits for a line on standard input without holding a Swift concurrency thread; gives up
    /// when the task is cancelled (Ctrl-C).
    static func readEnter() async {
        let done = Mutex<CheckedContinuation<Void, Never>?>(nil)
        await withTaskCancellationHandler {
            await withCheckedContinuation { c in
                done.withLock { $0 = c }
                if Task.isCancelled { done.withLock { $0.take() }?.resume() }
                Thread.detachNewThread {
                    _ = readLine()
                    done.withLock { $0.take() }?.resume()
                }
            }
        } onCancel: {
            done.withLock { $0.take() }?.resume()
        }
    }
}

struct DemoService: Service {
    let demo: Demo
    func run() async throws {
        do {
            try await cancelWhenGracefulShutdown { try await demo.run() }
        } catch where Task.isShuttingDownGracefully {
            // Whatever the interrupted request threw, the reason is the signal.
            throw CancellationError()
        }
    }
}
