import CryptoKit
import Foundation

/// An export failed verification: bad signature, wrong key, schema, digest or size.
public struct ManifestError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// Verifies an export the way export/manifest.py specifies:
///
/// 1. a signature over the **exact bytes** of `manifest.json` under the **pinned** public key the
///    app ships: `manifest.sig` (base64 of a 64-byte Ed25519 signature) for an Ed25519 key, or
///    `manifest.p256.sig` (base64 of a DER ECDSA P-256 / SHA-256 signature) for a P-256 key;
/// 2. parse (format 1, kind `harmony-mobile/export`, the signature section names the pinned key,
///    every tier exits by a rule this app computes and a slot-gated one has the slot prototypes);
/// 3. sha256 and size of every file the app loads (a `.pte` file, or the tree digest of an
///    `.mlpackage` directory).
///
/// CryptoKit verifies both algorithms; an app pins whichever key its build ships (the Android app
/// pins the P-256 key, because many Android 13-15 phones lack Ed25519). The key file shipped beside
/// a manifest proves nothing by itself (whoever can replace the manifest can replace it too);
/// `verifyDirectory` only requires it to equal the pinned key.
public struct ManifestVerifier: Sendable {
    public static let manifestFile = "manifest.json"
    public static let signatureFile = "manifest.sig"
    public static let publicKeyFile = "signing_key.pub"
    public static let p256SignatureFile = "manifest.p256.sig"
    public static let p256PublicKeyFile = "signing_key_p256.pub"
    public static let supportedFormat = 1
    public static let kind = "harmony-mobile/export"
    public static let signatureAlgorithm = "Ed25519"
    public static let p256SignatureAlgorithm = "ECDSA-P256-SHA256"
    public static let publicKeyBytes = 32
    public static let signatureBytes = 64

    public enum PinnedKey: Sendable, Equatable {
        /// The raw 32-byte Ed25519 key.
        case ed25519(Data)
        /// The X.509 SubjectPublicKeyInfo DER of a P-256 key.
        case p256(Data)
    }

    public let pinnedKey: PinnedKey

    /// The pinned key's bytes as its key file holds them (base64-decoded).
    public var pinnedPublicKey: Data {
        switch pinnedKey {
        case .ed25519(let raw): return raw
        case .p256(let der): return der
        }
    }

    /// - Parameter pinnedPublicKey: the raw 32-byte Ed25519 key.
    public init(pinnedPublicKey: Data) throws {
        guard pinnedPublicKey.count == Self.publicKeyBytes else {
            throw ManifestError("the pinned Ed25519 key must have \(Self.publicKeyBytes) bytes, got \(pinnedPublicKey.count)")
        }
        pinnedKey = .ed25519(pinnedPublicKey)
    }

    /// - Parameter pinnedP256PublicKey: the SPKI DER of the P-256 key (signing_key_p256.pub, decoded).
    public init(pinnedP256PublicKey: Data) throws {
        do {
            _ = try P256.Signing.PublicKey(derRepresentation: pinnedP256PublicKey)
        } catch {
            throw ManifestError("the pinned key is not an X.509 DER P-256 public key")
        }
        pinnedKey = .p256(pinnedP256PublicKey)
    }

    /// A pinned key in the `signing_key.pub` format: base64 of the raw 32 bytes.
    public init(publicKeyFile text: String) throws {
        try self.init(pinnedPublicKey: Self.decodeBase64(text, what: Self.publicKeyFile))
    }

    /// A pinned key in the `signing_key_p256.pub` format: base64 of the SPKI DER.
    public init(p256PublicKeyFile text: String) throws {
        try self.init(pinnedP256PublicKey: Self.decodeBase64(text, what: Self.p256PublicKeyFile))
    }

    /// The signature file this verifier reads.
    public var signatureFileName: String {
        if case .p256 = pinnedKey { return Self.p256SignatureFile }
        return Self.signatureFile
    }

    /// The shipped key file that must equal the pinned key.
    public var publicKeyFileName: String {
        if case .p256 = pinnedKey { return Self.p256PublicKeyFile }
        return Self.publicKeyFile
    }

    /// Checks the signature, then parses.
    ///
    /// - Parameters:
    ///   - manifestBytes: the exact bytes of manifest.json (or the UTF-8 of enrolment's `manifest`)
    ///   - signatureFile: the exact bytes of `signatureFileName` (surrounding whitespace tolerated)
    public func verify(manifestBytes: Data, signatureFile: Data) throws -> Manifest {
        let signature = try Self.decodeBase64(
            String(decoding: signatureFile, as: UTF8.self), what: signatureFileName)
        guard try signatureMatches(signature, manifestBytes) else {
            throw ManifestError("\(signatureFileName): signature does not match \(Self.manifestFile) under the pinned key")
        }
        let manifest: Manifest
        do {
            manifest = try JSONDecoder().decode(Manifest.self, from: manifestBytes)
        } catch {
            throw ManifestError("\(Self.manifestFile): does not follow the manifest schema: \(error)")
        }
        guard manifest.format == Self.supportedFormat else {
            throw ManifestError(
                "\(Self.manifestFile): format \(manifest.format) is not supported (this app reads format \(Self.supportedFormat))")
        }
        guard manifest.kind == Self.kind else {
            throw ManifestError("\(Self.manifestFile): not a harmony-mobile export manifest (kind \(manifest.kind))")
        }
        try Self.checkExitRules(manifest)
        guard manifest.signature.algorithm == Self.signatureAlgorithm else {
            throw ManifestError("\(Self.manifestFile): unsupported signature algorithm \(manifest.signature.algorithm)")
        }
        let fingerprint = Hex.encode(SHA256.hash(data: pinnedPublicKey))
        switch pinnedKey {
        case .ed25519:
            guard manifest.signature.publicKeySha256 == fingerprint else {
                throw ManifestError("\(Self.manifestFile): signature.public_key_sha256 names another key")
            }
        case .p256:
            guard let p256 = manifest.signature.p256, p256.algorithm == Self.p256SignatureAlgorithm,
                  p256.publicKeySha256 == fingerprint
            else {
                throw ManifestError("\(Self.manifestFile): signature.p256 does not name the pinned P-256 key")
            }
        }
        return manifest
    }

    /// Every tier's threshold is on a score this app computes (`ExitRule`): a threshold on another
    /// score is refused, never misread. A slot_margin tier gates by the manifest's slot prototypes, so
    /// the manifest must have them (as harmony-core's Manifest and export/manifest.py require).
    public static func checkExitRules(_ manifest: Manifest) throws {
        for tier in manifest.tiers {
            guard let rule = tier.exitRule else {
                let known = ExitRule.allCases.map(\.rawValue).joined(separator: " or ")
                throw ManifestError(
                    "\(manifestFile): tier \(tier.name) exits by \(tier.exitRuleName ?? ""); "
                        + "this app answers locally by \(known)")
            }
            if rule == .slotMargin, manifest.slotPrototypes == nil {
                throw ManifestError(
                    "\(manifestFile): tier \(tier.name) exits by slot_margin: the manifest has no slot_prototypes")
            }
        }
        if let prototypes = manifest.slotPrototypes {
            try checkSlotPrototypes(prototypes)
        }
    }

    /// The slot_prototypes entry names a file the store may write (a safe relative path), its digest
    /// as lowercase hex, and a shape of [slots, features].
    static func checkSlotPrototypes(_ entry: SlotPrototypesEntry) throws {
        let what = "\(manifestFile): slot_prototypes"
        guard isSafeRelativePath(entry.path) else {
            throw ManifestError("\(what): unsafe path \(entry.path)")
        }
        guard entry.sha256.range(of: "^[0-9a-f]{64}$", options: .regularExpression) != nil else {
            throw ManifestError("\(what): sha256 must be 64 lowercase hex characters, got \(entry.sha256)")
        }
        guard entry.size >= 0 else {
            throw ManifestError("\(what): size must be >= 0, got \(entry.size)")
        }
        guard entry.shape.count == 2, entry.shape.allSatisfy({ $0 > 0 }) else {
            throw ManifestError("\(what): shape must be [slots, features] of positive sizes, got \(entry.shape)")
        }
    }

    private func signatureMatches(_ signature: Data, _ manifestBytes: Data) throws -> Bool {
        switch pinnedKey {
        case .ed25519(let raw):
            guard signature.count == Self.signatureBytes else {
                throw ManifestError(
                    "\(Self.signatureFile): must hold a \(Self.signatureBytes)-byte Ed25519 signature, holds \(signature.count) bytes")
            }
            guard let key = try? Curve25519.Signing.PublicKey(rawRepresentation: raw) else {
                throw ManifestError("the pinned key is not an Ed25519 public key")
            }
            return key.isValidSignature(signature, for: manifestBytes)
        case .p256(let der):
            guard let key = try? P256.Signing.PublicKey(derRepresentation: der) else {
                throw ManifestError("the pinned key is not an X.509 DER P-256 public key")
            }
            guard let parsed = try? P256.Signing.ECDSASignature(derRepresentation: signature) else {
                return false
            }
            // CryptoKit hashes the data with SHA-256 itself, as SHA256withECDSA does on the signing side.
            return key.isValidSignature(parsed, for: manifestBytes)
        }
    }

    /// Verifies an export directory (manifest.json, the signature file and, if present, the shipped key).
    public func verifyDirectory(_ directory: URL) throws -> Manifest {
        let shippedKey = directory.appendingPathComponent(publicKeyFileName)
        if FileManager.default.fileExists(atPath: shippedKey.path) {
            let text = try String(decoding: Data(contentsOf: shippedKey), as: UTF8.self)
            guard try Self.decodeBase64(text, what: publicKeyFileName) == pinnedPublicKey else {
                throw ManifestError("\(publicKeyFileName): is not the pinned public key")
            }
        }
        let signature = directory.appendingPathComponent(signatureFileName)
        guard FileManager.default.fileExists(atPath: signature.path) else {
            throw ManifestError("\(signatureFileName): missing")
        }
        return try verify(
            manifestBytes: Data(contentsOf: directory.appendingPathComponent(Self.manifestFile)),
            signatureFile: Data(contentsOf: signature))
    }

    // MARK: - Files

    /// Checks an artifact inside an export directory before anything loads it: a file's sha256 and
    /// size, or a `.mlpackage` directory's tree digest and total size.
    public static func verifyArtifact(_ artifact: Artifact, in directory: URL) throws {
        guard isSafeRelativePath(artifact.path) else {
            throw ManifestError("\(artifact.path): unsafe path in manifest")
        }
        let url = directory.appendingPathComponent(artifact.path)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) else {
            throw ManifestError("\(artifact.path): missing")
        }
        let (digest, size) = try isDirectory.boolValue ? treeDigest(of: url) : sha256(ofFileAt: url)
        guard size == artifact.size else {
            throw ManifestError("\(artifact.path): size \(size) bytes, manifest says \(artifact.size)")
        }
        guard digest == artifact.sha256 else {
            throw ManifestError("\(artifact.path): sha256 \(digest) does not match manifest \(artifact.sha256)")
        }
    }

    /// (sha256 hex, size) of a file, streamed in 1 MiB blocks.
    public static func sha256(ofFileAt url: URL) throws -> (sha256: String, size: Int64) {
        let handle = try FileHandle(forReadingFrom: url)
        defer { try? handle.close() }
        var hasher = SHA256()
        var size: Int64 = 0
        while let block = try handle.read(upToCount: 1 << 20), !block.isEmpty {
            hasher.update(data: block)
            size += Int64(block.count)
        }
        return (Hex.encode(hasher.finalize()), size)
    }

    /// The tree digest of a directory (export/manifest.py `tree_digest`): sha256 of the lines
    /// `"<sha256 hex>  <relative path, '/' separated>\n"` sorted by path (code point order), and the
    /// sum of the file sizes.
    public static func treeDigest(of directory: URL) throws -> (sha256: String, size: Int64) {
        let fileManager = FileManager.default
        var entries = [(path: String, sha256: String)]()
        var total: Int64 = 0
        for relative in try fileManager.subpathsOfDirectory(atPath: directory.path) {
            var isDirectory: ObjCBool = false
            let url = directory.appendingPathComponent(relative)
            guard fileManager.fileExists(atPath: url.path, isDirectory: &isDirectory), !isDirectory.boolValue else {
                continue
            }
            let (digest, size) = try sha256(ofFileAt: url)
            entries.append((relative, digest))
            total += size
        }
        entries.sort { $0.path.unicodeScalars.lexicographicallyPrecedes($1.path.unicodeScalars) }
        let lines = entries.map { "\($0.sha256)  \($0.path)\n" }.joined()
        return (Hex.encode(SHA256.hash(data: Data(lines.utf8))), total)
    }

    static func isSafeRelativePath(_ path: String) -> Bool {
        !path.isEmpty && !path.hasPrefix("/") && !path.contains("\\")
            && !path.split(separator: "/").contains("..")
    }

    static func decodeBase64(_ text: String, what: String) throws -> Data {
        guard let data = Data(base64Encoded: text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw ManifestError("\(what): not base64")
        }
        return data
    }
}
