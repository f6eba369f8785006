import CryptoKit
import Foundation
import XCTest
@testable import HarmonyKit

/// Updates through the model store: a newer manifest signed by the pinned key installs and switches;
/// an older one (rollback), a reused version with other content, another key's signature and a
/// tampered artifact are refused and the installed export stays. A slot-gated tier's slot prototypes
/// install with its artifact and are checked likewise. Variant choice prefers a passing one.
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

    /// The vector's manifest at `version` (nil: without the field), changed by `edit`, signed by `key`.
    private func signed(
        _ version: Int?, model: String = "golden-v1", key: P256.Signing.PrivateKey? = nil,
        edit: (inout [String: Any]) -> Void = { _ in }
    ) throws -> (Data, Data) {
        var manifest = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(vectors.manifestText.utf8)) as? [String: Any])
        edit(&manifest)
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

    /// The vector's manifest with entry-android gated by the slot margin, and `prototypes` published.
    private func slotGated(_ version: Int, prototypes: Data) throws -> (Data, Data) {
        published["slot_prototypes.hmft"] = prototypes
        return try signed(version) { manifest in
            let tiers = manifest["tiers"] as? [[String: Any]] ?? []
            manifest["tiers"] = tiers.map { (entry: [String: Any]) -> [String: Any] in
                var tier = entry
                if tier["name"] as? String == "entry-android" {
                    tier["exit_rule"] = "slot_margin"
                    tier["threshold"] = 0.25
                }
                return tier
            }
            manifest["slot_prototypes"] = [
                "path": "slot_prototypes.hmft", "sha256": Hex.encode(SHA256.hash(data: prototypes)),
                "size": prototypes.count, "shape": [10, 4096],
            ] as [String: Any]
        }
    }

    /// Ten unit prototypes of the 64x8x8 interface: slot s points along feature s.
    private func unitPrototypes() throws -> Data {
        var values = [Float](repeating: 0, count: 10 * 4096)
        for slot in 0..<10 {
            values[slot * 4096 + slot] = 1
        }
        return try FeatureTensor(values: values, shape: [10, 4096]).encoded()
    }

    func testASlotGatedTierInstallsItsPrototypesAndGatesByThem() throws {
        let prototypes = try unitPrototypes()
        let installed = try XCTUnwrap(try install(try slotGated(4, prototypes: prototypes)))
        XCTAssertEqual(try Data(contentsOf: XCTUnwrap(installed.slotPrototypes)), prototypes)
        let current = try XCTUnwrap(try store.current())
        let tier = try XCTUnwrap(current.manifest.tier(named: "entry-android"))
        XCTAssertEqual(tier.exitRule, .slotMargin)
        XCTAssertNil(try current.slotPrototypesData(for: XCTUnwrap(current.manifest.tier(named: "flagship"))))
        var own = [Bool](repeating: false, count: 10)
        own[3] = true
        let gate = try SlotGatePolicy.fromPrototypes(
            XCTUnwrap(current.slotPrototypesData(for: tier)), ownSlots: own, threshold: tier.threshold)
        var along = [Float](repeating: 0, count: 4096)
        along[3] = 1 // own slot 3: margin 1 - 0
        XCTAssertTrue(try gate.decide(logits: [0, 1], features: along).exitLocally)
        along[3] = 0
        along[4] = 1 // another phone's slot 4: margin 0 - 1
        XCTAssertFalse(try gate.decide(logits: [0, 1], features: along).exitLocally)
    }

    func testTamperedOrRottenSlotPrototypesAreRefused() throws {
        let prototypes = try unitPrototypes()
        let installed = try XCTUnwrap(try install(try slotGated(4, prototypes: prototypes)))
        var flipped = prototypes
        flipped[flipped.count - 1] ^= 0x01
        for tampered in [flipped, prototypes.prefix(100)] { // another sha256, another size
            let update = try slotGated(5, prototypes: prototypes)
            published["slot_prototypes.hmft"] = tampered
            XCTAssertThrowsError(try install(update)) { error in
                XCTAssertTrue(error is ManifestError)
                XCTAssertTrue("\(error)".contains("slot_prototypes.hmft"), "\(error)")
            }
            XCTAssertEqual(try store.current()?.version.manifestVersion, 4)
        }
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: root.path).filter { $0.hasPrefix(".staging-") }
        XCTAssertEqual(leftovers, [])

        try Data("bit rot".utf8).write(to: XCTUnwrap(installed.slotPrototypes))
        XCTAssertThrowsError(try store.current()) { XCTAssertTrue($0 is ManifestError) }
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
