import Foundation
import IsleDelivery
import IsleStore
import Synchronization

/// Workers' results, committed in batches: one transaction of set-based statements for many
/// results (``JobDelivery/complete(_:)-(JobCompletion)``'s batch form), instead of one per result.
///
/// A result waits while more are on their way: the batch is written once it holds `maximum`
/// results, once every job in flight has its result waiting (nothing more is coming), or `linger`
/// after its first result arrived, whichever is first. One batch is written at a time; results
/// that arrive meanwhile form the next.
final class CompletionBatches: Sendable {
    private struct Waiting: Sendable {
        var completion: JobCompletion
        var done: CheckedContinuation<Bool?, Never>
    }
    private struct State {
        var waiting: [Waiting] = []
        var leading = false
    }
    private let state = Mutex(State())
    let maximum: Int
    let linger: Duration

    init(maximum: Int, linger: Duration = .milliseconds(2)) {
        self.maximum = max(1, maximum)
        self.linger = linger
    }

    /// Waits until `completion` is written with its batch by `write`: its result (false: the claim
    /// was lost), or nil when the batch could not be written before the engine stopped.
    /// `inFlight` is how many jobs are being worked on now.
    func commit(_ completion: JobCompletion, inFlight: @escaping @Sendable () -> Int,
                write: @escaping @Sendable ([JobCompletion]) async -> [Bool]?) async -> Bool? {
        await withCheckedContinuation { (c: CheckedContinuation<Bool?, Never>) in
            let lead = state.withLock { s -> Bool in
                s.waiting.append(Waiting(completion: completion, done: c))
                guard !s.leading else { return false }
                s.leading = true
                return true
            }
            guard lead else { return }
            // The batch runs in a task of its own: the results it holds are other workers' too.
            Task { await self.lead(inFlight: inFlight, write: write) }
        }
    }

    private func lead(inFlight: @escaping @Sendable () -> Int, write: @escaping @Sendable ([JobCompletion]) async -> [Bool]?) async {
        while true {
            let start = ContinuousClock.now
            // Linger while more results are on their way.
            while ContinuousClock.now - start < linger {
                let count = state.withLock { $0.waiting.count }
                if count >= maximum || count >= inFlight() { break }
                try? await Task.sleep(for: .microseconds(250))
            }
            let batch = state.withLock { s -> [Waiting] in
                let n = min(s.waiting.count, maximum)
                defer { s.waiting.removeFirst(n) }
                return Array(s.waiting.prefix(n))
            }
            let results = await write(batch.map(\.completion))
            for (n, w) in batch.enumerated() { w.done.resume(returning: results?[n]) }
            let more = state.withLock { s -> Bool in
                if s.waiting.isEmpty { s.leading = false }
                return !s.waiting.isEmpty
            }
            if !more { return }
        }
    }
}
