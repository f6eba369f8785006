import Foundation
import XCTest
@testable import HarmonyKit

/// The exit rules a manifest's tiers may name (harmony-core's TierExitRuleTest): max_softmax (also when
/// absent) and slot_margin, the latter only with the manifest's slot prototypes; a threshold on any
/// other score is refused, never misread.
final class TierExitRuleTests: XCTestCase {
    /// A `slot_prototypes` entry, with the comma that puts it before the manifest's "tiers".
    private func prototypesEntry(
        path: String = "slot_prototypes.hmft", sha256: String = String(repeating: "0", count: 64),
        shape: String = "[10, 4096]"
    ) -> String {
        #""slot_prototypes": {"path": "\#(path)", "sha256": "\#(sha256)", "size": 8, "shape": \#(shape)}, "#
    }

    /// The golden manifest with its first tier (entry-android) gated by `rule`, and `prototypes` added.
    private func manifest(rule: String? = nil, prototypes: String = "") throws -> Manifest {
        var text = try Vectors.load("manifest_signature.json", as: ManifestVectors.self).manifestText
        if let rule {
            text = text.replacingOccurrences(
                of: "\"threshold\": 0.9,", with: "\"threshold\": 0.9, \"exit_rule\": \"\(rule)\",")
        }
        text = text.replacingOccurrences(of: "\"tiers\":", with: prototypes + "\"tiers\":")
        return try JSONDecoder().decode(Manifest.self, from: Data(text.utf8))
    }

    func testATierWithoutAnExitRuleExitsByMaxSoftmax() throws {
        let plain = try manifest()
        XCTAssertEqual(plain.tiers.map(\.exitRule), [.maxSoftmax, .maxSoftmax])
        XCTAssertNil(plain.slotPrototypes)
        XCTAssertNoThrow(try ManifestVerifier.checkExitRules(plain))
        XCTAssertNoThrow(try ManifestVerifier.checkExitRules(manifest(rule: "max_softmax")))
    }

    func testASlotGatedTierComesWithTheManifestsPrototypes() throws {
        let gated = try manifest(rule: "slot_margin", prototypes: prototypesEntry())
        XCTAssertEqual(gated.tiers.map(\.exitRule), [.slotMargin, .maxSoftmax])
        XCTAssertEqual(gated.slotPrototypes?.path, "slot_prototypes.hmft")
        XCTAssertEqual(gated.slotPrototypes?.shape, [10, 4096])
        XCTAssertEqual(gated.slotPrototypes?.size, 8)
        XCTAssertNoThrow(try ManifestVerifier.checkExitRules(gated))

        XCTAssertThrowsError(try ManifestVerifier.checkExitRules(manifest(rule: "slot_margin"))) { error in
            XCTAssertTrue("\(error)".contains("exits by slot_margin: the manifest has no slot_prototypes"), "\(error)")
        }
    }

    func testATierGatedByARuleThisAppDoesNotComputeIsRefusedNotMisread() throws {
        let energy = try manifest(rule: "energy", prototypes: prototypesEntry())
        XCTAssertNil(energy.tiers.first?.exitRule)
        XCTAssertEqual(energy.tiers.first?.exitRuleName, "energy")
        XCTAssertThrowsError(try ManifestVerifier.checkExitRules(energy)) { error in
            XCTAssertTrue("\(error)".contains("exits by energy"), "\(error)")
        }
    }

    func testAMalformedPrototypesEntryIsRefused() throws {
        let entries = [
            prototypesEntry(path: "../slot_prototypes.hmft"),
            prototypesEntry(sha256: "not hex"),
            prototypesEntry(shape: "[4096]"),
            prototypesEntry(shape: "[10, 0]"),
        ]
        for entry in entries {
            let malformed = try manifest(rule: "slot_margin", prototypes: entry)
            XCTAssertThrowsError(try ManifestVerifier.checkExitRules(malformed), entry) {
                XCTAssertTrue("\($0)".contains("slot_prototypes"), "\($0)")
            }
        }
    }
}
