import Foundation
import XCTest
@testable import HarmonyKit

struct ProvisioningVectors: Decodable {
    struct Device: Decodable {
        let deviceId: String
        let token: String
        let serverPublicKeyHex: String
    }

    struct Valid: Decodable {
        let name: String
        let payload: String
        let federationSecretHex: String
        let serverUrl: String?
        let device: Device?
        /// Tier names without "_", so snake_case key conversion leaves them as they are.
        let ownClasses: [String: [String]]?
    }

    struct Invalid: Decodable {
        let name: String
        let payload: String
    }

    let uriPrefix: String
    let managedConfigKey: String
    let valid: [Valid]
    let invalid: [Invalid]
}

/// The payloads export/provisioning.py writes (tests/vectors/provisioning_payloads.json), read as the app does.
final class ProvisioningTests: XCTestCase {
    func testConstantsAreThePythonOnes() throws {
        let vectors = try Vectors.load("provisioning_payloads.json", as: ProvisioningVectors.self)
        XCTAssertEqual(vectors.uriPrefix, ProvisioningPayload.uriPrefix)
        XCTAssertEqual(vectors.managedConfigKey, ProvisioningPayload.managedConfigKey)
    }

    func testEveryValidPayloadParses() throws {
        let vectors = try Vectors.load("provisioning_payloads.json", as: ProvisioningVectors.self)
        XCTAssertEqual(vectors.valid.count, 4)
        XCTAssertEqual(vectors.valid.filter { $0.ownClasses != nil }.count, 1)
        for vector in vectors.valid {
            let payload = try ProvisioningPayload.parse(vector.payload)
            XCTAssertEqual(payload.federationSecret, try hex(vector.federationSecretHex), vector.name)
            XCTAssertEqual(payload.serverURL, vector.serverUrl, vector.name)
            XCTAssertEqual(payload.device?.deviceID, vector.device?.deviceId, vector.name)
            XCTAssertEqual(payload.device?.token, vector.device?.token, vector.name)
            if let device = vector.device {
                XCTAssertEqual(payload.device?.serverPublicKey, try hex(device.serverPublicKeyHex), vector.name)
            }
            XCTAssertEqual(payload.ownClasses, vector.ownClasses, vector.name)
            for (tier, classes) in vector.ownClasses ?? [:] {
                XCTAssertEqual(payload.ownClassNames(tier: tier), classes, vector.name)
            }
            XCTAssertFalse(payload.description.contains(vector.federationSecretHex))
        }
    }

    func testOwnClassesAreRefusedUnlessEveryTierNamesDistinctClasses() throws {
        func payload(_ ownClasses: String) -> String {
            #"{"kind":"harmony-mobile/provisioning","format":1,"#
                + #""federation_secret":"aGFybW9ueSBnb2xkZW4gZmVkZXJhdGlvbiBzZWNyZXQ=","own_classes":"# + ownClasses + "}"
        }
        let parsed = try ProvisioningPayload.parse(payload(#"{"mid-ios":["T-shirt/top","Ankle boot"]}"#))
        XCTAssertEqual(parsed.ownClassNames(tier: "mid-ios"), ["T-shirt/top", "Ankle boot"])
        XCTAssertNil(parsed.ownClassNames(tier: "flagship"))
        XCTAssertNil(try ProvisioningPayload.parse(payload("null")).ownClasses)
        let tooMany = "{" + (0...64).map { #""t\#($0)":["0"]"# }.joined(separator: ",") + "}"
        let longName = "{\"" + String(repeating: "t", count: 65) + #"":["0"]}"#
        let longClass = #"{"t":[""# + String(repeating: "c", count: 129) + #""]}"#
        let manyClasses = #"{"t":["# + (0...1000).map { "\"\($0)\"" }.joined(separator: ",") + "]}"
        for refused in [tooMany, longName, longClass, manyClasses, #"{"t":[null]}"#, #"{"t":{"0":1}}"#] {
            XCTAssertThrowsError(try ProvisioningPayload.parse(payload(refused)), refused) { error in
                XCTAssertTrue("\(error)".contains("own_classes"), "\(error)")
            }
        }
    }

    func testEveryInvalidPayloadIsRefused() throws {
        let vectors = try Vectors.load("provisioning_payloads.json", as: ProvisioningVectors.self)
        XCTAssertTrue(vectors.invalid.count >= 15)
        for vector in vectors.invalid {
            XCTAssertThrowsError(try ProvisioningPayload.parse(vector.payload), vector.name)
        }
    }

    func testASecretIsCheckedAgainstTheManifestsSlotTable() throws {
        let signed = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let manifest = try ManifestVerifier(pinnedPublicKey: try hex(signed.publicKey)).verify(
            manifestBytes: Data(signed.manifestText.utf8), signatureFile: Data(signed.signatureFile.utf8))
        let golden = try hex(try Vectors.load("label_tokens.json", as: LabelTokenVectors.self).federationSecret)
        try SecretCheck.requireMatches(try FederationKey(secret: golden), manifest: manifest)
        var other = golden
        other[other.startIndex] ^= 1
        XCTAssertThrowsError(try SecretCheck.requireMatches(try FederationKey(secret: other), manifest: manifest))
    }
}
