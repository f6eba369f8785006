import Foundation

/// The export a phone runs and its updates: a newer signed manifest only, switched to atomically.
///
///     root/current.json          {"manifest_version", "manifest_sha256", "directory"}: the export in
///                                use, replaced by one atomic rename
///     root/versions/<version>/   manifest.json, its signature file and the artifacts, verified
///     root/.staging-<uuid>/      an update being written (deleted when it fails)
///
/// `install` verifies the signature under the pinned key, refuses a rollback (`ManifestUpdate`),
/// copies the artifacts `wanted` names from the source (and, when one of them is a slot_margin tier's,
/// the manifest's slot prototypes, which that tier gates by) and checks each file against the signed
/// manifest (sha256 and size, or an .mlpackage's tree digest) before switching. The bundled export
/// takes the same path, so a bundled model older than an installed update is refused too.
/// Counterparts: harmony-core `update.ModelStore`, harmony_mobile/device/model_store.py.
public struct ModelStore: Sendable {
    public static let currentFile = "current.json"
    public static let versionsDirectory = "versions"

    /// Where artifacts come from: the app bundle's export, the server (`GET /v1/artifacts/{path}`), or
    /// another host the export is published on. It
    /// writes `artifact` (a file, or an .mlpackage directory whose files the verified `manifest` lists)
    /// to `destination`. The slot prototypes come the same way, as a plain file of format
    /// `SlotPrototypesEntry.artifactFormat` at the entry's path.
    public typealias ArtifactSource = @Sendable (_ artifact: Artifact, _ manifest: Manifest, _ destination: URL) throws -> Void

    public struct Installed: Sendable {
        public let manifest: Manifest
        public let directory: URL
        public let version: InstalledVersion
        /// The manifest's slot prototypes beside the artifacts, checked against the signed manifest;
        /// nil when no installed artifact is a slot_margin tier's.
        public let slotPrototypes: URL?

        /// The HMFT bytes a slot_margin tier gates by (`SlotGatePolicy.fromPrototypes`), checked
        /// against the signed manifest once more as they are read, as an artifact is before it loads;
        /// nil for a max_softmax tier.
        public func slotPrototypesData(for tier: TierEntry) throws -> Data? {
            guard tier.exitRule == .slotMargin else { return nil }
            guard let entry = manifest.slotPrototypes, let slotPrototypes else {
                throw ManifestError("tier \(tier.name) exits by slot_margin, but its slot prototypes are not installed")
            }
            let data = try Data(contentsOf: slotPrototypes)
            guard Int64(data.count) == entry.size, ManifestUpdate.sha256(data) == entry.sha256 else {
                throw ManifestError("\(entry.path): does not match the manifest's sha256 and size")
            }
            return data
        }
    }

    private struct Pointer: Codable {
        let manifestVersion: Int
        let manifestSha256: String
        let directory: String

        enum CodingKeys: String, CodingKey {
            case manifestVersion = "manifest_version"
            case manifestSha256 = "manifest_sha256"
            case directory
        }
    }

    public let root: URL
    public let verifier: ManifestVerifier

    public init(root: URL, verifier: ManifestVerifier) {
        self.root = root
        self.verifier = verifier
    }

    /// The installed version from current.json alone: the mark an update must pass.
    public func installedVersion() throws -> InstalledVersion? {
        guard let pointer = try pointer() else { return nil }
        return InstalledVersion(manifestVersion: pointer.manifestVersion, manifestSha256: pointer.manifestSha256)
    }

    /// The export in use, its manifest and slot prototypes re-verified; artifacts are verified when loaded.
    public func current() throws -> Installed? {
        guard let pointer = try pointer() else { return nil }
        guard !pointer.directory.contains("..") else { throw ManifestError("current.json points outside the store") }
        let directory = root.appendingPathComponent(pointer.directory, isDirectory: true)
        let bytes = try Data(contentsOf: directory.appendingPathComponent(ManifestVerifier.manifestFile))
        let manifest = try verifier.verify(
            manifestBytes: bytes,
            signatureFile: Data(contentsOf: directory.appendingPathComponent(verifier.signatureFileName)))
        let version = InstalledVersion(manifestVersion: pointer.manifestVersion, manifestSha256: pointer.manifestSha256)
        guard manifest.version == version.manifestVersion, ManifestUpdate.sha256(bytes) == version.manifestSha256 else {
            throw ManifestError("the installed manifest is not the one current.json names")
        }
        let prototypes = Self.slotPrototypesFile(of: manifest, in: directory)
        if prototypes != nil, let entry = manifest.slotPrototypes {
            // re-verified as the manifest is: bit rot shows here, not as wrong local answers
            try ManifestVerifier.verifyArtifact(entry.artifact, in: directory)
        }
        return Installed(manifest: manifest, directory: directory, version: version, slotPrototypes: prototypes)
    }

    /// The slot prototypes in an installed version's directory; nil when the install fetched none (no
    /// artifact it fetched is a slot_margin tier's).
    private static func slotPrototypesFile(of manifest: Manifest, in directory: URL) -> URL? {
        guard let entry = manifest.slotPrototypes else { return nil }
        let url = directory.appendingPathComponent(entry.path)
        return FileManager.default.fileExists(atPath: url.path) ? url : nil
    }

    /// The artifacts `wanted` picks, and the slot prototypes when one of them is a slot_margin tier's.
    private static func filesToFetch(_ wanted: [Artifact], of manifest: Manifest) -> [Artifact] {
        let gated = manifest.tiers.filter { $0.exitRule == .slotMargin }
        let needsPrototypes = gated.contains { tier in tier.artifacts.contains { wanted.contains($0) } }
        guard needsPrototypes, let prototypes = manifest.slotPrototypes else { return wanted }
        return wanted + [prototypes.artifact]
    }

    /// Installs a signed manifest and the artifacts `wanted` picks when it is an update; nil when it is
    /// the installed manifest. Throws RollbackError for an older one, ManifestError for a bad signature
    /// or artifact; the installed export is then untouched.
    public func install(
        manifestBytes: Data, signatureFile: Data, source: ArtifactSource, wanted: (Manifest) -> [Artifact]
    ) throws -> Installed? {
        let manifest = try verifier.verify(manifestBytes: manifestBytes, signatureFile: signatureFile)
        guard try ManifestUpdate.isUpdate(installed: installedVersion(), candidate: manifest, candidateBytes: manifestBytes)
        else { return nil }
        let files = FileManager.default
        let versions = root.appendingPathComponent(Self.versionsDirectory, isDirectory: true)
        try files.createDirectory(at: versions, withIntermediateDirectories: true)
        let staging = root.appendingPathComponent(".staging-\(UUID().uuidString)", isDirectory: true)
        let target = versions.appendingPathComponent(String(manifest.version), isDirectory: true)
        do {
            try files.createDirectory(at: staging, withIntermediateDirectories: true)
            try manifestBytes.write(to: staging.appendingPathComponent(ManifestVerifier.manifestFile), options: .atomic)
            try signatureFile.write(to: staging.appendingPathComponent(verifier.signatureFileName), options: .atomic)
            for artifact in Self.filesToFetch(wanted(manifest), of: manifest) {
                guard ManifestVerifier.isSafeRelativePath(artifact.path) else {
                    throw ManifestError("\(artifact.path): unsafe path in manifest")
                }
                let destination = staging.appendingPathComponent(artifact.path)
                try files.createDirectory(at: destination.deletingLastPathComponent(), withIntermediateDirectories: true)
                try source(artifact, manifest, destination)
                try ManifestVerifier.verifyArtifact(artifact, in: staging)
            }
            try? files.removeItem(at: target) // a half-installed copy of this same version
            try files.moveItem(at: staging, to: target)
        } catch {
            try? files.removeItem(at: staging)
            throw error
        }
        let version = InstalledVersion(manifestVersion: manifest.version, manifestSha256: ManifestUpdate.sha256(manifestBytes))
        try switchTo(version, directory: "\(Self.versionsDirectory)/\(manifest.version)")
        for old in try files.contentsOfDirectory(at: versions, includingPropertiesForKeys: nil)
        where old.lastPathComponent != String(manifest.version) {
            try? files.removeItem(at: old)
        }
        return Installed(
            manifest: manifest, directory: target, version: version,
            slotPrototypes: Self.slotPrototypesFile(of: manifest, in: target))
    }

    private func pointer() throws -> Pointer? {
        let url = root.appendingPathComponent(Self.currentFile)
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        do {
            return try JSONDecoder().decode(Pointer.self, from: Data(contentsOf: url))
        } catch {
            throw ManifestError("the installed export's pointer current.json is damaged: \(error)")
        }
    }

    /// Points current.json at `directory`: `.atomic` writes a temporary file and renames it into place.
    private func switchTo(_ version: InstalledVersion, directory: String) throws {
        let pointer = Pointer(
            manifestVersion: version.manifestVersion, manifestSha256: version.manifestSha256, directory: directory)
        try JSONEncoder().encode(pointer).write(to: root.appendingPathComponent(Self.currentFile), options: .atomic)
    }
}
