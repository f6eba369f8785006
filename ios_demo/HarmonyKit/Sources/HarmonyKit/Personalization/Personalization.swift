import Foundation

/// On-device personalization on iOS: the contract, not an implementation.
///
/// ExecuTorch's Swift/Objective-C bindings (extension/apple/ExecuTorch: `Module`, `Tensor`, `Value`,
/// ...) expose no training API, and the prebuilt ExecuTorch xcframeworks do not ship
/// extension/training. Training a tier's `personalize_train.pte` on iOS therefore needs an app-built
/// Objective-C++ bridge over ExecuTorch's C++ `executorch::extension::training::TrainingModule` and
/// its `SGD` optimizer, compiled from source into the app. HarmonyKit defines what such a bridge
/// must provide (`PersonalizationTraining`) and reads the manifest's `personalization` object
/// (`PersonalizationSpec`); the loop itself is harmony-core's `Personalizer` (Java) and
/// harmony_mobile/device/personalization.py (Python), which a Swift port follows step by step:
///
/// 1. run `frozenProgram` (an inference .pte, e.g. through HarmonyKitExecuTorch) over the phone's
///    own labelled samples: (exit_hidden, features);
/// 2. map each label to its exit position through the federation secret (`ExitDecoder`: the exit
///    head's outputs are in token order); never feed a class index;
/// 3. take steps of exactly `batch` rows through `PersonalizationTraining`, each followed by an SGD
///    step (the bridge's optimizer updates the parameters in place);
/// 4. answer with `frozenProgram` + `headProgram` fed the trained parameters, and recalibrate the
///    exit threshold on the phone's own validation samples with training's rule.
///
/// Until an app ships such a bridge, an iOS phone keeps the exported front-end and its threshold.
public enum PersonalizationSupport {
    /// Whether ExecuTorch's Swift/Objective-C bindings have a training API (checked against
    /// executorch 1.5's extension/apple; recheck on an upgrade).
    public static let executorchAppleBindingsHaveTraining = false
}

/// One program file of the export, checked like every artifact (sha256 and size) before loading.
public struct PersonalizationProgram: Decodable, Sendable, Equatable {
    public let path: String
    public let sha256: String
    public let size: Int
}

/// A tier's `personalization` object of the signed manifest (export/manifest.py `Personalization`).
public struct PersonalizationSpec: Decodable, Sendable, Equatable {
    public let scope: String
    public let frozenProgram: PersonalizationProgram
    public let trainingProgram: PersonalizationProgram
    public let headProgram: PersonalizationProgram
    public let method: String
    public let batch: Int
    public let hidden: Int
    public let parameterNames: [String]
    public let parameterShapes: [[Int]]
    public let labels: String
    public let loss: String
    public let optimizer: String
    public let learningRate: Double
    public let calibrationTarget: Double?

    enum CodingKeys: String, CodingKey {
        case scope, method, batch, hidden, labels, loss, optimizer
        case frozenProgram = "frozen_program"
        case trainingProgram = "training_program"
        case headProgram = "head_program"
        case parameterNames = "parameter_names"
        case parameterShapes = "parameter_shapes"
        case learningRate = "learning_rate"
        case calibrationTarget = "calibration_target"
    }

    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        labels = try c.decode(String.self, forKey: .labels)
        guard labels == "exit_positions" else {
            throw HarmonyFormatError("personalization labels must be exit_positions, the manifest says \(labels)")
        }
        scope = try c.decode(String.self, forKey: .scope)
        frozenProgram = try c.decode(PersonalizationProgram.self, forKey: .frozenProgram)
        trainingProgram = try c.decode(PersonalizationProgram.self, forKey: .trainingProgram)
        headProgram = try c.decode(PersonalizationProgram.self, forKey: .headProgram)
        method = try c.decode(String.self, forKey: .method)
        batch = try c.decode(Int.self, forKey: .batch)
        hidden = try c.decode(Int.self, forKey: .hidden)
        parameterNames = try c.decode([String].self, forKey: .parameterNames)
        parameterShapes = try c.decode([[Int]].self, forKey: .parameterShapes)
        loss = try c.decode(String.self, forKey: .loss)
        optimizer = try c.decode(String.self, forKey: .optimizer)
        learningRate = try c.decode(Double.self, forKey: .learningRate)
        calibrationTarget = try c.decodeIfPresent(Double.self, forKey: .calibrationTarget)
        guard batch >= 1, hidden >= 1, learningRate > 0, learningRate.isFinite else {
            throw HarmonyFormatError("personalization needs batch and hidden >= 1 and a finite learning rate > 0")
        }
    }
}

/// What an app's bridge over ExecuTorch's C++ TrainingModule + SGD provides (the Java app's
/// counterpart is harmony-core `personalization.TrainingModule` + `Optimizer`).
public protocol PersonalizationTraining: AnyObject {
    /// One forward-backward pass of `spec.method` on exactly `batch` rows (row-major exit_hidden and
    /// one exit position per row) followed by one SGD step; returns the loss before the step.
    func step(exitHidden: [Float], exitPositions: [Int64]) throws -> Float
    /// Copies of the current parameters, in `parameterNames` order (the head program's inputs).
    func parameters() throws -> [[Float]]
}
