import Foundation
import IsleCommandLine
import IsleTesting
import Testing

/// The README's ```sh blocks must work as written: every `swift run isle …` line in them is run
/// here, in process, and must exit 0 — or N where the line ends with `# exits N`.
/// (```console blocks need a real Apple account and are not run.)
enum Readme {
    struct Example: Sendable, CustomTestStringConvertible {
        let arguments: [String]
        let expectedStatus: Int32
        var testDescription: String { arguments.prefix(3).joined(separator: " ") }
    }

    static var root: URL { Fixtures.directory.deletingLastPathComponent().deletingLastPathComponent() }

    static let examples: [Example] = {
        guard let text = try? String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8) else { return [] }
        var out: [Example] = []
        var inSh = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") {
                inSh = !inSh && line == "```sh"
                continue
            }
            guard inSh, line.hasPrefix("swift run isle ") else { continue }
            var command = String(line.dropFirst("swift run isle ".count))
            var status: Int32 = 0
            if let r = command.range(of: "  # exits ") {
                status = Int32(command[r.upperBound...].trimmingCharacters(in: .whitespaces)) ?? 1
                command = String(command[..<r.lowerBound])
            }
            out.append(Example(arguments: words(command), expectedStatus: status))
        }
        return out
    }()

    /// Splits like a POSIX shell for what the README uses: spaces, '…' and "…".
    static func words(_ s: String) -> [String] {
        var words: [String] = []
        var current = ""
        var quote: Character?
        var inWord = false
        for c in s {
            if let q = quote {
                if c == q { quote = nil } else { current.append(c) }
            } else if c == "'" || c == "\"" {
                quote = c
                inWord = true
            } else if c == " " {
                if inWord { words.append(current); current = ""; inWord = false }
            } else {
                current.append(c)
                inWord = true
            }
        }
        if inWord { words.append(current) }
        return words
    }
}

@Suite("README examples work as written")
struct ReadmeExamplesTests {
    @Test("the README has runnable examples")
    func found() {
        #expect(Readme.examples.count >= 6)
        #expect(Readme.words(#"a 'b c' "d e" f"#) == ["a", "b c", "d e", "f"])
    }

    @Test("each example exits as the README says", arguments: Readme.examples)
    func runs(_ example: Readme.Example) async throws {
        // Paths in the README are relative to the repository root.
        let args = example.arguments.map { arg in
            arg.hasPrefix("Examples/") || arg.hasPrefix("Tests/") ? Readme.root.appendingPathComponent(arg).path : arg
        }
        let r = await IsleCLI.capture(args)
        #expect(r.status == example.expectedStatus, "stdout: \(r.out)\nstderr: \(r.err)")
        if example.expectedStatus != 0 {
            #expect(!r.err.isEmpty || !r.out.isEmpty)
        }
    }
}
