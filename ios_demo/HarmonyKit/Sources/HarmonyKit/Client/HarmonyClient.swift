import Foundation

/// Where a low-confidence sample's features go: the server back-end, or a fake in tests.
public protocol FallbackServer: Sendable {
    func predict(_ features: FeatureTensor) async throws -> ServerPrediction
}

/// `FallbackServer` over HTTP: binary-body inference with the device's bearer token.
public struct HTTPFallbackServer: FallbackServer {
    public let client: HarmonyHTTPClient
    public let device: DeviceCredentials
    public let tier: String
    /// A registry version, or nil for the server's default.
    public let version: String?

    public init(client: HarmonyHTTPClient, device: DeviceCredentials, tier: String, version: String? = nil) {
        self.client = client
        self.device = device
        self.tier = tier
        self.version = version
    }

    public func predict(_ features: FeatureTensor) async throws -> ServerPrediction {
        let predictions = try await client.infer(features, device: device, tier: tier, version: version)
        guard let first = predictions.first else {
            throw ServerError(status: 200, detail: "inference returned no rows", retryAfter: nil)
        }
        return first
    }
}

/// The answer for one image and how it was reached.
public struct Classification: Sendable {
    public enum Source: String, Sendable {
        /// The exit head was confident: answered on the phone.
        case localExit
        /// The exit head was not confident: the server back-end answered.
        case server
        /// Not confident, but the server failed or is not configured: the phone's own best guess.
        case localAfterServerFailure
    }

    public let source: Source
    /// The answer; -1 only if the front-end produced non-finite logits and the server failed.
    public let predictedClass: Int
    /// Max softmax probability behind the answer.
    public let confidence: Double
    /// The early-exit decision (always computed).
    public let local: ExitDecision
    /// The server's prediction, or nil if it was not asked or failed.
    public let server: ServerPrediction?
    /// Why the fallback failed, or nil.
    public let serverError: String?
    public let localLatencyNanos: UInt64
    public let serverLatencyNanos: UInt64
    /// The interface features (kept so a user-confirmed label can be uploaded).
    public let features: FeatureTensor
}

/// The phone side of HARMONY inference: run the front-end; answer locally when the exit head is
/// confident (max softmax >= the tier's threshold), otherwise send the interface features to the
/// server back-end; if the server fails (network, 4xx/5xx, a long Retry-After), answer with the
/// local guess anyway. A classification therefore always has an answer.
public final class HarmonyClient: Sendable {
    public let engine: any InferenceEngine
    public let exitPolicy: ExitPolicy
    public let fallback: (any FallbackServer)?
    private let clock: @Sendable () -> UInt64

    /// - Parameter fallback: the server, or nil for local-only operation (offline, not enrolled).
    public init(
        engine: any InferenceEngine, exitPolicy: ExitPolicy, fallback: (any FallbackServer)?,
        clock: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }
    ) {
        self.engine = engine
        self.exitPolicy = exitPolicy
        self.fallback = fallback
        self.clock = clock
    }

    public func classify(_ input: [Float]) async throws -> Classification {
        let start = clock()
        let output = try engine.run(input)
        let local = exitPolicy.decide(output.exitLogits)
        let localNanos = clock() - start
        if local.exitLocally {
            return Classification(
                source: .localExit, predictedClass: local.predictedClass, confidence: local.confidence, local: local,
                server: nil, serverError: nil, localLatencyNanos: localNanos, serverLatencyNanos: 0,
                features: output.features)
        }
        guard let fallback else {
            return Self.localAfterFailure(local, "no fallback server configured", localNanos, 0, output)
        }
        let serverStart = clock()
        do {
            let server = try await fallback.predict(output.features)
            return Classification(
                source: .server, predictedClass: server.topClass, confidence: server.confidence, local: local,
                server: server, serverError: nil, localLatencyNanos: localNanos,
                serverLatencyNanos: clock() - serverStart, features: output.features)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            return Self.localAfterFailure(local, "\(error)", localNanos, clock() - serverStart, output)
        }
    }

    private static func localAfterFailure(
        _ local: ExitDecision, _ reason: String, _ localNanos: UInt64, _ serverNanos: UInt64, _ output: FrontEndOutput
    ) -> Classification {
        Classification(
            source: .localAfterServerFailure, predictedClass: local.predictedClass, confidence: local.confidence,
            local: local, server: nil, serverError: reason, localLatencyNanos: localNanos,
            serverLatencyNanos: serverNanos, features: output.features)
    }
}
