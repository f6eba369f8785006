import Combine
import Foundation
import HarmonyKit
import UIKit

/// Everything the screen shows and does: the verified export, the tier and engine, the classifier
/// with its server fallback, enrolment and the confirmed-label upload queue.
@MainActor
final class DemoModel: ObservableObject {
    @Published var status = "Starting…"
    @Published private(set) var manifest: Manifest?
    @Published private(set) var runnableTiers: [TierEntry] = []
    @Published private(set) var recommendedTier: String?
    @Published private(set) var deviceClass: DeviceClass?
    @Published private(set) var selectedTier: String = ""
    @Published private(set) var selectedBackend: String = Artifact.backendCoreML
    @Published private(set) var engineDescription = ""
    @Published private(set) var samples: [SampleDigit] = []
    @Published private(set) var image: PixelImage?
    @Published private(set) var imageLabel: Int?
    @Published private(set) var result: Classification?
    @Published var confirmedLabel = 0
    @Published private(set) var queued = 0
    @Published private(set) var credentials: DeviceCredentials?
    @Published private(set) var busy = false
    /// The simulator reaches `harmony serve` on the Mac as localhost; a phone needs the Mac's address
    /// (`harmony export-app ios --server-url` writes it to Resources/server_url.txt).
    @Published var serverURL = UserDefaults.standard.string(forKey: "serverURL") ?? ModelFiles.bundledServerURL {
        didSet { UserDefaults.standard.set(serverURL, forKey: "serverURL") }
    }

    /// False until the phone got its federation secret (deep link, QR code or managed app config).
    @Published private(set) var provisioned = false

    private var client: HarmonyClient?
    private var uploads: ConfirmedUploads?
    /// One queue for the app's lifetime: a second actor on the same directory would race the first.
    private var uploadQueue: UploadQueue?
    private var federationKey: FederationKey?
    /// Tier name -> the classes this phone holds (the provisioning payload's own_classes).
    private var ownClasses: [String: [String]]?
    private var installed: ModelStore.Installed?
    private let device = DeviceProfile.current()

    var tier: TierEntry? { runnableTiers.first { $0.name == selectedTier } }

    /// Backends the selected tier has an iOS artifact for.
    var backends: [String] {
        guard let tier else { return [] }
        return [Artifact.backendCoreML, Artifact.backendXNNPACK].filter { backend in
            tier.artifacts.contains { $0.backend == backend }
        }
    }

    func start() async {
        samples = SampleDigit.loadBundled()
        credentials = CredentialStore.load()
        if let payload = ProvisioningStore.managedPayload, ProvisioningStore.federationKey() == nil {
            await provision(link: payload)
            return
        }
        federationKey = ProvisioningStore.federationKey()
        ownClasses = OwnClassesStore.load()
        provisioned = federationKey != nil
        guard let federationKey else {
            status = "Not provisioned: scan the provisioning QR code (`harmony provision`), open its "
                + "harmony-mobile://provision link, or install managed app config. Nothing is tokenized or decoded until then."
            return
        }
        do {
            let installed = try await Task.detached { try ModelFiles.installBundled() }.value
            try SecretCheck.requireMatches(federationKey, manifest: installed.manifest)
            show(installed)
            await loadEngine()
        } catch {
            status = "Model not loaded: \(error)"
        }
    }

    /// A provisioning link or managed-config payload: parsed, stored in the Keychain, then the app restarts its model.
    func provision(link: String) async {
        do {
            try ProvisioningStore.apply(try ProvisioningPayload.parse(link))
        } catch {
            status = "Provisioning refused: \(error)"
            return
        }
        await start()
    }

    /// The server's signed manifest; a newer one (never an older one) is installed and switched to.
    func checkForUpdate() async {
        guard let credentials, let server = URL(string: serverURL) else {
            status = "Enrol first: the manifest endpoints need a device token"
            return
        }
        busy = true
        defer { busy = false }
        do {
            // the server serves the artifacts of the manifest it serves (docs/PROTOCOL.md 2.4)
            let base = server.appendingPathComponent(HarmonyHTTPClient.artifactBasePath)
            guard let updated = try await ModelFiles.update(server: server, device: credentials, artifactBase: base) else {
                status = "Model \(manifest?.modelVersion ?? "?") is current"
                return
            }
            if let federationKey { try SecretCheck.requireMatches(federationKey, manifest: updated.manifest) }
            show(updated)
            await loadEngine()
            status = "Updated to model \(updated.manifest.modelVersion) (manifest \(updated.manifest.version))"
        } catch {
            status = "Update refused: \(error)"
        }
    }

    private func show(_ installed: ModelStore.Installed) {
        self.installed = installed
        manifest = installed.manifest
        runnableTiers = TierSelector.runnableTiers(installed.manifest.tiers, on: device)
        let recommended = try? TierSelector.select(from: installed.manifest.tiers, for: device)
        recommendedTier = recommended?.name
        deviceClass = DeviceClass.of(device)
        if !runnableTiers.contains(where: { $0.name == selectedTier }) {
            selectedTier = recommended?.name ?? runnableTiers.first?.name ?? ""
        }
        if !backends.contains(selectedBackend) {
            selectedBackend = backends.first ?? Artifact.backendXNNPACK
        }
    }

    /// The user picked another tier: keep the runtime if the tier has it, else take its first one.
    func select(tier name: String) async {
        guard name != selectedTier else { return }
        selectedTier = name
        if !backends.contains(selectedBackend) {
            selectedBackend = backends.first ?? Artifact.backendXNNPACK
        }
        await loadEngine()
    }

    func select(backend: String) async {
        guard backend != selectedBackend else { return }
        selectedBackend = backend
        await loadEngine()
    }

    /// (Re)builds the engine for the selected tier and backend.
    func loadEngine() async {
        guard let tier, let installed, let artifact = ModelFiles.artifact(of: tier, backend: selectedBackend) else {
            status = "Tier \(selectedTier) has no \(selectedBackend) artifact"
            return
        }
        busy = true
        defer { busy = false }
        status = "Verifying and loading \(artifact.path)…"
        do {
            let gate = try makeExitGate(for: tier, installed: installed)
            let directory = installed.directory
            let engine = try await Task.detached {
                try await ModelFiles.makeEngine(tier: tier, artifact: artifact, in: directory)
            }.value
            let server = try makeFallback(for: tier)
            if let server, let manifest, let epoch = manifest.labelEpoch, let table = manifest.slotTable {
                try await server.slots.remember(
                    version: manifest.backend.modelVersion, table: SlotTable(labelEpoch: epoch, tokens: table))
            }
            client = try HarmonyClient(
                engine: engine, exitPolicy: gate, exits: try makeExits(), fallback: server?.server, slots: server?.slots)
            uploads = try makeUploads(for: tier)
            engineDescription = "\(artifact.path) (\(artifact.quantization), \(artifact.verdict ?? "not_checked"), "
                + "\(tier.exitRule?.rawValue ?? "?") >= \(tier.threshold), manifest \(installed.manifest.version))"
            status = "Ready"
            await refreshQueue()
        } catch {
            client = nil
            status = "Could not load \(artifact.path): \(error)"
        }
    }

    func classify(_ sample: SampleDigit) async {
        await classify(sample.image, label: sample.label)
    }

    func classify(photo: UIImage) async {
        guard let tier else { return }
        let shape = tier.input.shape
        guard shape.count == 4,
              let image = PixelImage.from(photo: photo, channels: shape[1], height: shape[2], width: shape[3])
        else {
            status = "Could not read the picture"
            return
        }
        await classify(image, label: nil)
    }

    private func classify(_ picture: PixelImage, label: Int?) async {
        guard let client, let tier else { return }
        do {
            let image = try picture.fitted(to: tier) // the 28x28 gray samples feed a 3x32x32 tier too
            self.image = image
            imageLabel = label
            confirmedLabel = label ?? result?.predictedClass ?? 0
            let input = try image.modelInput(for: tier)
            result = try await client.classify(input)
            if label == nil, let answer = result?.predictedClass, answer >= 0 {
                confirmedLabel = answer
            }
            status = "Ready"
        } catch {
            status = "Classification failed: \(error)"
        }
    }

    // MARK: - Server

    func enroll(adminToken: String) async {
        guard let url = URL(string: serverURL) else {
            status = "Not a URL: \(serverURL)"
            return
        }
        busy = true
        defer { busy = false }
        do {
            let enrollment = try await HarmonyHTTPClient(baseURL: url).enroll(
                adminToken: adminToken, name: "ios-demo", tier: selectedTier.isEmpty ? nil : selectedTier)
            var notice: String?
            if let text = enrollment.manifest, let signature = enrollment.manifestSignature, let manifest {
                // The server's manifest must be signed by the pinned key too; say so if it is another export.
                let served = try ModelFiles.pinnedVerifier().verify(
                    manifestBytes: Data(text.utf8), signatureFile: Data(signature.utf8))
                if served.modelVersion != manifest.modelVersion {
                    notice = "the server serves model \(served.modelVersion), this app has \(manifest.modelVersion)"
                }
            }
            try CredentialStore.save(enrollment.credentials)
            credentials = enrollment.credentials
            await loadEngine()
            if let notice {
                status = "Enrolled as \(enrollment.deviceID); \(notice)"
            }
        } catch {
            status = "Enrolment failed: \(error)"
        }
    }

    func forgetEnrollment() async {
        CredentialStore.delete()
        credentials = nil
        await loadEngine()
    }

    func confirmAndUpload() async {
        guard let uploads, let result else {
            status = "Enrol this device to upload"
            return
        }
        do {
            try await uploads.enqueue(features: result.features, confirmedClass: confirmedLabel)
            status = "Upload queued (label \(confirmedLabel))"
        } catch {
            status = "Could not queue the upload: \(error)"
            return
        }
        await flush()
    }

    func flush() async {
        guard let uploads else { return }
        do {
            let sent = try await uploads.flush()
            status = sent > 0 ? "Sent \(sent) upload(s)" : status
        } catch {
            status = "Upload failed: \(error)"
        }
        await refreshQueue()
    }

    private func refreshQueue() async {
        queued = (try? await uploads?.pendingCount()) ?? 0
    }

    /// The provisioned secret; there is no fallback secret.
    private func requireFederationKey() throws -> FederationKey {
        guard let federationKey else {
            throw HarmonyFormatError("not provisioned: this phone has no federation secret")
        }
        return federationKey
    }

    /// The exit head's outputs are in token order under the manifest's label epoch: named with the
    /// federation secret (an export without a label epoch cannot be decoded).
    private func makeExits() throws -> ExitDecoder {
        guard let manifest else { throw HarmonyFormatError("no verified manifest") }
        guard let labelEpoch = manifest.labelEpoch else {
            throw HarmonyFormatError("this export names no label epoch, so its exit head cannot be decoded: re-export it")
        }
        return try ExitDecoder(
            federationKey: requireFederationKey(), labelEpoch: labelEpoch, classNames: manifest.classNames)
    }

    /// The tier's exit rule at its threshold: max softmax, or the slot gate by the installed slot
    /// prototypes and this phone's own slots. A slot-gated tier never falls back to max softmax: its
    /// threshold is on the margin.
    private func makeExitGate(for tier: TierEntry, installed: ModelStore.Installed) throws -> any ExitGate {
        guard tier.exitRule == .slotMargin else { return try ExitPolicy(threshold: tier.threshold) }
        guard let prototypes = try installed.slotPrototypesData(for: tier) else {
            throw ManifestError("tier \(tier.name) exits by slot_margin, but its slot prototypes are not installed")
        }
        return try SlotGatePolicy.fromPrototypes(
            prototypes, ownSlots: makeOwnSlots(for: tier, manifest: installed.manifest), threshold: tier.threshold)
    }

    /// Which slots are this phone's: the manifest's slot table decoded with the federation secret; a
    /// slot is own when its class is one the provisioning payload says this phone holds for the tier
    /// (the owner knows them; the operator's manifest never says).
    private func makeOwnSlots(for tier: TierEntry, manifest: Manifest) throws -> [Bool] {
        guard let own = ownClasses?[tier.name] else {
            throw ProvisioningError(
                "tier \(tier.name) exits by the slot gate, which needs the classes this phone holds, and the "
                    + "provisioning payload names none for it: provision the phone with "
                    + "`harmony provision --export <export dir>` (which writes own_classes)")
        }
        let unknown = Set(own).subtracting(manifest.classNames)
        guard unknown.isEmpty else {
            throw ProvisioningError(
                "the provisioned classes of tier \(tier.name) are not all this model's: \(unknown.sorted())")
        }
        guard let labelEpoch = manifest.labelEpoch, let table = manifest.slotTable else {
            throw HarmonyFormatError(
                "this export names no label epoch or slot table, so its slots cannot be decoded: re-export it")
        }
        let slotClasses = try requireFederationKey().tokens(labelEpoch: labelEpoch)
            .slotClasses(classNames: manifest.classNames, slotTable: table)
        return SlotGatePolicy.ownSlots(slotClasses: slotClasses, ownClassNames: Set(own))
    }

    /// The server and the decoder of its slots (seeded with the manifest's own slot table, so only
    /// answers from another back-end version need a metadata fetch).
    private func makeFallback(for tier: TierEntry) throws -> (server: any FallbackServer, slots: SlotDecoder)? {
        guard let credentials, let url = URL(string: serverURL), let manifest else { return nil }
        // Interactive: short timeouts, one quick retry, then the local answer stands.
        let client = HarmonyHTTPClient(baseURL: url, policy: .interactive, requestTimeout: 3, resourceTimeout: 10)
        let slots = SlotDecoder(
            federationKey: try requireFederationKey(), classNames: manifest.classNames,
            source: HTTPSlotTableSource(client: client, device: credentials))
        return (HTTPFallbackServer(client: client, device: credentials, tier: tier.name), slots)
    }

    /// Uploads name the lineage's label epoch, which the verified manifest carries.
    private func makeUploads(for tier: TierEntry) throws -> ConfirmedUploads? {
        guard let credentials, let url = URL(string: serverURL), let manifest, let labelEpoch = manifest.labelEpoch
        else { return nil }
        let directory = try FileManager.default.url(
            for: .applicationSupportDirectory, in: .userDomainMask, appropriateFor: nil, create: true
        ).appendingPathComponent("upload-queue", isDirectory: true)
        let queue = try uploadQueue ?? UploadQueue(directory: directory, maxEntries: 512, maxBytes: 32 * 1024 * 1024)
        uploadQueue = queue
        return try ConfirmedUploads(
            queue: queue,
            client: HarmonyHTTPClient(baseURL: url), device: credentials, federationKey: requireFederationKey(),
            labelEpoch: labelEpoch, classNames: manifest.classNames, family: tier.family, tier: tier.name,
            splitDepth: tier.splitDepth, modelVersion: manifest.modelVersion)
    }
}
