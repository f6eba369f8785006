import Foundation
import HarmonyKit
import HarmonyKitExecuTorch

/// The export bundled with the app (the `Export` folder reference: manifest.json, manifest.sig and
/// the tiers' .pte / .mlpackage files, copied verbatim) and the key that must have signed it
/// (`Resources/pinned_signing_key.pub`, the export's signing_key.pub).
enum ModelStore {
    static let coreMLPreference = ["coreml-fp16", "coreml-int8", "coreml-palette4"]
    /// int8 first: smaller and faster on phones; fp32 when a tier was exported without int8.
    static let executorchPreference = ["int8", "fp32"]

    /// Resources/server_url.txt (written by `harmony export-app ios`), else the simulator's view of the Mac.
    static var bundledServerURL: String {
        guard let url = Bundle.main.url(forResource: "server_url", withExtension: "txt"),
              let text = try? String(contentsOf: url, encoding: .utf8)
        else { return "http://localhost:8000" }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static var exportDirectory: URL? {
        Bundle.main.url(forResource: "Export", withExtension: nil)
    }

    /// Verifies the bundled manifest with the pinned key (signature over the exact bytes, key hash).
    static func loadManifest() throws -> Manifest {
        let verifier = try pinnedVerifier()
        guard let directory = exportDirectory,
              FileManager.default.fileExists(atPath: directory.appendingPathComponent(ManifestVerifier.manifestFile).path)
        else {
            throw ManifestError("no export bundled: copy `harmony export` output into ios_demo/HarmonyDemo/Export/")
        }
        return try verifier.verifyDirectory(directory)
    }

    /// The verifier for the key pinned in the app bundle.
    static func pinnedVerifier() throws -> ManifestVerifier {
        guard let keyURL = Bundle.main.url(forResource: "pinned_signing_key", withExtension: "pub") else {
            throw ManifestError(
                "no pinned key: copy the export's signing_key.pub to HarmonyDemo/Resources/pinned_signing_key.pub")
        }
        return try ManifestVerifier(publicKeyFile: String(decoding: Data(contentsOf: keyURL), as: UTF8.self))
    }

    /// The artifact a tier runs on a backend, preferring the smaller variants.
    static func artifact(of tier: TierEntry, backend: String) -> Artifact? {
        let order = backend == Artifact.backendCoreML ? coreMLPreference : executorchPreference
        for quantization in order {
            if let artifact = tier.artifact(backend: backend, quantization: quantization) {
                return artifact
            }
        }
        return tier.artifacts.first { $0.backend == backend }
    }

    /// Verifies the artifact's digest and size, then loads it with the right engine. Call off the main thread.
    static func makeEngine(tier: TierEntry, artifact: Artifact) async throws -> any InferenceEngine {
        guard let directory = exportDirectory else { throw ManifestError("no export bundled") }
        try ManifestVerifier.verifyArtifact(artifact, in: directory)
        let url = directory.appendingPathComponent(artifact.path)
        switch artifact.backend {
        case Artifact.backendCoreML:
            let cache = try FileManager.default.url(
                for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true
            ).appendingPathComponent("compiled-models", isDirectory: true)
            return try await CoreMLEngine.load(mlpackage: url, digest: artifact.sha256, tier: tier, cacheDirectory: cache)
        case Artifact.backendXNNPACK:
            return try ExecuTorchEngine(modelPath: url.path, tier: tier)
        default:
            throw InferenceError("backend \(artifact.backend) is not supported on iOS")
        }
    }
}

/// Demo provisioning of the label-token key: Resources/provisioning.local.json (written by
/// `harmony export-app`, git-ignored) or else the placeholder Resources/provisioning.json. A real
/// deployment gets it from MDM / managed app configuration; the server never holds it
/// (docs/PROTOCOL.md 2-3).
enum Provisioning {
    static func federationKey() throws -> FederationKey {
        struct File: Decodable {
            let federation_secret_hex: String
        }
        guard let url = Bundle.main.url(forResource: "provisioning.local", withExtension: "json")
            ?? Bundle.main.url(forResource: "provisioning", withExtension: "json")
        else {
            throw HarmonyFormatError("provisioning.json is missing from the app bundle")
        }
        let file = try JSONDecoder().decode(File.self, from: Data(contentsOf: url))
        return try FederationKey(secret: Hex.decode(file.federation_secret_hex))
    }
}
