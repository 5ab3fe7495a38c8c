import Synchronization

/// A value shared between tasks in tests (a class, so escaping closures can hold it).
public final class Locked<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    public init(_ value: Value) { self.value = Mutex(value) }
    public func withLock<R>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
}
