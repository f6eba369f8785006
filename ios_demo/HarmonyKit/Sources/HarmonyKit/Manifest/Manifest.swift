import Foundation

/// The export manifest (export/manifest.py, format 1), as the phone reads it. Obtain one only
/// through `ManifestVerifier`, which checks a signature over the exact bytes first.
///
/// Keys the app does not need (`run`, `reports`, an artifact's `extra`) are not decoded; unknown keys
/// are ignored, so a newer manifest with extra fields still loads.
public struct Manifest: Codable, Sendable, Equatable {
    public let format: Int
    public let kind: String
    public let modelVersion: String
    /// Monotonic: a phone refuses a manifest older than the one it runs (nil in manifests written
    /// before the field existed, which count as 0: `version`).
    public let manifestVersion: Int?
    public let createdAt: String
    public let numClasses: Int
    public let classNames: [String]
    public let interfaceShape: [Int]
    public let backend: BackendEntry
    public let tiers: [TierEntry]
    public let signature: SignatureInfo
    public let files: [FileEntry]
    /// The label epoch of the shipped back-end (nil in exports made before slot tables).
    public let labelEpoch: String?
    /// The shipped back-end's slot table, lowercase hex tokens (nil likewise).
    public let slotTable: [String]?
    /// What slot_margin tiers gate by (nil when no tier does; `ManifestVerifier` refuses a slot-gated
    /// tier without it).
    public let slotPrototypes: SlotPrototypesEntry?

    enum CodingKeys: String, CodingKey {
        case format
        case kind
        case modelVersion = "model_version"
        case manifestVersion = "manifest_version"
        case createdAt = "created_at"
        case numClasses = "num_classes"
        case classNames = "class_names"
        case interfaceShape = "interface_shape"
        case backend
        case tiers
        case signature
        case files
        case labelEpoch = "label_epoch"
        case slotTable = "slot_table"
        case slotPrototypes = "slot_prototypes"
    }

    /// The manifest_version, 0 for a manifest written before it existed.
    public var version: Int { manifestVersion ?? 0 }

    public func tier(named name: String) -> TierEntry? {
        tiers.first { $0.name == name }
    }

    public func file(at path: String) -> FileEntry? {
        files.first { $0.path == path }
    }
}

public struct FileEntry: Codable, Sendable, Equatable {
    public let path: String
    public let sha256: String
    public let size: Int64

    enum CodingKeys: String, CodingKey {
        case path
        case sha256
        case size
    }
}

/// The manifest's `slot_prototypes` (export/manifest.py `SlotPrototypes`): the server's slot
/// prototypes a slot_margin tier gates by (docs/PROTOCOL.md 3.5), one HMFT float32 tensor of `shape`
/// [slots, features] at `path`, served like the artifacts (`GET /v1/artifacts/<path>`).
public struct SlotPrototypesEntry: Codable, Sendable, Equatable {
    /// The `format` of the artifact view the model store fetches it as.
    public static let artifactFormat = "hmft"

    public let path: String
    public let sha256: String
    public let size: Int64
    /// [slots, features]: one row per slot of the slot table, as wide as the flattened interface.
    public let shape: [Int]

    enum CodingKeys: String, CodingKey {
        case path
        case sha256
        case size
        case shape
    }

    /// The file as an `Artifact` (a plain file of format "hmft"), so the model store fetches it through
    /// the same `ArtifactSource` as the front-end and checks it with the same digest and size rule.
    var artifact: Artifact {
        Artifact(
            backend: "", quantization: "", format: Self.artifactFormat, path: path, sha256: sha256, size: size,
            batch: [], parameters: nil, verdict: nil, failedChecks: nil)
    }
}

public struct TensorSpec: Codable, Sendable, Equatable {
    public let name: String
    /// At batch 1, batch first.
    public let shape: [Int]
    public let dtype: String

    enum CodingKeys: String, CodingKey {
        case name
        case shape
        case dtype
    }

    public var elementCount: Int { shape.reduce(1, *) }
}

/// value = (pixel * pixelScale - mean[c]) / std[c], per channel c, in NCHW order.
public struct Normalization: Codable, Sendable, Equatable {
    public let pixelScale: Double
    public let mean: [Double]
    public let std: [Double]

    enum CodingKeys: String, CodingKey {
        case pixelScale = "pixel_scale"
        case mean
        case std
    }

    /// 8-bit pixels, channel-major (C x H x W, no batch) -> the model's float input.
    public func apply(pixels: [UInt8], channels: Int) throws -> [Float] {
        guard channels == mean.count, channels == std.count, channels > 0, pixels.count % channels == 0 else {
            throw HarmonyFormatError(
                "\(pixels.count) pixel values do not fit \(channels) channel(s) of this normalization")
        }
        let plane = pixels.count / channels
        var out = [Float](repeating: 0, count: pixels.count)
        for channel in 0..<channels {
            for index in 0..<plane {
                let position = channel * plane + index
                out[position] = Float((Double(pixels[position]) * pixelScale - mean[channel]) / std[channel])
            }
        }
        return out
    }
}

/// One exported file of a tier: an ExecuTorch `.pte` or a Core ML `.mlpackage` directory.
public struct Artifact: Codable, Sendable, Equatable {
    public static let backendXNNPACK = "xnnpack"
    public static let backendCoreML = "coreml"
    public static let formatPTE = "pte"
    public static let formatMLPackage = "mlpackage"

    public let backend: String
    public let quantization: String
    public let format: String
    public let path: String
    /// File sha256, or the tree digest of an .mlpackage directory (export/manifest.py).
    public let sha256: String
    public let size: Int64
    /// (min, max) batch the artifact accepts.
    public let batch: [Int]
    public let parameters: Int?
    /// Whether the variant met the export's quality checks: "pass", "fail" or "not_checked" (nil in
    /// exports made before verdicts, read as "not_checked"); see `VariantChooser`.
    public let verdict: String?
    /// The checks it missed (verification.json names them).
    public let failedChecks: [String]?

    enum CodingKeys: String, CodingKey {
        case backend
        case quantization
        case format
        case path
        case sha256
        case size
        case batch
        case parameters
        case verdict
        case failedChecks = "failed_checks"
    }
}

/// The score a tier's threshold is on (docs/PROTOCOL.md 3.4-3.5).
public enum ExitRule: String, Sendable, CaseIterable {
    /// The exit head's maximum softmax probability: `ExitPolicy`.
    case maxSoftmax = "max_softmax"
    /// The sample's slot margin against the manifest's slot prototypes: `SlotGatePolicy`.
    case slotMargin = "slot_margin"
}

/// A device tier: the front-end a class of phones runs.
public struct TierEntry: Codable, Sendable, Equatable {
    public let name: String
    public let family: String
    public let splitDepth: Int
    public let width: Double
    public let input: TensorSpec
    public let normalization: Normalization
    public let outputs: [TensorSpec]
    public let classNames: [String]
    public let interfaceShape: [Int]
    /// Answer locally when the exit rule's score >= threshold.
    public let threshold: Double
    /// The exit rule as the manifest spells it: absent = "max_softmax"; "slot_margin" (PROTOCOL.md 3.5)
    /// gates by the manifest's slot prototypes. Read `exitRule`.
    public let exitRuleName: String?
    public let quantization: [String]
    public let backends: [String]
    public let latencyBudgetMs: Double
    public let artifacts: [Artifact]

    enum CodingKeys: String, CodingKey {
        case name
        case family
        case splitDepth = "split_depth"
        case width
        case input
        case normalization
        case outputs
        case classNames = "class_names"
        case interfaceShape = "interface_shape"
        case threshold
        case exitRuleName = "exit_rule"
        case quantization
        case backends
        case latencyBudgetMs = "latency_budget_ms"
        case artifacts
    }

    /// The score `threshold` is on; nil for a rule this app does not compute (`ManifestVerifier`
    /// refuses such a manifest, so a verified one never has it).
    public var exitRule: ExitRule? {
        ExitRule(rawValue: exitRuleName ?? ExitRule.maxSoftmax.rawValue)
    }

    /// The artifact for a backend and quantization, e.g. ("xnnpack", "int8").
    public func artifact(backend: String, quantization: String) -> Artifact? {
        artifacts.first { $0.backend == backend && $0.quantization == quantization }
    }

    /// A rough relative compute cost: stages run times width squared (channels scale both sides
    /// of a convolution). Used by `TierSelector`, the same rule as harmony-core's.
    public var relativeCost: Double {
        Double(splitDepth) * width * width
    }
}

/// The server back-end the tier front-ends feed (informational on the phone).
public struct BackendEntry: Codable, Sendable, Equatable {
    public let modelVersion: String
    public let interfaceShape: [Int]
    public let numClasses: Int
    public let input: TensorSpec
    public let outputs: [TensorSpec]

    enum CodingKeys: String, CodingKey {
        case modelVersion = "model_version"
        case interfaceShape = "interface_shape"
        case numClasses = "num_classes"
        case input
        case outputs
    }
}

public struct SignatureInfo: Codable, Sendable, Equatable {
    public let algorithm: String
    public let signedFile: String
    public let signatureFile: String
    public let publicKeyFile: String
    /// sha256 (hex) of the raw Ed25519 public key that signed the manifest.
    public let publicKeySha256: String
    /// The ECDSA P-256 signature beside the Ed25519 one, or nil for an Ed25519-only export.
    public let p256: P256SignatureInfo?

    enum CodingKeys: String, CodingKey {
        case algorithm
        case signedFile = "signed_file"
        case signatureFile = "signature_file"
        case publicKeyFile = "public_key_file"
        case publicKeySha256 = "public_key_sha256"
        case p256
    }
}

public struct P256SignatureInfo: Codable, Sendable, Equatable {
    public let algorithm: String
    public let signatureFile: String
    public let publicKeyFile: String
    /// sha256 (hex) of the P-256 key's X.509 SubjectPublicKeyInfo DER.
    public let publicKeySha256: String

    enum CodingKeys: String, CodingKey {
        case algorithm
        case signatureFile = "signature_file"
        case publicKeyFile = "public_key_file"
        case publicKeySha256 = "public_key_sha256"
    }
}
