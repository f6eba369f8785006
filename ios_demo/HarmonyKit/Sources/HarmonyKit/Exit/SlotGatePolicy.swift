import Foundation

/// Answer locally when a sample sits nearer one of this phone's own slots than any other slot
/// (ALGORITHM.md, section 8): the server ships one unit-norm prototype per slot; the phone knows which
/// slots are its own from the slot table its secret decodes. The score is the cosine to the nearest
/// own slot's prototype minus the cosine to the nearest other slot's, in [-2, 2]; a slot without a
/// prototype (an all-zero row) takes no part, and a side with none counts as -1. Non-finite logits or
/// features never exit locally. harmony-core's `SlotGatePolicy` is the same rule; both are checked
/// against tests/vectors/slot_gate_decisions.json.
public struct SlotGatePolicy: Sendable {
    /// As torch.nn.functional.normalize: a zero vector stays zero.
    static let minNorm = 1e-12

    public let prototypes: [[Float]]
    public let ownSlots: [Bool]
    public let threshold: Double
    private let present: [Bool]

    public init(prototypes: [[Float]], ownSlots: [Bool], threshold: Double) throws {
        guard !prototypes.isEmpty, prototypes.count == ownSlots.count else {
            throw HarmonyFormatError(
                "one own-slot flag per prototype, got \(prototypes.count) prototypes and \(ownSlots.count) flags")
        }
        guard threshold.isFinite else {
            throw HarmonyFormatError("the slot-gate threshold must be finite, got \(threshold)")
        }
        let dimension = prototypes[0].count
        guard dimension > 0, prototypes.allSatisfy({ $0.count == dimension }) else {
            throw HarmonyFormatError("every prototype has the same non-zero length")
        }
        guard prototypes.allSatisfy({ $0.allSatisfy(\.isFinite) }) else {
            throw HarmonyFormatError("a prototype holds a non-finite value")
        }
        self.prototypes = prototypes
        self.ownSlots = ownSlots
        self.threshold = threshold
        self.present = prototypes.map { row in row.contains { $0 != 0 } }
    }

    /// A gate from the manifest's slot prototypes file: an HMFT float32 tensor [slots, features]
    /// (`ModelStore.Installed.slotPrototypesData(for:)` checks it against the signed manifest first).
    public static func fromPrototypes(_ hmft: Data, ownSlots: [Bool], threshold: Double) throws -> SlotGatePolicy {
        let tensor = try FeatureTensor.decode(hmft)
        guard tensor.shape.count == 2 else {
            throw HarmonyFormatError("slot prototypes are [slots, features], got shape \(tensor.shape)")
        }
        let width = tensor.shape[1]
        let rows = (0..<tensor.shape[0]).map { slot in Array(tensor.values[slot * width..<(slot + 1) * width]) }
        return try SlotGatePolicy(prototypes: rows, ownSlots: ownSlots, threshold: threshold)
    }

    /// Which slots are this phone's: those whose decoded class is one the phone holds.
    public static func ownSlots(slotClasses: [String?], ownClassNames: Set<String>) -> [Bool] {
        slotClasses.map { name in name.map(ownClassNames.contains) ?? false }
    }

    /// The margin of one sample's interface features (flattened); NaN when a value is not finite.
    public func margin(_ features: [Float]) throws -> Double {
        guard features.count == prototypes[0].count else {
            throw HarmonyFormatError("features of length \(features.count), prototypes of \(prototypes[0].count)")
        }
        guard features.allSatisfy(\.isFinite) else { return .nan }
        let norm = max(features.reduce(0.0) { $0 + Double($1) * Double($1) }.squareRoot(), Self.minNorm)
        var own = -2.0
        var other = -2.0
        for slot in prototypes.indices where present[slot] {
            var cosine = 0.0
            for index in features.indices {
                cosine += Double(features[index]) / norm * Double(prototypes[slot][index])
            }
            if ownSlots[slot] {
                own = max(own, cosine)
            } else {
                other = max(other, cosine)
            }
        }
        return max(own, -1) - max(other, -1)
    }

    /// The verdict: the exit head's top output, with the margin as its confidence.
    public func decide(logits: [Float], features: [Float]) throws -> ExitDecision {
        guard !logits.isEmpty, logits.allSatisfy(\.isFinite) else {
            return ExitDecision(topOutput: -1, confidence: .nan, exitLocally: false)
        }
        let score = try self.margin(features)
        let top = Softmax.argmax(logits.map(Double.init))
        // non-finite features: no exit, the exit head's answer still named (as harmony-core, Python)
        return ExitDecision(topOutput: top, confidence: score, exitLocally: !score.isNaN && score >= threshold)
    }
}
