import Foundation

/// What an exported front-end returns for one image: the exit head's logits (`exit_logits`, one per
/// class) and `features`, the interface tensor (1, 64, 8, 8) the server back-end takes.
public struct FrontEndOutput: Sendable {
    public let exitLogits: [Float]
    public let features: FeatureTensor

    public init(exitLogits: [Float], features: FeatureTensor) {
        self.exitLogits = exitLogits
        self.features = features
    }
}

/// The on-device runtime failed to load or run the model.
public struct InferenceError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// Runs a tier's front-end on one preprocessed input. `CoreMLEngine` (an `.mlpackage`, this package)
/// and `ExecuTorchEngine` (a `.pte`, package HarmonyKitExecuTorch) implement it, tests use a fake;
/// nothing else in HarmonyKit knows which runtime is underneath.
public protocol InferenceEngine: AnyObject, Sendable {
    /// "coreml" or "xnnpack", as the manifest's artifact `backend` names it.
    var backend: String { get }

    /// - Parameter input: one normalized image, NCHW without the batch (the tier's input shape).
    func run(_ input: [Float]) throws -> FrontEndOutput
}

/// The names and method an exported front-end has (export/coreml.py `INPUT_NAME`/`OUTPUT_NAMES`,
/// export/steps.py, the manifest's tier `input`/`outputs`). tests/test_ios_contract.py checks these
/// literals against the Python exporter, so a rename fails `make test` instead of on a phone.
public enum FrontEndContract {
    /// The Core ML input feature and the manifest's tier `input.name`.
    public static let inputName = "image"
    /// The exit head's logits, shape (1, classes).
    public static let logitsOutputName = "exit_logits"
    /// The interface features, shape (1, 64, 8, 8).
    public static let featuresOutputName = "features"
    /// The ExecuTorch method of a front-end `.pte`.
    public static let pteMethodName = "forward"
    /// The interface shape the server accepts (docs/PROTOCOL.md 4 and 6: N x 64 x 8 x 8).
    public static let interfaceShape = [64, 8, 8]

    /// Checks that a tier describes the front-end this contract expects; returns the output
    /// positions of (exit_logits, features) in the tier's `outputs`, which is the order a `.pte`
    /// returns them in.
    @discardableResult
    public static func check(_ tier: TierEntry) throws -> (logits: Int, features: Int) {
        guard tier.input.name == inputName else {
            throw InferenceError("tier \(tier.name): input is named \(tier.input.name), expected \(inputName)")
        }
        guard tier.input.shape.count == 4, tier.input.shape[0] == 1 else {
            throw InferenceError("tier \(tier.name): input shape \(tier.input.shape) is not (1, C, H, W)")
        }
        guard let logits = tier.outputs.firstIndex(where: { $0.name == logitsOutputName }),
              let features = tier.outputs.firstIndex(where: { $0.name == featuresOutputName })
        else {
            throw InferenceError(
                "tier \(tier.name): outputs \(tier.outputs.map(\.name)) lack \(logitsOutputName) or \(featuresOutputName)")
        }
        guard Array(tier.outputs[features].shape.dropFirst()) == tier.interfaceShape else {
            throw InferenceError("tier \(tier.name): features shape \(tier.outputs[features].shape) is not the interface shape")
        }
        return (logits, features)
    }

    /// Checks that `input` holds exactly one image of `shape`, the tier's input shape (1, C, H, W).
    public static func checkInput(_ input: [Float], shape: [Int]) throws {
        guard input.count == shape.reduce(1, *) else {
            throw InferenceError("input has \(input.count) values; the tier expects shape \(shape)")
        }
    }
}
