import IsleDelivery
import Synchronization

/// Calls that arrive while a batch is being written wait, then all go in the next batch together:
/// the group commit of both stores (SQLite's one writer; PostgreSQL's API writes and delivery results)
/// and the engine's batches of results.
///
/// No background task: a caller that finds no batch under way leads one (its own item first); when
/// its batch is done it hands the lead to the first waiter, if any, who takes the waiters behind it
/// into its batch. The leader's `run` writes the batch (every caller of
/// one batcher passes the same function): it gets the items in arrival order and answers one result
/// per item (an item can fail alone); when it throws, the whole batch failed with it.
///
/// With a `linger`, a leader waits up to that long for more items before it takes its batch,
/// unless the batch is full or `ready` says the items waiting are all that is coming (the engine's
/// results: every job in flight has its result waiting).
public final class Batcher<Item: Sendable, Output: Sendable>: Sendable {
    public typealias Run = @Sendable ([Item]) async throws -> [Result<Output, any Error>]

    private struct Pending: Sendable {
        let item: Item
        let continuation: CheckedContinuation<Role, Never>
    }
    private enum Role: Sendable { case lead, done(Result<Output, any Error>) }
    private struct State {
        var queue: [Pending] = []
        var leading = false
    }

    private let state = Mutex(State())
    /// At most this many items in one batch.
    let maximumBatch: Int
    let linger: Duration
    let ready: (@Sendable (Int) -> Bool)?

    public init(maximumBatch: Int, linger: Duration = .zero, ready: (@Sendable (_ waiting: Int) -> Bool)? = nil) {
        self.maximumBatch = max(1, maximumBatch)
        self.linger = linger
        self.ready = ready
    }

    /// Runs `item` in the next batch; returns when that batch is written.
    public func submit(_ item: Item, run: @escaping Run) async throws -> Output {
        let role = await withCheckedContinuation { (c: CheckedContinuation<Role, Never>) in
            let lead = state.withLock { s -> Bool in
                if !s.leading {
                    s.leading = true
                    return true
                }
                s.queue.append(Pending(item: item, continuation: c))
                return false
            }
            if lead { c.resume(returning: .lead) }
        }
        switch role {
        case .done(let r): return try r.get()
        case .lead: return try await lead(own: item, run: run).get()
        }
    }

    /// Writes one batch (the leader's item, then the waiters in order), then hands over.
    private func lead(own: Item, run: @escaping Run) async -> Result<Output, any Error> {
        if linger > .zero {
            let start = ContinuousClock.now
            while ContinuousClock.now - start < linger {
                let waiting = state.withLock { $0.queue.count } + 1
                if waiting >= maximumBatch || ready?(waiting) == true { break }
                try? await Task.sleep(for: .microseconds(250))
            }
        }
        let others = state.withLock { s -> [Pending] in
            let n = min(s.queue.count, maximumBatch - 1)
            defer { s.queue.removeFirst(n) }
            return Array(s.queue.prefix(n))
        }
        let items = [own] + others.map(\.item)
        // The batch holds other callers' items: the leader's cancellation must not cancel them, so
        // the batch runs in a task that does not inherit it (awaited at once).
        let results = await Task { () -> [Result<Output, any Error>] in
            do {
                let out = try await run(items)
                guard out.count == items.count else {
                    let e = StoreError(.unavailable, "a batch answered \(out.count) results for \(items.count) writes")
                    return items.map { _ in .failure(e) }
                }
                return out
            } catch {
                return items.map { _ in .failure(error) }
            }
        }.value
        for (p, r) in zip(others, results.dropFirst()) { p.continuation.resume(returning: .done(r)) }
        // The first waiter leads next, with the waiters behind it.
        let next = state.withLock { s -> Pending? in
            guard !s.queue.isEmpty else {
                s.leading = false
                return nil
            }
            return s.queue.removeFirst()
        }
        if let next { next.continuation.resume(returning: .lead) }
        return results[0]
    }
}
