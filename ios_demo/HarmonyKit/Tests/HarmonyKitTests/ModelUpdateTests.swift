import CryptoKit
import Foundation
import XCTest
@testable import HarmonyKit

/// Updates through the model store: a newer manifest signed by the pinned key installs and switches;
/// an older one (rollback), a reused version with other content, another key's signature and a
/// tampered artifact are refused and the installed export stays. Variant choice prefers a passing one.
final class ModelUpdateTests: XCTestCase {
    private var vectors: ManifestVectors!
    private var published: [String: Data] = [:]
    private let pinned = P256.Signing.PrivateKey()
    private var root: URL!
    private var store: ModelStore!

    override func setUpWithError() throws {
        vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        for artifact in vectors.artifacts {
            published[artifact.path] = try XCTUnwrap(Data(base64Encoded: artifact.contentBase64))
        }
        root = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString, isDirectory: true)
        store = ModelStore(root: root, verifier: try ManifestVerifier(pinnedP256PublicKey: pinned.publicKey.derRepresentation))
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: root)
    }

    /// The vector's manifest at `version` (nil: without the field), signed by `key`.
    private func signed(_ version: Int?, model: String = "golden-v1", key: P256.Signing.PrivateKey? = nil) throws -> (Data, Data) {
        var manifest = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(vectors.manifestText.utf8)) as? [String: Any])
        manifest["manifest_version"] = version
        manifest["model_version"] = model
        var signature = try XCTUnwrap(manifest["signature"] as? [String: Any])
        var p256 = try XCTUnwrap(signature["p256"] as? [String: Any])
        p256["public_key_sha256"] = Hex.encode(SHA256.hash(data: pinned.publicKey.derRepresentation))
        signature["p256"] = p256
        manifest["signature"] = signature
        let bytes = try JSONSerialization.data(withJSONObject: manifest, options: [.sortedKeys])
        let signer = key ?? pinned
        return (bytes, Data(try signer.signature(for: bytes).derRepresentation.base64EncodedString().utf8))
    }

    private func install(_ signed: (Data, Data), tampered: Bool = false) throws -> ModelStore.Installed? {
        let published = self.published
        return try store.install(
            manifestBytes: signed.0, signatureFile: signed.1,
            source: { artifact, _, destination in
                try (tampered ? Data("evil".utf8) : published[artifact.path] ?? Data()).write(to: destination)
            },
            wanted: { manifest in manifest.tier(named: "entry-android")?.artifacts ?? [] })
    }

    func testANewerManifestInstallsAndSwitchesTheSameOneIsANoOp() throws {
        XCTAssertEqual(try install(try signed(7))?.version.manifestVersion, 7)
        XCTAssertNil(try install(try signed(7)))
        XCTAssertEqual(try install(try signed(8))?.version.manifestVersion, 8)
        XCTAssertEqual(try store.current()?.version.manifestVersion, 8)
        let versions = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("versions").path)
        XCTAssertEqual(versions, ["8"])
    }

    func testAnOlderOrReusedVersionIsARollback() throws {
        _ = try install(try signed(9))
        XCTAssertThrowsError(try install(try signed(8))) { XCTAssertTrue($0 is RollbackError) }
        XCTAssertThrowsError(try install(try signed(9, model: "golden-v0"))) { XCTAssertTrue($0 is RollbackError) }
        XCTAssertThrowsError(try install(try signed(nil))) { XCTAssertTrue($0 is RollbackError) }
        XCTAssertEqual(try store.current()?.version.manifestVersion, 9)
    }

    func testAnotherKeyAndATamperedArtifactAreRefused() throws {
        _ = try install(try signed(3))
        XCTAssertThrowsError(try install(try signed(4, key: P256.Signing.PrivateKey()))) { XCTAssertTrue($0 is ManifestError) }
        XCTAssertThrowsError(try install(try signed(4), tampered: true)) { XCTAssertTrue($0 is ManifestError) }
        XCTAssertEqual(try store.current()?.version.manifestVersion, 3)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: root.path).filter { $0.hasPrefix(".staging-") }
        XCTAssertEqual(leftovers, [])
    }

    func testAPassingVariantIsPreferred() throws {
        func tier(_ variants: [(String, String, String)]) throws -> TierEntry {
            let base = try TierSelectorTests.tier("t", depth: 1, width: 1.0, backends: ["xnnpack"])
            var json = try XCTUnwrap(JSONSerialization.jsonObject(with: JSONEncoder().encode(base)) as? [String: Any])
            json["artifacts"] = variants.map { backend, quantization, verdict in
                ["backend": backend, "quantization": quantization, "format": "pte", "path": "\(quantization).pte",
                 "sha256": String(repeating: "0", count: 64), "size": 1, "batch": [1, 1], "verdict": verdict] as [String: Any]
            }
            return try JSONDecoder().decode(TierEntry.self, from: JSONSerialization.data(withJSONObject: json))
        }
        func chosen(_ variants: [(String, String, String)]) throws -> String? {
            VariantChooser.choose(try tier(variants), backend: "xnnpack", preference: VariantChooser.pteQuantizations)?.quantization
        }
        XCTAssertEqual(try chosen([("xnnpack", "fp32", "pass"), ("xnnpack", "int8", "pass")]), "int8")
        XCTAssertEqual(try chosen([("xnnpack", "fp32", "pass"), ("xnnpack", "int8", "fail")]), "fp32")
        XCTAssertEqual(try chosen([("xnnpack", "fp32", "not_checked"), ("xnnpack", "int8", "fail")]), "fp32")
        XCTAssertEqual(try chosen([("xnnpack", "int8", "fail")]), "int8")
        XCTAssertNil(try chosen([("coreml", "coreml-fp16", "pass")]))
    }
}
