import Foundation
import XCTest
@testable import HarmonyKit

/// The golden vectors of tests/vectors (written by tests/vectors/generate.py from the Python
/// implementation), read in place through #filePath: no copy to keep in sync. Paths:
///
///     <repo>/ios_demo/HarmonyKit/Tests/HarmonyKitTests/Vectors.swift   (this file)
///     <repo>/tests/vectors/*.json
enum Vectors {
    static let repositoryRoot: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent() // HarmonyKitTests
        .deletingLastPathComponent() // Tests
        .deletingLastPathComponent() // HarmonyKit
        .deletingLastPathComponent() // ios_demo
        .deletingLastPathComponent() // repository root

    static let directory = repositoryRoot.appendingPathComponent("tests/vectors", isDirectory: true)

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures", isDirectory: true)

    /// Decodes tests/vectors/<name>; keys are snake_case in the files.
    static func load<T: Decodable>(_ name: String, as type: T.Type = T.self) throws -> T {
        let url = directory.appendingPathComponent(name)
        guard FileManager.default.fileExists(atPath: url.path) else {
            throw XCTSkip("golden vector \(url.path) not found (run the tests from a checkout of the repository)")
        }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(type, from: Data(contentsOf: url))
    }
}

func hex(_ text: String) throws -> Data {
    try Hex.decode(text)
}

// MARK: - File shapes

struct ManifestVectors: Decodable {
    struct ArtifactFile: Decodable {
        let path: String
        let contentBase64: String
    }

    let publicKey: String
    let signingKeyPub: String
    let p256PublicKey: String
    let signingKeyP256Pub: String
    let p256SignatureFile: String
    let manifestText: String
    let signatureFile: String
    let artifacts: [ArtifactFile]
}

struct SealedUploadVectors: Decodable {
    struct Case: Decodable {
        let name: String
        let deviceId: String
        let labelEpoch: String
        let messageId: String
        let associatedData: String
        let plaintext: String
        let envelope: String
    }

    let serverPrivateKey: String
    let serverPublicKey: String
    let ephemeralPrivateKey: String
    let ephemeralPublicKey: String
    let nonce: String
    let cases: [Case]
}

struct LabelTokenVectors: Decodable {
    struct Case: Decodable {
        let labelEpoch: String
        let epochKey: String
        let tokens: [String: String]
    }

    let federationSecret: String
    let invalidEpochs: [String]
    let cases: [Case]
}

struct SlotMappingVectors: Decodable {
    struct Case: Decodable {
        let name: String
        let labelEpoch: String
        let classNames: [String]
        let slotTable: [String]
        let slotClasses: [String?]
    }

    let federationSecret: String
    let cases: [Case]
}

struct ExitOrderVectors: Decodable {
    struct Case: Decodable {
        let name: String
        let labelEpoch: String
        let classNames: [String]
        let tokens: [String]
        let exitClasses: [String]
    }

    let federationSecret: String
    let cases: [Case]
}

struct ExitDecisionVectors: Decodable {
    struct Case: Decodable {
        let logits: [Double]
        let threshold: Double
        let predictedClass: Int
        let confidence: Double
        let exitLocally: Bool
    }

    let cases: [Case]
}

struct SlotGateVectors: Decodable {
    struct Case: Decodable {
        let features: [Double]
        let prototypes: [[Double]]
        let ownSlots: [Bool]
        let logits: [Double]
        let threshold: Double
        let topOutput: Int
        let margin: Double
        let exitLocally: Bool
    }

    let cases: [Case]
}

struct FeatureEncodingVectors: Decodable {
    struct TensorCase: Decodable {
        let name: String
        let shape: [Int]
        let values: [Double]
        let hmft: String
    }

    struct Metadata: Decodable {
        let labelTokens: [String]
        let splitDepths: [Int]
        let family: String
        let tier: String
        let modelVersion: String
        let clipNorm: Double?
        let noiseMultiplier: Double?
        let labelDpEpsilon: Double?
    }

    struct UploadCase: Decodable {
        let name: String
        let labelEpoch: String
        let classNames: [String]
        let metadata: Metadata
        let metadataJson: String
        let shape: [Int]
        let values: [Double]
        let plaintext: String
    }

    let tensors: [TensorCase]
    let uploads: [UploadCase]
}

struct FeatureClippingVectors: Decodable {
    struct Case: Decodable {
        let name: String
        let clip: Double
        let rows: [[Double]]
        let clipped: [[Double]]
        let sampleIds: [String]
    }

    let cases: [Case]
}

struct TierSelectionVectors: Decodable {
    struct Tier: Decodable {
        let name: String
        let splitDepth: Int
        let width: Double
        let backends: [String]
    }

    struct Device: Decodable {
        let platform: String
        let totalRamMb: Int64
        let bigCores: Int
        let hasNpu: Bool
        let osVersion: Int
        let lowRamDevice: Bool
    }

    struct Case: Decodable {
        let tiers: String
        let deviceName: String
        let device: Device
        let deviceClass: String
        let selected: String?
    }

    let tierSets: [String: [Tier]]
    let cases: [Case]
}

struct PixelNormalizationVectors: Decodable {
    struct Case: Decodable {
        let name: String
        let pixelScale: Double
        let mean: [Double]
        let std: [Double]
        let channels: Int
        let pixels: [UInt8]
        let values: [Double]
    }

    let cases: [Case]
}
