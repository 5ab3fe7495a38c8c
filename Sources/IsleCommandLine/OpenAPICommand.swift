import ArgumentParser
import Foundation
import IsleWire

/// `isle openapi`: the server's OpenAPI document, made from the API's types (the one definition of
/// the wire), for a generator or a reader without a running server.
struct OpenAPICommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "openapi",
        abstract: "Print the API's OpenAPI 3.1 document (what isle serve serves at /openapi.json), or write it to a file.",
        discussion: "The document is made from the API's Swift types; docs/openapi.json is this output, and a test keeps them equal: after changing a type, run isle openapi --output docs/openapi.json."
    )

    @Option(help: ArgumentHelp("Write it to this file instead of standard output.", valueName: "path")) var output: String?

    func run() throws {
        let text = APIDocument.json.prettyJSONString + "\n"
        if let output {
            do { try Data(text.utf8).write(to: URL(fileURLWithPath: output)) } catch { throw CLIError("--output: cannot write \(output): \(error.localizedDescription)") }
        } else {
            print(text, terminator: "")
        }
    }
}
