import Foundation
import Testing

/// The queue's procedure exists once, in IsleDelivery (`QueueProcedure`, `LaneBoard`): the stores'
/// code is SQL and row mapping. This reads the stores' sources for the calls that would mean a
/// store decides lanes, heads, superseding, stamping or an activity's state on its own again
/// (docs/server.md, "The queue: one procedure, thin drivers").
@Suite("The queue's shape")
struct QueueShapeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized

    /// Every Swift file under `Sources/<module>`, with its text.
    static func sources(_ module: String) throws -> [(path: String, text: String)] {
        let dir = root.appendingPathComponent("Sources/\(module)")
        guard let walker = FileManager.default.enumerator(at: dir, includingPropertiesForKeys: nil) else { return [] }
        var out: [(String, String)] = []
        for case let url as URL in walker where url.pathExtension == "swift" {
            out.append((url.path.replacingOccurrences(of: root.path + "/", with: ""), try String(contentsOf: url, encoding: .utf8)))
        }
        return out
    }

    @Test("no store calls the lane rules, the board, the claim's stamping or the completion's decision: only the procedure does")
    func storesHoldNoQueueRules() throws {
        let files = try Self.sources("IsleStore")
        #expect(files.count > 10, "the stores' sources were not found under \(Self.root.path)")
        // Naming a lane (`LanePlanner.lane`) is allowed: it is how a wake-up addresses one.
        let forbidden = ["LanePlanner.decide", "LanePlanner.place", "LanePlanner.join", "LanePlanner.isSupersedable", "LanePlanner.carriesContent",
                         "LaneBoard", "firstTimestamp(", "markClaimed(", "newAPNsID(", ".writes(currentToken:", "resolvingDeadToken", "Events.of("]
        var found: [String] = []
        for (path, text) in files {
            for (n, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let code = line.split(separator: "//", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
                for word in forbidden where code.contains(word) { found.append("\(path):\(n + 1): \(word)") }
            }
        }
        #expect(found.isEmpty, "queue rules in a store: \(found.joined(separator: "; "))")
    }

    @Test("the procedure is written once: every store reaches it through QueueBackedStore, and no store defines enqueue, claim or complete of its own")
    func oneProcedure() throws {
        let procedure = try Self.sources("IsleDelivery").filter { $0.path.hasSuffix("Queue/QueueProcedure.swift") }
        #expect(procedure.count == 1)
        // IsleStore.swift declares the protocols; DurableQueue.swift runs the procedure for every store.
        let stores = try Self.sources("IsleStore").filter { !$0.path.hasSuffix("/IsleStore.swift") && !$0.path.hasSuffix("/DurableQueue.swift") }
        #expect(stores.contains { $0.path.hasSuffix("SQLiteQueue.swift") } && stores.contains { $0.path.hasSuffix("PostgresQueue.swift") })
        for (path, text) in stores {
            for signature in ["func enqueue(", "func claim(", "func complete(", "func cancelJob("] where text.contains(signature) {
                Issue.record("\(path) defines \(signature)…")
            }
        }
    }
}
