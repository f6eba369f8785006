import Foundation

/// The early-exit verdict for one sample.
public struct ExitDecision: Sendable, Equatable {
    /// argmax of the exit head's logits (first index on ties); -1 for non-finite logits. Exit heads
    /// are in token order, not class order: `ExitDecoder` names the class of an output.
    public let topOutput: Int
    /// The exit score: the maximum softmax probability (`ExitPolicy`) or the slot margin
    /// (`SlotGatePolicy`); NaN for non-finite inputs.
    public let confidence: Double
    /// true when the phone answers itself: confidence >= threshold.
    public let exitLocally: Bool
}

/// Numerically stable softmax over float logits, computed in double precision (as the Python
/// reference, algorithms/base.py `exit_confidence`, evaluates it for the golden vectors).
public enum Softmax {
    public static func probabilities(_ logits: [Float]) -> [Double] {
        precondition(!logits.isEmpty, "softmax of an empty logit vector")
        let maximum = logits.map(Double.init).max()!
        let exps = logits.map { Foundation.exp(Double($0) - maximum) }
        let sum = exps.reduce(0, +)
        return exps.map { $0 / sum }
    }

    /// Index of the largest value; the first one on ties (as torch.argmax and numpy.argmax).
    public static func argmax(_ values: [Double]) -> Int {
        var best = 0
        for index in values.indices.dropFirst() where values[index] > values[best] {
            best = index
        }
        return best
    }
}

/// Answer locally when the exit head's maximum softmax probability is at least the tier's threshold
/// (ALGORITHM.md, inference); otherwise fall back to the server. Logits containing NaN or infinity
/// never exit locally: a broken front-end must not answer.
public struct ExitPolicy: Sendable {
    public let threshold: Double

    public init(threshold: Double) throws {
        guard threshold > 0, threshold <= 1 else {
            throw HarmonyFormatError("the exit threshold must be in (0, 1], got \(threshold)")
        }
        self.threshold = threshold
    }

    public func decide(_ logits: [Float]) -> ExitDecision {
        guard !logits.isEmpty, logits.allSatisfy(\.isFinite) else {
            return ExitDecision(topOutput: -1, confidence: .nan, exitLocally: false)
        }
        let probabilities = Softmax.probabilities(logits)
        let best = Softmax.argmax(probabilities)
        let confidence = probabilities[best]
        return ExitDecision(topOutput: best, confidence: confidence, exitLocally: confidence >= threshold)
    }
}

/// Decides, for one sample, whether the phone answers with its exit head or falls back to the
/// server: `ExitPolicy` by the exit head's max softmax, `SlotGatePolicy` by the slot margin of the
/// sample's features (PROTOCOL.md 3.4-3.5). harmony-core's `exit.ExitGate` is the same interface.
public protocol ExitGate: Sendable {
    func decide(logits: [Float], features: [Float]) throws -> ExitDecision
}

extension ExitPolicy: ExitGate {
    public func decide(logits: [Float], features: [Float]) -> ExitDecision {
        decide(logits)
    }
}

extension SlotGatePolicy: ExitGate {}
