import CryptoKit
import Foundation

/// A signed manifest older than the installed one, or as old with other content: never installed.
public struct RollbackError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// What an update must pass: the installed manifest's version and the sha256 (hex) of its bytes.
public struct InstalledVersion: Codable, Sendable, Equatable {
    public let manifestVersion: Int
    public let manifestSha256: String

    public init(manifestVersion: Int, manifestSha256: String) {
        self.manifestVersion = manifestVersion
        self.manifestSha256 = manifestSha256
    }

    enum CodingKeys: String, CodingKey {
        case manifestVersion = "manifest_version"
        case manifestSha256 = "manifest_sha256"
    }
}

/// The rollback rule (export/manifest.py, manifest_version): a verified manifest replaces the
/// installed one only when its version is higher; the same version with the same bytes is the
/// installed manifest (nothing to do); anything older, or as old with other bytes, is refused.
/// Counterparts: harmony-core `update.ManifestUpdate`, harmony_mobile/device/manifest.py is_update.
public enum ManifestUpdate {
    public static func isUpdate(installed: InstalledVersion?, candidate: Manifest, candidateBytes: Data) throws -> Bool {
        guard let installed else { return true }
        if candidate.version > installed.manifestVersion { return true }
        if candidate.version == installed.manifestVersion, sha256(candidateBytes) == installed.manifestSha256 {
            return false
        }
        let what = candidate.version < installed.manifestVersion ? "older than" : "as old as, but different from,"
        throw RollbackError(
            "refusing manifest_version \(candidate.version) (\(candidate.modelVersion)): it is \(what) the installed "
                + "manifest_version \(installed.manifestVersion)")
    }

    public static func sha256(_ data: Data) -> String {
        Hex.encode(SHA256.hash(data: data))
    }
}

/// Which variant of a tier a phone runs: one that passed the export's quality checks first, then one
/// nothing checked (Core ML parity runs on a Mac), a failed one only when nothing else is there;
/// among equals, the app's preferred quantization. Counterparts: harmony-core `VariantChooser`,
/// harmony_mobile/device/manifest.py choose_artifact.
public enum VariantChooser {
    public static let verdictOrder = ["pass", "not_checked", "fail"]
    public static let pteQuantizations = ["int8", "fp32"]
    public static let coreMLQuantizations = ["coreml-fp16", "coreml-int8", "coreml-palette4"]

    public static func choose(_ tier: TierEntry, backend: String, preference: [String]) -> Artifact? {
        func rank(_ order: [String], _ value: String) -> Int { order.firstIndex(of: value) ?? order.count }
        return tier.artifacts.filter { $0.backend == backend }.min { a, b in
            let left = (rank(verdictOrder, a.verdict ?? "not_checked"), rank(preference, a.quantization))
            let right = (rank(verdictOrder, b.verdict ?? "not_checked"), rank(preference, b.quantization))
            return left < right
        }
    }
}
