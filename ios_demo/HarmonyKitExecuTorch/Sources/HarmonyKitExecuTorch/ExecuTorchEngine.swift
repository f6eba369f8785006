import ExecuTorch
import Foundation
import HarmonyKit

/// `InferenceEngine` on ExecuTorch: one tier's exported front-end `.pte` (XNNPACK, fp32 or int8),
/// whose `forward` takes the normalized image (1, C, H, W) and returns `(exit_logits, features)` in
/// the order the manifest's tier `outputs` lists them.
///
/// Written against the ExecuTorch Swift API (`import ExecuTorch`): `Module(filePath:loadMode:)`,
/// `load(_:)`, `execute(_:_:)`, `Tensor<Float>(_:shape:)`, `Value.tensor()`, `Tensor.scalars()`.
/// Verify the `.pte` against the manifest (`ManifestVerifier.verifyArtifact`) before creating this.
public final class ExecuTorchEngine: InferenceEngine, @unchecked Sendable {
    public let backend = Artifact.backendXNNPACK
    private let module: Module
    private let inputShape: [Int]
    private let logitsIndex: Int
    private let featuresIndex: Int
    private let lock = NSLock()

    /// Opens the program memory-mapped and loads `forward` now, so the first image does not pay for it.
    public init(modelPath: String, tier: TierEntry) throws {
        let positions = try FrontEndContract.check(tier)
        logitsIndex = positions.logits
        featuresIndex = positions.features
        inputShape = tier.input.shape
        module = Module(filePath: modelPath, loadMode: .mmap)
        do {
            try module.load(FrontEndContract.pteMethodName)
        } catch {
            throw InferenceError("ExecuTorch could not load \(FrontEndContract.pteMethodName) of \(modelPath): \(error)")
        }
    }

    public func run(_ input: [Float]) throws -> FrontEndOutput {
        try FrontEndContract.checkInput(input, shape: inputShape)
        lock.lock()
        defer { lock.unlock() }
        do {
            // No type annotation: it selects the `execute(_:_:) -> [Value]` overload, not the generic one.
            let outputs = try module.execute(FrontEndContract.pteMethodName, [Tensor<Float>(input, shape: inputShape)])
            guard outputs.count > max(logitsIndex, featuresIndex) else {
                throw InferenceError(
                    "the .pte returned \(outputs.count) outputs; the manifest lists \(FrontEndContract.logitsOutputName) and \(FrontEndContract.featuresOutputName)")
            }
            guard let logits: Tensor<Float> = outputs[logitsIndex].tensor(),
                  let features: Tensor<Float> = outputs[featuresIndex].tensor()
            else {
                throw InferenceError("the .pte outputs are not float32 tensors")
            }
            return try FrontEndOutput(
                exitLogits: logits.scalars(),
                features: FeatureTensor(values: features.scalars(), shape: features.shape))
        } catch let error as InferenceError {
            throw error
        } catch {
            throw InferenceError("ExecuTorch \(FrontEndContract.pteMethodName) failed: \(error)")
        }
    }
}
