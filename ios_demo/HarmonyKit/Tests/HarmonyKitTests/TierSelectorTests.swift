import XCTest
@testable import HarmonyKit

final class TierSelectorTests: XCTestCase {
    /// A tier as the manifest describes it (decoded from JSON, like the app does).
    static func tier(
        _ name: String, depth: Int, width: Double, backends: [String], threshold: Double = 0.9
    ) throws -> TierEntry {
        let artifacts = backends.map { backend -> [String: Any] in
            let coreml = backend == "coreml"
            return [
                "backend": backend, "quantization": coreml ? "coreml-fp16" : "fp32",
                "format": coreml ? "mlpackage" : "pte",
                "path": "tiers/\(name)/front_\(coreml ? "coreml-fp16.mlpackage" : "fp32.pte")",
                "sha256": String(repeating: "0", count: 64), "size": 1, "batch": [1, 1], "parameters": NSNull(),
                "extra": [String: Any](),
            ]
        }
        let json: [String: Any] = [
            "name": name, "family": "cnn", "split_depth": depth, "width": width, "client_id": 0, "parameters": 10,
            "input": ["name": "image", "shape": [1, 1, 28, 28], "dtype": "float32"],
            "normalization": ["pixel_scale": 1.0 / 255.0, "mean": [0.1307], "std": [0.3081]],
            "outputs": [
                ["name": "exit_logits", "shape": [1, 10], "dtype": "float32"],
                ["name": "features", "shape": [1, 64, 8, 8], "dtype": "float32"],
            ],
            "class_names": (0..<10).map { String($0) }, "interface_shape": [64, 8, 8], "threshold": threshold,
            "threshold_source": "tier", "quantization": ["fp32"], "backends": backends.sorted(),
            "latency_budget_ms": 5.0, "artifacts": artifacts,
        ]
        return try JSONDecoder().decode(TierEntry.self, from: JSONSerialization.data(withJSONObject: json))
    }

    static func defaultTiers() throws -> [TierEntry] {
        [
            try tier("entry-android", depth: 1, width: 1.0, backends: ["xnnpack"]),        // cost 1
            try tier("mid-android", depth: 2, width: 1.0, backends: ["xnnpack"]),          // cost 2
            try tier("mid-ios", depth: 2, width: 1.0, backends: ["coreml", "xnnpack"]),    // cost 2
            try tier("flagship", depth: 3, width: 2.0, backends: ["coreml", "xnnpack"]),   // cost 12
        ]
    }

    let entryAndroid = DeviceCapabilities(platform: .android, totalRAMMB: 2048, bigCores: 2, hasNPU: false, osVersion: 33)
    let midAndroid = DeviceCapabilities(platform: .android, totalRAMMB: 4096, bigCores: 2, hasNPU: false, osVersion: 34)
    let flagshipAndroid = DeviceCapabilities(platform: .android, totalRAMMB: 8192, bigCores: 4, hasNPU: true, osVersion: 35)
    let midIPhone = DeviceCapabilities(platform: .ios, totalRAMMB: 4096, bigCores: 2, hasNPU: true, osVersion: 17)
    let flagshipIPhone = DeviceCapabilities(platform: .ios, totalRAMMB: 8192, bigCores: 2, hasNPU: true, osVersion: 18)

    func testDeviceClasses() {
        XCTAssertEqual(DeviceClass.of(entryAndroid), .entry)
        XCTAssertEqual(DeviceClass.of(midAndroid), .mid)
        XCTAssertEqual(DeviceClass.of(flagshipAndroid), .flagship)
        XCTAssertEqual(DeviceClass.of(midIPhone), .mid)
        XCTAssertEqual(DeviceClass.of(flagshipIPhone), .flagship)
        // "6 GB" phones report a little under 6 GiB.
        XCTAssertEqual(DeviceClass.of(DeviceCapabilities(platform: .ios, totalRAMMB: 5_700, bigCores: 2, hasNPU: true, osVersion: 17)), .flagship)
        XCTAssertEqual(DeviceClass.of(DeviceCapabilities(platform: .android, totalRAMMB: 8192, bigCores: 4, hasNPU: true, osVersion: 28)), .entry)
        XCTAssertEqual(DeviceClass.of(DeviceCapabilities(platform: .android, totalRAMMB: 8192, bigCores: 0, hasNPU: true, osVersion: 35)), .entry)
        XCTAssertEqual(DeviceClass.of(DeviceCapabilities(platform: .android, totalRAMMB: 8192, bigCores: 4, hasNPU: true, osVersion: 35, lowRAMDevice: true)), .entry)
    }

    func testEachClassGetsTheMostExpensiveTierItAffords() throws {
        let tiers = try Self.defaultTiers()
        XCTAssertEqual(try TierSelector.select(from: tiers, for: entryAndroid).name, "entry-android")
        XCTAssertEqual(try TierSelector.select(from: tiers, for: midAndroid).name, "mid-android")
        XCTAssertEqual(try TierSelector.select(from: tiers, for: flagshipAndroid).name, "flagship")
        XCTAssertEqual(try TierSelector.select(from: tiers, for: flagshipIPhone).name, "flagship")
    }

    func testTiesPreferNativeTiersThenCoreMLOnANeuralEngine() throws {
        let tiers = try Self.defaultTiers()
        // mid-android and mid-ios cost the same: Android prefers the tier made only for it ...
        XCTAssertEqual(try TierSelector.select(from: tiers, for: midAndroid).name, "mid-android")
        // ... an iPhone with a Neural Engine the one with a Core ML artifact.
        XCTAssertEqual(try TierSelector.select(from: tiers, for: midIPhone).name, "mid-ios")
        let noNPU = DeviceCapabilities(platform: .ios, totalRAMMB: 4096, bigCores: 2, hasNPU: false, osVersion: 17)
        // Both run everywhere on iOS; without an NPU the smaller name wins, deterministically.
        XCTAssertEqual(try TierSelector.select(from: tiers, for: noNPU).name, "mid-android")
    }

    func testAndroidNeverGetsACoreMLOnlyTier() throws {
        let tiers = [
            try Self.tier("coreml-only", depth: 1, width: 1.0, backends: ["coreml"]),
            try Self.tier("big-xnnpack", depth: 3, width: 2.0, backends: ["xnnpack"]),
        ]
        // Nothing affordable for an entry phone: the cheapest runnable tier.
        XCTAssertEqual(try TierSelector.select(from: tiers, for: entryAndroid).name, "big-xnnpack")
        XCTAssertEqual(try TierSelector.select(from: tiers, for: midIPhone).name, "coreml-only")
        XCTAssertThrowsError(try TierSelector.select(from: [tiers[0]], for: midAndroid))
    }

    func testGoldenManifestTiers() throws {
        let vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let manifest = try ManifestVerifier(pinnedPublicKey: hex(vectors.publicKey)).verify(
            manifestBytes: Data(vectors.manifestText.utf8), signatureFile: Data(vectors.signatureFile.utf8))
        XCTAssertEqual(try TierSelector.select(from: manifest.tiers, for: entryAndroid).name, "entry-android")
        XCTAssertEqual(try TierSelector.select(from: manifest.tiers, for: flagshipAndroid).name, "flagship")
        XCTAssertEqual(try TierSelector.select(from: manifest.tiers, for: midIPhone).name, "entry-android")
    }

    func testNormalization() throws {
        let tier = try Self.tier("t", depth: 1, width: 1, backends: ["xnnpack"])
        let values = try tier.normalization.apply(pixels: [0, 255], channels: 1)
        XCTAssertEqual(values[0], Float((0.0 - 0.1307) / 0.3081))
        XCTAssertEqual(values[1], Float((1.0 - 0.1307) / 0.3081))
        XCTAssertThrowsError(try tier.normalization.apply(pixels: [0, 1, 2], channels: 3))
    }
}
