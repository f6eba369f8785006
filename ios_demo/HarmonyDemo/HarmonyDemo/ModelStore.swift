import Foundation
import HarmonyKit
import HarmonyKitExecuTorch
import Security

/// The export this phone runs, kept in HarmonyKit's `ModelStore` (Application Support/model-store):
/// the export bundled with the app (the `Export` folder reference) on first start, then newer signed
/// exports from the server. Every install verifies the manifest with the pinned key
/// (`Resources/pinned_signing_key.pub`, written by `harmony export-app ios --pinned-key`), refuses a
/// manifest older than the installed one (a rollback: a bundled export older than an update too),
/// checks every artifact, and switches atomically.
enum ModelFiles {
    /// The backends this app runs, and the artifacts an install copies for each runnable tier.
    static let backends = [Artifact.backendCoreML, Artifact.backendXNNPACK]

    /// Resources/server_url.txt (written by `harmony export-app ios`), else the simulator's view of the Mac.
    static var bundledServerURL: String {
        guard let url = Bundle.main.url(forResource: "server_url", withExtension: "txt"),
              let text = try? String(contentsOf: url, encoding: .utf8)
        else { return "http://localhost:8000" }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static var bundledExport: URL? {
        Bundle.main.url(forResource: "Export", withExtension: nil)
    }

    /// The verifier for the key pinned in the app bundle.
    static func pinnedVerifier() throws -> ManifestVerifier {
        guard let keyURL = Bundle.main.url(forResource: "pinned_signing_key", withExtension: "pub") else {
            throw ManifestError("no pinned key: run `harmony export-app ios --pinned-key <your signing_key.pub>`")
        }
        return try ManifestVerifier(publicKeyFile: String(decoding: Data(contentsOf: keyURL), as: UTF8.self))
    }

    static func store() throws -> ModelStore {
        let root = try FileManager.default.url(
            for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true
        ).appendingPathComponent("model-store", isDirectory: true)
        return ModelStore(root: root, verifier: try pinnedVerifier())
    }

    /// Every artifact this app can run, of every tier (the user may pick another tier).
    static func wanted(_ manifest: Manifest) -> [Artifact] {
        manifest.tiers.flatMap { tier in tier.artifacts.filter { backends.contains($0.backend) } }
    }

    /// Installs the bundled export unless a newer one is installed; returns the installed export.
    static func installBundled() throws -> ModelStore.Installed {
        let store = try store()
        guard let bundled = bundledExport,
              FileManager.default.fileExists(atPath: bundled.appendingPathComponent(ManifestVerifier.manifestFile).path)
        else {
            throw ManifestError("no export bundled: run `harmony export-app ios` (ios_demo/HarmonyDemo/Export/)")
        }
        do {
            _ = try store.install(
                manifestBytes: Data(contentsOf: bundled.appendingPathComponent(ManifestVerifier.manifestFile)),
                signatureFile: Data(contentsOf: bundled.appendingPathComponent(store.verifier.signatureFileName)),
                source: { artifact, _, destination in
                    try FileManager.default.copyItem(at: bundled.appendingPathComponent(artifact.path), to: destination)
                },
                wanted: wanted)
        } catch is RollbackError {
            // The installed export is newer than the one in the app bundle: keep it.
        }
        guard let installed = try store.current() else { throw ManifestError("no export installed") }
        return installed
    }

    /// The server's signed manifest; when newer, its artifacts from `artifactBase` (by default the
    /// server's `/v1/artifacts`, asked with the device token), verified, then switched to. nil: the
    /// installed export is current.
    static func update(server: URL, device: DeviceCredentials, artifactBase: URL) async throws -> ModelStore.Installed? {
        let (manifest, signature) = try await HarmonyHTTPClient(baseURL: server).manifest(device: device)
        return try await Task.detached {
            try store().install(
                manifestBytes: manifest, signatureFile: signature,
                source: { artifact, manifest, destination in
                    try download(artifact, of: manifest, from: artifactBase, token: device.token, to: destination)
                },
                wanted: wanted)
        }.value
    }

    /// A .pte file, or an .mlpackage directory file by file (the manifest lists each of its files).
    private static func download(
        _ artifact: Artifact, of manifest: Manifest, from base: URL, token: String, to destination: URL
    ) throws {
        guard artifact.format == Artifact.formatMLPackage else {
            try fetch(base.appendingPathComponent(artifact.path), token: token).write(to: destination)
            return
        }
        for file in manifest.files where file.path.hasPrefix(artifact.path + "/") {
            let target = destination.appendingPathComponent(String(file.path.dropFirst(artifact.path.count + 1)))
            try FileManager.default.createDirectory(at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
            try fetch(base.appendingPathComponent(file.path), token: token).write(to: target)
        }
    }

    /// One GET with the device token (the server's /v1/artifacts needs it, as its manifest does);
    /// blocking, like the install it runs in (off the main thread). A non-200 answer throws its sentence.
    private static func fetch(_ url: URL, token: String) throws -> Data {
        var request = URLRequest(url: url)
        request.setValue("Bearer " + token, forHTTPHeaderField: "Authorization")
        let answer = Answer(ManifestError("no answer from \(url.path)"))
        URLSession.shared.dataTask(with: request) { data, response, error in
            defer { answer.done.signal() }
            let status = (response as? HTTPURLResponse)?.statusCode ?? 0
            if let error {
                answer.result = .failure(error)
            } else if status != 200 {
                let detail = HarmonyHTTPClient.errorMessage(from: data ?? Data())
                answer.result = .failure(ManifestError("GET \(url.path): \(status) \(detail)"))
            } else {
                answer.result = .success(data ?? Data())
            }
        }.resume()
        answer.done.wait()
        return try answer.result.get()
    }

    /// The completion handler's result, handed to the waiting thread: written once, before `done`
    /// is signalled, and read only after the wait, hence unchecked Sendable.
    private final class Answer: @unchecked Sendable {
        let done = DispatchSemaphore(value: 0)
        var result: Result<Data, Error>

        init(_ pending: Error) {
            result = .failure(pending)
        }
    }

    /// The variant a tier runs on a backend: one that passed the export's checks first.
    static func artifact(of tier: TierEntry, backend: String) -> Artifact? {
        let preference = backend == Artifact.backendCoreML ? VariantChooser.coreMLQuantizations : VariantChooser.pteQuantizations
        return VariantChooser.choose(tier, backend: backend, preference: preference)
    }

    /// Verifies the artifact's digest and size, then loads it with the right engine. Call off the main thread.
    static func makeEngine(tier: TierEntry, artifact: Artifact, in directory: URL) async throws -> any InferenceEngine {
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

/// The label-token key, provisioned at run time and kept in the Keychain: from a
/// `harmony-mobile://provision/v1#...` link (a QR code the camera app opens) or managed app config
/// (`provisioning_payload` in `com.apple.configuration.managed`), docs/PROVISIONING.md. Nothing
/// secret ships in the app; without a provisioned secret the app tokenizes and decodes nothing.
enum ProvisioningStore {
    private static let item = KeychainItem(account: "federation-secret")

    /// The payload an MDM set as managed app config, if any.
    static var managedPayload: String? {
        let managed = UserDefaults.standard.dictionary(forKey: "com.apple.configuration.managed")
        return (managed?[ProvisioningPayload.managedConfigKey] as? String).flatMap { $0.isEmpty ? nil : $0 }
    }

    static func federationKey() -> FederationKey? {
        item.read().flatMap { try? FederationKey(secret: $0) }
    }

    /// Stores a parsed payload's secret, its own classes (or clears the stored ones) and its
    /// enrolment, if it carries one.
    static func apply(_ payload: ProvisioningPayload) throws {
        try item.write(payload.federationSecret)
        try OwnClassesStore.save(payload.ownClasses)
        if let device = payload.device {
            try CredentialStore.save(device)
        }
    }

    static func delete() {
        item.delete()
        OwnClassesStore.delete()
    }
}
