import Foundation

/// Exponential backoff with "equal jitter": retry n (0-based) waits d = min(maxDelay,
/// initialDelay * multiplier^n), drawn uniformly from [d/2, d]. A server's `Retry-After` (429, 503)
/// replaces the computed delay; if it asks for longer than `maxRetryAfter` the client gives up at
/// once (the phone keeps its local answer, the upload queue tries again later).
public struct RetryPolicy: Sendable, Equatable {
    /// 429 (rate limit), 502/504 (proxy), 503 (inference queue full / no back-end yet).
    public static let retryableStatuses: Set<Int> = [429, 502, 503, 504]

    public var maxAttempts: Int
    public var initialDelay: TimeInterval
    public var multiplier: Double
    public var maxDelay: TimeInterval
    public var maxRetryAfter: TimeInterval

    public init(maxAttempts: Int, initialDelay: TimeInterval, multiplier: Double, maxDelay: TimeInterval,
                maxRetryAfter: TimeInterval) {
        precondition(maxAttempts >= 1 && multiplier >= 1 && initialDelay >= 0 && maxDelay >= initialDelay,
                     "invalid retry policy")
        self.maxAttempts = maxAttempts
        self.initialDelay = initialDelay
        self.multiplier = multiplier
        self.maxDelay = maxDelay
        self.maxRetryAfter = maxRetryAfter
    }

    /// Uploads and enrolment: 4 attempts, 250 ms doubling up to 4 s, Retry-After honoured up to 30 s.
    public static let standard = RetryPolicy(
        maxAttempts: 4, initialDelay: 0.25, multiplier: 2, maxDelay: 4, maxRetryAfter: 30)
    /// Interactive inference: one quick retry, then the local answer stands.
    public static let interactive = RetryPolicy(
        maxAttempts: 2, initialDelay: 0.2, multiplier: 2, maxDelay: 0.4, maxRetryAfter: 2)
    public static let none = RetryPolicy(maxAttempts: 1, initialDelay: 0, multiplier: 1, maxDelay: 0, maxRetryAfter: 0)

    public static func isRetryable(status: Int) -> Bool {
        retryableStatuses.contains(status)
    }

    /// The wait before retry number `retry` (0 = the first retry); `unit` is uniform in [0, 1).
    public func backoff(retry: Int, unit: Double) -> TimeInterval {
        let ceiling = min(maxDelay, initialDelay * pow(multiplier, Double(retry)))
        return ceiling / 2 + unit * (ceiling / 2)
    }
}

/// Parses an HTTP `Retry-After` header (RFC 9110 10.2.3): delay-seconds or an HTTP-date.
public enum RetryAfter {
    public static func parse(_ value: String?, now: Date) -> TimeInterval? {
        guard let trimmed = value?.trimmingCharacters(in: .whitespaces), !trimmed.isEmpty else {
            return nil
        }
        if let seconds = Int(trimmed) {
            return seconds < 0 ? nil : TimeInterval(seconds)
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: trimmed) else {
            return nil
        }
        return max(0, date.timeIntervalSince(now))
    }
}

/// Waits between attempts; tests pass a recorder instead of sleeping.
public protocol Sleeper: Sendable {
    func sleep(seconds: TimeInterval) async throws
}

public struct TaskSleeper: Sleeper {
    public init() {}

    public func sleep(seconds: TimeInterval) async throws {
        try await Task.sleep(nanoseconds: UInt64(max(0, seconds) * 1_000_000_000))
    }
}

/// Retries network failures and the statuses that say "try again" (429, 502, 503, 504).
///
/// Every request this project sends is safe to repeat: inference has no side effect and uploads
/// carry a message id the server is idempotent on. Other statuses are returned at once (a 400 will
/// not get better). After the last attempt the last response is returned, or the last error thrown.
public struct RetryingTransport: HTTPTransport {
    public let base: any HTTPTransport
    public let policy: RetryPolicy
    private let sleeper: any Sleeper
    private let now: @Sendable () -> Date
    private let unitRandom: @Sendable () -> Double

    public init(
        _ base: any HTTPTransport, policy: RetryPolicy = .standard, sleeper: any Sleeper = TaskSleeper(),
        now: @escaping @Sendable () -> Date = { Date() },
        unitRandom: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }
    ) {
        self.base = base
        self.policy = policy
        self.sleeper = sleeper
        self.now = now
        self.unitRandom = unitRandom
    }

    /// Network failures worth another attempt (not cancellation, not a bad URL).
    public static func isRetryable(_ error: Error) -> Bool {
        guard let urlError = error as? URLError else { return false }
        switch urlError.code {
        case .timedOut, .networkConnectionLost, .cannotConnectToHost, .notConnectedToInternet,
             .cannotFindHost, .dnsLookupFailed, .badServerResponse, .secureConnectionFailed:
            return true
        default:
            return false
        }
    }

    public func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        var attempt = 1
        while true {
            let last = attempt >= policy.maxAttempts
            let wait: TimeInterval
            do {
                let response = try await base.send(request)
                if !RetryPolicy.isRetryable(status: response.status) || last {
                    return response
                }
                let retryAfter = RetryAfter.parse(response.header("Retry-After"), now: now())
                if let retryAfter, retryAfter > policy.maxRetryAfter {
                    return response // a long pause was asked for: the caller keeps its local answer
                }
                wait = retryAfter ?? policy.backoff(retry: attempt - 1, unit: unitRandom())
            } catch {
                if last || !Self.isRetryable(error) {
                    throw error
                }
                wait = policy.backoff(retry: attempt - 1, unit: unitRandom())
            }
            try await sleeper.sleep(seconds: wait)
            attempt += 1
        }
    }
}
