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

/// Where a version's slot table comes from: the server's V2 model metadata, or a fake in tests.
public protocol SlotTableSource: Sendable {
    func slotTable(version: String) async throws -> SlotTable
}

/// `SlotTableSource` over HTTP (`GET /v2/models/{name}/versions/{version}`).
public struct HTTPSlotTableSource: SlotTableSource {
    public let client: HarmonyHTTPClient
    public let device: DeviceCredentials

    public init(client: HarmonyHTTPClient, device: DeviceCredentials) {
        self.client = client
        self.device = device
    }

    public func slotTable(version: String) async throws -> SlotTable {
        try await client.slotTable(version: version, device: device)
    }
}

/// Turns the server's top slot into one of this phone's classes (docs/ALGORITHM.md, "Inference"):
/// the token of every class name of the verified manifest under the table's label-epoch key is
/// looked up in the slot table. Each version's decoded table is kept; an answer from a version this
/// phone has no table for makes it fetch that version's table first.
public actor SlotDecoder {
    public let federationKey: FederationKey
    public let classNames: [String]
    private let source: any SlotTableSource
    private var classesByVersion = [String: [String?]]()

    public init(federationKey: FederationKey, classNames: [String], source: any SlotTableSource) {
        self.federationKey = federationKey
        self.classNames = classNames
        self.source = source
    }

    /// Records a table the phone already holds (enrolment response, manifest): no fetch needed.
    public func remember(version: String, table: SlotTable) throws {
        classesByVersion[version] = try decode(table)
    }

    /// The class name of each slot (nil for a slot none of this phone's classes has).
    public nonisolated func decode(_ table: SlotTable) throws -> [String?] {
        try federationKey.tokens(labelEpoch: table.labelEpoch)
            .slotClasses(classNames: classNames, slotTable: table.tokens)
    }

    /// The index in the manifest's class names of the prediction's top slot, or nil when that slot
    /// names none of this phone's classes (the caller then keeps its local answer).
    public func classIndex(of prediction: ServerPrediction) async throws -> Int? {
        let classes: [String?]
        if let known = classesByVersion[prediction.modelVersion] {
            classes = known
        } else {
            let table = try await source.slotTable(version: prediction.modelVersion)
            classes = try decode(table)
            classesByVersion[prediction.modelVersion] = classes
        }
        guard classes.indices.contains(prediction.topSlot), let name = classes[prediction.topSlot] else {
            return nil
        }
        return classNames.firstIndex(of: name)
    }
}

/// Names the outputs of the tier's exit head (docs/PROTOCOL.md 3, "Exit output -> class"). Exit heads
/// are trained and shipped in token order: output j is the class whose label token under the
/// manifest's label epoch is the j-th smallest (unsigned byte order, `LabelTokens.exitOrder`), so a
/// model that leaves a phone carries no class order and only a holder of the federation secret can
/// tell which output is which class. The early-exit rule (max softmax vs the threshold) does not
/// depend on it.
public struct ExitDecoder: Sendable {
    /// The manifest's `class_names`.
    public let classNames: [String]
    /// The class name of each output: entry j names output j.
    public let exitClasses: [String]
    private let classOfOutput: [Int]

    /// - Parameter labelEpoch: the manifest's `label_epoch` (the epoch the front-end was trained in).
    public init(federationKey: FederationKey, labelEpoch: String, classNames: [String]) throws {
        self.classNames = classNames
        exitClasses = try federationKey.tokens(labelEpoch: labelEpoch).exitOrder(classNames: classNames)
        classOfOutput = exitClasses.map { classNames.firstIndex(of: $0) ?? -1 }
    }

    /// The number of outputs the exit head has: one per class name.
    public var outputs: Int { classOfOutput.count }

    /// The index in the manifest's class names of exit output `output`; -1 for -1 (an `ExitDecision`
    /// over non-finite logits, which names no output).
    public func classIndex(output: Int) throws -> Int {
        if output == -1 { return -1 }
        guard classOfOutput.indices.contains(output) else {
            throw HarmonyFormatError("exit output \(output) of a head with \(outputs) outputs")
        }
        return classOfOutput[output]
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
        /// Not confident; the server answered with a slot that names none of this phone's classes.
        case localServerUnnamed
    }

    public let source: Source
    /// The answer; -1 only if the front-end produced non-finite logits and the server failed.
    public let predictedClass: Int
    /// The score behind the answer: the exit gate's (max softmax probability, or the slot margin of a
    /// slot-gated tier) for a local answer, the server's confidence for its answer.
    public let confidence: Double
    /// The early-exit decision (always computed); its top output is in token order.
    public let local: ExitDecision
    /// The class index of the exit head's answer (its top output named by `ExitDecoder`); -1 only for
    /// non-finite logits.
    public let localClass: Int
    /// The server's prediction, or nil if it was not asked or failed.
    public let server: ServerPrediction?
    /// Why the fallback failed or could not name a class, or nil.
    public let serverError: String?
    public let localLatencyNanos: UInt64
    public let serverLatencyNanos: UInt64
    /// The interface features (kept so a user-confirmed label can be uploaded).
    public let features: FeatureTensor
}

/// The phone side of HARMONY inference: run the front-end; answer locally when the exit gate says so
/// (`ExitPolicy`: max softmax >= the tier's threshold; `SlotGatePolicy`: the slot margin), otherwise send the interface features to the
/// server back-end; if the server fails (network, 4xx/5xx, a long Retry-After), answer with the
/// local guess anyway. The exit head's outputs are in token order; `ExitDecoder` names the class of
/// its top output. The server answers with a slot; `SlotDecoder` maps it to a class, and a slot that
/// names none of this phone's classes also leaves the local answer standing. A classification
/// therefore always has an answer.
public final class HarmonyClient: Sendable {
    public let engine: any InferenceEngine
    public let exitPolicy: any ExitGate
    public let exits: ExitDecoder
    public let fallback: (any FallbackServer)?
    public let slots: SlotDecoder?
    private let clock: @Sendable () -> UInt64

    /// - Parameters:
    ///   - exits: names the exit head's outputs (token order) with this phone's classes.
    ///   - fallback: the server, or nil for local-only operation (offline, not enrolled).
    ///   - slots: maps the server's slots to this phone's classes; required with a fallback server.
    public init(
        engine: any InferenceEngine, exitPolicy: any ExitGate, exits: ExitDecoder, fallback: (any FallbackServer)?,
        slots: SlotDecoder?, clock: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }
    ) throws {
        if fallback != nil, slots == nil {
            throw HarmonyFormatError("a fallback server answers in slots: pass a SlotDecoder")
        }
        self.engine = engine
        self.exitPolicy = exitPolicy
        self.exits = exits
        self.fallback = fallback
        self.slots = slots
        self.clock = clock
    }

    public func classify(_ input: [Float]) async throws -> Classification {
        let start = clock()
        let output = try engine.run(input)
        guard output.exitLogits.count == exits.outputs else {
            throw InferenceError(
                "the exit head returned \(output.exitLogits.count) logits; the manifest names \(exits.outputs) classes")
        }
        let local = try exitPolicy.decide(logits: output.exitLogits, features: output.features.values)
        let localClass = try exits.classIndex(output: local.topOutput)
        let localNanos = clock() - start
        if local.exitLocally {
            return Classification(
                source: .localExit, predictedClass: localClass, confidence: local.confidence, local: local,
                localClass: localClass, server: nil, serverError: nil, localLatencyNanos: localNanos,
                serverLatencyNanos: 0, features: output.features)
        }
        guard let fallback, let slots else {
            return Self.localAfterFailure(local, localClass, "no fallback server configured", localNanos, 0, output)
        }
        let serverStart = clock()
        do {
            let server = try await fallback.predict(output.features)
            guard let serverClass = try await slots.classIndex(of: server) else {
                return Classification(
                    source: .localServerUnnamed, predictedClass: localClass, confidence: local.confidence,
                    local: local, localClass: localClass, server: server,
                    serverError: "the server's slot \(server.topSlot) (version \(server.modelVersion)) names none of "
                        + "this phone's classes",
                    localLatencyNanos: localNanos, serverLatencyNanos: clock() - serverStart, features: output.features)
            }
            return Classification(
                source: .server, predictedClass: serverClass, confidence: server.confidence, local: local,
                localClass: localClass, server: server, serverError: nil, localLatencyNanos: localNanos,
                serverLatencyNanos: clock() - serverStart, features: output.features)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            return Self.localAfterFailure(local, localClass, "\(error)", localNanos, clock() - serverStart, output)
        }
    }

    private static func localAfterFailure(
        _ local: ExitDecision, _ localClass: Int, _ reason: String, _ localNanos: UInt64, _ serverNanos: UInt64,
        _ output: FrontEndOutput
    ) -> Classification {
        Classification(
            source: .localAfterServerFailure, predictedClass: localClass, confidence: local.confidence,
            local: local, localClass: localClass, server: nil, serverError: reason, localLatencyNanos: localNanos,
            serverLatencyNanos: serverNanos, features: output.features)
    }
}
