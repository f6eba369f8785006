#if canImport(CoreML)
import CoreML
import Foundation

/// `InferenceEngine` on Core ML: a tier's exported ML Program (`front_coreml-*.mlpackage`, input
/// `image` (1, C, H, W), outputs `exit_logits` and `features`).
///
/// An `.mlpackage` is compiled on the device with `MLModel.compileModel(at:)` (once: the compiled
/// `.mlmodelc` is cached under the artifact's digest), then loaded with `MLModel(contentsOf:)`.
/// Verify the package against the manifest (`ManifestVerifier.verifyArtifact`) before loading it.
public final class CoreMLEngine: InferenceEngine, @unchecked Sendable {
    public let backend = Artifact.backendCoreML
    public let model: MLModel
    private let inputShape: [Int]
    private let lock = NSLock()

    /// Wraps a loaded model after checking its input and outputs against the tier.
    public init(model: MLModel, tier: TierEntry) throws {
        try FrontEndContract.check(tier)
        let description = model.modelDescription
        guard description.inputDescriptionsByName[FrontEndContract.inputName] != nil else {
            throw InferenceError(
                "Core ML model has inputs \(description.inputDescriptionsByName.keys.sorted()), expected \(FrontEndContract.inputName)")
        }
        for name in [FrontEndContract.logitsOutputName, FrontEndContract.featuresOutputName]
        where description.outputDescriptionsByName[name] == nil {
            throw InferenceError(
                "Core ML model has outputs \(description.outputDescriptionsByName.keys.sorted()), expected \(name)")
        }
        self.model = model
        self.inputShape = tier.input.shape
    }

    /// Loads an already compiled model (`.mlmodelc`).
    public convenience init(
        compiledModelAt url: URL, tier: TierEntry, configuration: MLModelConfiguration = MLModelConfiguration()
    ) throws {
        try self.init(model: MLModel(contentsOf: url, configuration: configuration), tier: tier)
    }

    /// Compiles (or reuses the cached compilation of) an `.mlpackage` and loads it.
    ///
    /// - Parameters:
    ///   - mlpackage: the verified package inside the export directory
    ///   - digest: its manifest digest (names the cached `.mlmodelc`)
    ///   - cacheDirectory: e.g. Application Support/models
    public static func load(
        mlpackage: URL, digest: String, tier: TierEntry, cacheDirectory: URL,
        computeUnits: MLComputeUnits = .all
    ) async throws -> CoreMLEngine {
        let compiled = try await compiledModel(for: mlpackage, digest: digest, cacheDirectory: cacheDirectory)
        let configuration = MLModelConfiguration()
        configuration.computeUnits = computeUnits
        let model = try await MLModel.load(contentsOf: compiled, configuration: configuration)
        return try CoreMLEngine(model: model, tier: tier)
    }

    static func compiledModel(for mlpackage: URL, digest: String, cacheDirectory: URL) async throws -> URL {
        let fileManager = FileManager.default
        let target = cacheDirectory.appendingPathComponent("\(digest).mlmodelc", isDirectory: true)
        if fileManager.fileExists(atPath: target.path) {
            return target
        }
        let compiled = try await MLModel.compileModel(at: mlpackage)
        try fileManager.createDirectory(at: cacheDirectory, withIntermediateDirectories: true)
        do {
            try fileManager.moveItem(at: compiled, to: target)
        } catch {
            guard fileManager.fileExists(atPath: target.path) else { throw error }
            try? fileManager.removeItem(at: compiled) // another load won the race; keep its copy
        }
        return target
    }

    public func run(_ input: [Float]) throws -> FrontEndOutput {
        try FrontEndContract.checkInput(input, shape: inputShape)
        lock.lock()
        defer { lock.unlock() }
        do {
            let array = try MLMultiArray(shape: inputShape.map { NSNumber(value: $0) }, dataType: .float32)
            let strides = array.strides.map(\.intValue)
            array.withUnsafeMutableBufferPointer(ofType: Float.self) { buffer, _ in
                for (linear, value) in input.enumerated() {
                    buffer[Self.offset(ofLinearIndex: linear, shape: inputShape, strides: strides)] = value
                }
            }
            let provider = try MLDictionaryFeatureProvider(
                dictionary: [FrontEndContract.inputName: MLFeatureValue(multiArray: array)])
            let result = try model.prediction(from: provider)
            guard let logits = result.featureValue(for: FrontEndContract.logitsOutputName)?.multiArrayValue,
                  let features = result.featureValue(for: FrontEndContract.featuresOutputName)?.multiArrayValue
            else {
                throw InferenceError("Core ML prediction lacks \(FrontEndContract.logitsOutputName) or \(FrontEndContract.featuresOutputName)")
            }
            return try FrontEndOutput(
                exitLogits: Self.floats(logits),
                features: FeatureTensor(values: Self.floats(features), shape: features.shape.map(\.intValue)))
        } catch let error as InferenceError {
            throw error
        } catch {
            throw InferenceError("Core ML prediction failed: \(error)")
        }
    }

    /// The values of a multi-array in row-major order, whatever its data type and strides.
    static func floats(_ array: MLMultiArray) -> [Float] {
        let shape = array.shape.map(\.intValue)
        let strides = array.strides.map(\.intValue)
        let count = shape.reduce(1, *)
        switch array.dataType {
        case .float32:
            return array.withUnsafeBufferPointer(ofType: Float.self) { buffer in
                (0..<count).map { buffer[offset(ofLinearIndex: $0, shape: shape, strides: strides)] }
            }
        case .double:
            return array.withUnsafeBufferPointer(ofType: Double.self) { buffer in
                (0..<count).map { Float(buffer[offset(ofLinearIndex: $0, shape: shape, strides: strides)]) }
            }
        default: // float16 (an fp16 ML Program may return it), int32: through NSNumber
            return (0..<count).map { linear in
                array[multiIndex(ofLinearIndex: linear, shape: shape).map { NSNumber(value: $0) }].floatValue
            }
        }
    }

    static func multiIndex(ofLinearIndex linear: Int, shape: [Int]) -> [Int] {
        var rest = linear
        var index = [Int](repeating: 0, count: shape.count)
        for axis in shape.indices.reversed() {
            index[axis] = rest % shape[axis]
            rest /= shape[axis]
        }
        return index
    }

    static func offset(ofLinearIndex linear: Int, shape: [Int], strides: [Int]) -> Int {
        zip(multiIndex(ofLinearIndex: linear, shape: shape), strides).reduce(0) { $0 + $1.0 * $1.1 }
    }
}
#endif
