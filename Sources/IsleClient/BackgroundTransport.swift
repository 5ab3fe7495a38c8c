public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// Sends requests for the app while it is suspended or not running: a background `URLSession` on
/// Apple platforms (``URLSessionBackgroundTransport``). When the app's background time runs out
/// with reports still unsent, IsleClient hands each lane's next request to it (the same bytes and
/// `Idempotency-Key`, so the server applies it once even if the app sends it again later) and
/// applies the answer when it comes, in this launch or a later one (docs/client.md).
public protocol BackgroundTransport: Sendable {
    /// Hands one request to the system. `key` comes back with its answer.
    func enqueue(_ request: URLRequest, body: Data, key: String) async
    /// The answers to requests handed over, in this launch or an earlier one, as they arrive.
    func answers() -> AsyncStream<BackgroundAnswer>
}

/// The answer to a request a ``BackgroundTransport`` sent.
public struct BackgroundAnswer: Sendable, Hashable {
    /// The `Idempotency-Key` the request was handed over with.
    public var key: String
    /// The HTTP status; nil when the system could not send it (the report stays queued).
    public var status: Int?
    public var body: Data
    public var retryAfter: String?
    public init(key: String, status: Int?, body: Data = Data(), retryAfter: String? = nil) {
        self.key = key
        self.status = status
        self.body = body
        self.retryAfter = retryAfter
    }
}

#if canImport(Darwin)
/// A background `URLSession` (Apple's "Downloading files in the background"): the system uploads
/// each request's body from a file and relaunches the app in the background with the answers.
///
/// Make one per app, with a stable identifier, before the client (``IsleClient/Configuration/backgroundTransport``),
/// and hand it the system's completion handler from
/// `application(_:handleEventsForBackgroundURLSession:completionHandler:)` with ``handleEvents(forBackgroundURLSession:completionHandler:)``.
public final class URLSessionBackgroundTransport: NSObject, BackgroundTransport, URLSessionDataDelegate, @unchecked Sendable {
    // @unchecked Sendable: URLSession calls the delegate on its own queue while the client calls
    // `enqueue` and `answers` from its actor; every mutable field below is read and written only
    // with `lock` held.
    private let lock = NSLock()
    private var bodies: [Int: Data] = [:]
    private var listeners: [UUID: AsyncStream<BackgroundAnswer>.Continuation] = [:]
    private var unheard: [BackgroundAnswer] = []
    private var finishEvents: (@Sendable () -> Void)?
    private var session: URLSession?
    public let identifier: String
    private let directory: URL

    public init(identifier: String = "dev.isle.client.background") {
        self.identifier = identifier
        directory = FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask)[0].appendingPathComponent("isle-client-background", isDirectory: true)
        super.init()
        let configuration = URLSessionConfiguration.background(withIdentifier: identifier)
        configuration.sessionSendsLaunchEvents = true
        configuration.isDiscretionary = false
        let session = URLSession(configuration: configuration, delegate: self, delegateQueue: nil)
        lock.withLock { self.session = session }
    }

    /// Call from `application(_:handleEventsForBackgroundURLSession:completionHandler:)` when the
    /// identifier is this transport's: the handler is called once the answers are delivered.
    public func handleEvents(forBackgroundURLSession identifier: String, completionHandler: @escaping @Sendable () -> Void) {
        guard identifier == self.identifier else { return }
        lock.withLock { finishEvents = completionHandler }
    }

    public func enqueue(_ request: URLRequest, body: Data, key: String) async {
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let file = directory.appendingPathComponent(key)
            try body.write(to: file, options: .atomic)
            guard let task = lock.withLock({ session })?.uploadTask(with: request, fromFile: file) else { return }
            task.taskDescription = key
            task.resume()
        } catch {
            // Not handed over: the report stays queued for the next launch.
        }
    }

    public func answers() -> AsyncStream<BackgroundAnswer> {
        let (stream, continuation) = AsyncStream.makeStream(of: BackgroundAnswer.self)
        let id = UUID()
        let early = lock.withLock { () -> [BackgroundAnswer] in
            listeners[id] = continuation
            defer { unheard.removeAll() }
            return unheard
        }
        for answer in early { continuation.yield(answer) }
        continuation.onTermination = { [weak self] _ in self?.lock.withLock { _ = self?.listeners.removeValue(forKey: id) } }
        return stream
    }

    public func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        lock.withLock { bodies[dataTask.taskIdentifier, default: Data()].append(data) }
    }

    public func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let key = task.taskDescription else { return }
        try? FileManager.default.removeItem(at: directory.appendingPathComponent(key))
        let http = task.response as? HTTPURLResponse
        let answer = lock.withLock { () -> BackgroundAnswer in
            let body = bodies.removeValue(forKey: task.taskIdentifier) ?? Data()
            return BackgroundAnswer(key: key, status: error == nil ? http?.statusCode : nil, body: body, retryAfter: http?.value(forHTTPHeaderField: "Retry-After"))
        }
        let heard = lock.withLock { () -> [AsyncStream<BackgroundAnswer>.Continuation] in
            if listeners.isEmpty { unheard.append(answer) }
            return Array(listeners.values)
        }
        for listener in heard { listener.yield(answer) }
    }

    public func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
        let handler = lock.withLock { () -> (@Sendable () -> Void)? in
            defer { finishEvents = nil }
            return finishEvents
        }
        // UIKit wants its handler called on the main queue.
        if let handler { DispatchQueue.main.async { handler() } }
    }
}
#endif
