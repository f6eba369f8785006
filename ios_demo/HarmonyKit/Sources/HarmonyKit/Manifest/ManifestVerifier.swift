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
/// 1. `manifest.sig` (base64 of a 64-byte Ed25519 signature) over the **exact bytes** of
///    `manifest.json`, under the **pinned** public key the app ships;
/// 2. parse (format 1, kind `harmony-mobile/export`, signature.public_key_sha256 = the pinned key);
/// 3. sha256 and size of every file the app loads (a `.pte` file, or the tree digest of an
///    `.mlpackage` directory).
///
/// The `signing_key.pub` shipped beside a manifest proves nothing by itself (whoever can replace the
/// manifest can replace it too); `verifyDirectory` only requires it to equal the pinned key.
public struct ManifestVerifier: Sendable {
    public static let manifestFile = "manifest.json"
    public static let signatureFile = "manifest.sig"
    public static let publicKeyFile = "signing_key.pub"
    public static let supportedFormat = 1
    public static let kind = "harmony-mobile/export"
    public static let signatureAlgorithm = "Ed25519"
    public static let publicKeyBytes = 32
    public static let signatureBytes = 64

    public let pinnedPublicKey: Data

    /// - Parameter pinnedPublicKey: the raw 32-byte Ed25519 key.
    public init(pinnedPublicKey: Data) throws {
        guard pinnedPublicKey.count == Self.publicKeyBytes else {
            throw ManifestError("the pinned Ed25519 key must have \(Self.publicKeyBytes) bytes, got \(pinnedPublicKey.count)")
        }
        self.pinnedPublicKey = pinnedPublicKey
    }

    /// A pinned key in the `signing_key.pub` format: base64 of the raw 32 bytes.
    public init(publicKeyFile text: String) throws {
        try self.init(pinnedPublicKey: Self.decodeBase64(text, what: Self.publicKeyFile))
    }

    /// Checks the signature, then parses.
    ///
    /// - Parameters:
    ///   - manifestBytes: the exact bytes of manifest.json (or the UTF-8 of enrolment's `manifest`)
    ///   - signatureFile: the exact bytes of manifest.sig (surrounding whitespace tolerated)
    public func verify(manifestBytes: Data, signatureFile: Data) throws -> Manifest {
        let signature = try Self.decodeBase64(
            String(decoding: signatureFile, as: UTF8.self), what: Self.signatureFile)
        guard signature.count == Self.signatureBytes else {
            throw ManifestError(
                "\(Self.signatureFile): must hold a \(Self.signatureBytes)-byte Ed25519 signature, holds \(signature.count) bytes")
        }
        let key: Curve25519.Signing.PublicKey
        do {
            key = try Curve25519.Signing.PublicKey(rawRepresentation: pinnedPublicKey)
        } catch {
            throw ManifestError("the pinned key is not an Ed25519 public key")
        }
        guard key.isValidSignature(signature, for: manifestBytes) else {
            throw ManifestError("\(Self.signatureFile): signature does not match \(Self.manifestFile) under the pinned key")
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
        guard manifest.signature.algorithm == Self.signatureAlgorithm else {
            throw ManifestError("\(Self.manifestFile): unsupported signature algorithm \(manifest.signature.algorithm)")
        }
        guard manifest.signature.publicKeySha256 == Hex.encode(SHA256.hash(data: pinnedPublicKey)) else {
            throw ManifestError("\(Self.manifestFile): signature.public_key_sha256 names another key")
        }
        return manifest
    }

    /// Verifies an export directory (manifest.json, manifest.sig and, if present, signing_key.pub).
    public func verifyDirectory(_ directory: URL) throws -> Manifest {
        let shippedKey = directory.appendingPathComponent(Self.publicKeyFile)
        if FileManager.default.fileExists(atPath: shippedKey.path) {
            let text = try String(decoding: Data(contentsOf: shippedKey), as: UTF8.self)
            guard try Self.decodeBase64(text, what: Self.publicKeyFile) == pinnedPublicKey else {
                throw ManifestError("\(Self.publicKeyFile): is not the pinned public key")
            }
        }
        return try verify(
            manifestBytes: Data(contentsOf: directory.appendingPathComponent(Self.manifestFile)),
            signatureFile: Data(contentsOf: directory.appendingPathComponent(Self.signatureFile)))
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
