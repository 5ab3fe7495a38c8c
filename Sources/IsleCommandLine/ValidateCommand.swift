import ArgumentParser
import Foundation
import IsleCore

struct ValidateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "validate",
        abstract: "Check a push payload the way APNs and the device will. Exit 1 on errors, 0 otherwise.",
        discussion: "Errors are what APNs rejects or the device silently drops; warnings are what probably does not do what you meant."
    )

    @Argument(help: "The payload file, or - for standard input.")
    var file: String

    @Option(help: ArgumentHelp("The attributes type's schema (JSON): check content-state and attributes against it.", valueName: "file"))
    var schema: String?

    @Option(name: .customLong("push-type"), help: "liveactivity (default), widgets, alert, background, …")
    var pushType: String = "liveactivity"

    @Flag(help: "A broadcast (channel) payload: update or end only, 5120 bytes.")
    var broadcast = false

    @Option(help: "The apns-priority it will be sent with (5 or 10).")
    var priority: Int?

    @Option(help: "Judge times against this moment instead of now (Unix seconds or ISO-8601).")
    var now: String?

    @Flag(help: "Print the report as JSON.")
    var json = false

    func run() async throws {
        guard let type = PushType(rawValue: pushType) else {
            throw CLIError("--push-type: \"\(pushType)\" is not an APNs push type; use one of \(PushType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        if broadcast, type != .liveactivity { throw CLIError("--broadcast applies to liveactivity payloads only") }
        let moment = try now.map { (n) throws(CLIError) in try Inputs.date(n, flag: "--now", now: CLIContext.current.now()) } ?? CLIContext.current.now()
        let options = PayloadValidator.Options(
            pushType: type, broadcast: broadcast, priority: try priority.map { (p) throws(CLIError) in try Inputs.priority(p) },
            schema: try Inputs.schema(schema), now: moment)
        let bytes = try Inputs.read(file, flag: "FILE")
        let report = PayloadValidator(options: options).validate(bytes: bytes)
        let name = file == "-" ? "stdin" : file

        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            var object = try JSONParser.parse(try encoder.encode(report)).objectValue!
            object["file"] = .string(name)
            object["valid"] = .bool(report.isValid)
            say(JSONValue.object(object).prettyJSONString)
        } else {
            let verdict = report.isValid ? "valid" : "invalid"
            let counts = [(report.errors.count, "error"), (report.warnings.count, "warning")]
                .filter { $0.0 > 0 }.map { "\($0.0) \($0.1)\($0.0 == 1 ? "" : "s")" }.joined(separator: ", ")
            say("\(name): \(verdict) (\(report.size) of \(report.sizeLimit) bytes)\(counts.isEmpty ? "" : ", \(counts)")")
            for issue in report.errors + report.warnings {
                say("  \(issue.severity.rawValue) [\(issue.code.rawValue)] \(issue.path): \(issue.message)")
                say("      fix: \(issue.fix)")
            }
        }
        if !report.isValid { throw ExitCode(1) }
    }
}
