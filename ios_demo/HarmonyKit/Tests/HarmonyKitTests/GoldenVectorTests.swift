import CryptoKit
import XCTest
@testable import HarmonyKit

/// Byte equality with the Python implementation on every golden vector kind of tests/vectors.
final class GoldenVectorTests: XCTestCase {
    // MARK: - error_bodies.json (`error` on /v2 routes, `detail` on /v1 routes)

    func testErrorBodiesGiveTheServersSentence() throws {
        struct ErrorVectors: Decodable {
            struct Case: Decodable {
                let name: String
                let status: Int
                let body: String
                let message: String
            }
            let cases: [Case]
        }
        let vectors = try Vectors.load("error_bodies.json", as: ErrorVectors.self)
        XCTAssertGreaterThanOrEqual(vectors.cases.count, 10)
        for vector in vectors.cases {
            let response = HTTPResponse(status: vector.status, body: Data(vector.body.utf8))
            let error = HarmonyHTTPClient.error(from: response)
            XCTAssertEqual(error.detail, vector.message, vector.name)
            XCTAssertEqual(error.status, vector.status, vector.name)
        }
    }

    // MARK: - feature_encoding.json (HMFT tensors, HMUP plaintexts)

    func testTensorsEncodeToTheGoldenBytes() throws {
        let vectors = try Vectors.load("feature_encoding.json", as: FeatureEncodingVectors.self)
        XCTAssertEqual(vectors.tensors.count, 5)
        for vector in vectors.tensors {
            // float32 values are written as the exact decimal of their double value: narrowing gives the bits back
            let tensor = try FeatureTensor(values: vector.values.map { Float($0) }, shape: vector.shape)
            XCTAssertEqual(Hex.encode(tensor.encoded()), vector.hmft, vector.name)
            let decoded = try FeatureTensor.decode(hex(vector.hmft))
            XCTAssertEqual(decoded.shape, vector.shape, vector.name)
            XCTAssertEqual(Hex.encode(decoded.encoded()), vector.hmft, vector.name)
        }
    }

    func testTheDocumentedTensorExample() throws {
        let tensor = try FeatureTensor(values: [1.0, -2.5], shape: [1, 2])
        XCTAssertEqual(Hex.encode(tensor.encoded()), "484d46540101020001000000020000000000803f000020c0")
    }

    func testUploadPlaintextsAndMetadataAreByteEqual() throws {
        let vectors = try Vectors.load("feature_encoding.json", as: FeatureEncodingVectors.self)
        let secret = try hex(Vectors.load("label_tokens.json", as: LabelTokenVectors.self).federationSecret)
        XCTAssertEqual(vectors.uploads.count, 3)
        for vector in vectors.uploads {
            let tokens = try LabelTokens(federationSecret: secret, labelEpoch: vector.labelEpoch)
            let labelTokens = try vector.classNames.map { try tokens.token(className: $0) }
            XCTAssertEqual(labelTokens.map { Hex.encode($0) }, vector.metadata.labelTokens, vector.name)
            let metadata = try UploadMetadata(
                labelTokens: labelTokens, splitDepths: vector.metadata.splitDepths, family: vector.metadata.family,
                tier: vector.metadata.tier, modelVersion: vector.metadata.modelVersion,
                clipNorm: vector.metadata.clipNorm, noiseMultiplier: vector.metadata.noiseMultiplier,
                labelDPEpsilon: vector.metadata.labelDpEpsilon)
            XCTAssertEqual(metadata.jsonText(), vector.metadataJson, vector.name)
            let features = try FeatureTensor(values: vector.values.map { Float($0) }, shape: vector.shape)
            let plaintext = try UploadPlaintext.encode(metadata: metadata, features: features)
            XCTAssertEqual(Hex.encode(plaintext), vector.plaintext, vector.name)
        }
    }

    func testTheProtocolAppendixPlaintext() throws {
        // docs/PROTOCOL.md A.2: two rows of shape (1, 2, 2), values 0, 0.25, ..., 1.75
        let metadata = try UploadMetadata(
            labelTokens: [hex("0123456789abcdef"), hex("fedcba9876543210")], splitDepths: [1, 2], family: "cnn",
            tier: "entry-android", modelVersion: "v1")
        let features = try FeatureTensor(values: (0..<8).map { Float($0) / 4 }, shape: [2, 1, 2, 2])
        let expected = "484d555001880000007b226c6162656c5f746f6b656e73223a5b22303132333435363738396162636465"
            + "66222c2266656463626139383736353433323130225d2c2273706c69745f646570746873223a5b312c325d2c2266"
            + "616d696c79223a22636e6e222c2274696572223a22656e7472792d616e64726f6964222c226d6f64656c5f7665"
            + "7273696f6e223a227631227d484d46540101040002000000010000000200000002000000000000000000803e00"
            + "00003f0000403f0000803f0000a03f0000c03f0000e03f"
        XCTAssertEqual(Hex.encode(try UploadPlaintext.encode(metadata: metadata, features: features)), expected)
    }

    // MARK: - feature_clipping.json (z * min(1, C / ||z||) per row, docs/PROTOCOL.md 4.4)

    func testFeatureClippingEqualsPython() throws {
        let vectors = try Vectors.load("feature_clipping.json", as: FeatureClippingVectors.self)
        XCTAssertEqual(vectors.cases.count, 5)
        for vector in vectors.cases {
            let rowLength = try XCTUnwrap(vector.rows.first).count
            let features = try FeatureTensor(
                values: vector.rows.flatMap { $0.map { Float($0) } }, shape: [vector.rows.count, rowLength])
            let clipped = try FeatureClipping.clipRows(features, clip: vector.clip)
            XCTAssertEqual(clipped.shape, features.shape, vector.name)
            let expected = Array(vector.clipped.joined())
            XCTAssertEqual(clipped.values.count, expected.count, vector.name)
            // The vector's bound for float64 arithmetic rounded to float32: 1e-6 relative (zeros exact).
            for (value, python) in zip(clipped.values, expected) {
                XCTAssertEqual(Double(value), python, accuracy: 1e-6 * abs(python), vector.name)
            }
            // Label DP's default sample id hashes the row before clipping (the phones draw no label DP
            // yet; this pins the bytes an implementation would key its stored draws on).
            XCTAssertEqual(vector.sampleIds.count, vector.rows.count, vector.name)
            for (row, sampleID) in zip(vector.rows, vector.sampleIds) {
                var bytes = Data()
                for value in row {
                    bytes.appendLittleEndian(Float(value).bitPattern)
                }
                XCTAssertEqual(Hex.encode(SHA256.hash(data: bytes)), sampleID, vector.name)
            }
        }
        let row = try FeatureTensor(values: [3, 4], shape: [1, 2])
        XCTAssertThrowsError(try FeatureClipping.clipRows(row, clip: 0))
        XCTAssertThrowsError(try FeatureClipping.clipRows(row, clip: .infinity))
    }

    // MARK: - label_tokens.json

    func testEpochKeysAndClassNameTokens() throws {
        let vectors = try Vectors.load("label_tokens.json", as: LabelTokenVectors.self)
        let secret = try hex(vectors.federationSecret)
        XCTAssertEqual(vectors.cases.count, 5)
        for vector in vectors.cases {
            let tokens = try LabelTokens(federationSecret: secret, labelEpoch: vector.labelEpoch)
            XCTAssertEqual(Hex.encode(tokens.epochKey), vector.epochKey, "epoch \(vector.labelEpoch)")
            XCTAssertEqual(vector.tokens.count, 15)
            for (className, token) in vector.tokens {
                XCTAssertEqual(Hex.encode(try tokens.token(className: className)), token,
                               "epoch \(vector.labelEpoch) class \(className)")
            }
        }
    }

    func testInvalidEpochsAndShortSecretsAreRefused() throws {
        let vectors = try Vectors.load("label_tokens.json", as: LabelTokenVectors.self)
        let secret = try hex(vectors.federationSecret)
        for epoch in vectors.invalidEpochs {
            XCTAssertThrowsError(try LabelTokens(federationSecret: secret, labelEpoch: epoch), epoch)
        }
        XCTAssertThrowsError(try LabelTokens(federationSecret: Data(count: 15), labelEpoch: "e0"))
        XCTAssertThrowsError(try LabelTokens(federationSecret: secret, labelEpoch: "e0").token(className: ""))
    }

    // MARK: - slot_mapping.json

    func testSlotClassesEqualPython() throws {
        let vectors = try Vectors.load("slot_mapping.json", as: SlotMappingVectors.self)
        let key = try FederationKey(secret: hex(vectors.federationSecret))
        XCTAssertEqual(vectors.cases.count, 4)
        for vector in vectors.cases {
            let tokens = try key.tokens(labelEpoch: vector.labelEpoch)
            XCTAssertEqual(
                try tokens.slotClasses(classNames: vector.classNames, slotTable: vector.slotTable), vector.slotClasses,
                vector.name)
        }
        let tokens = try key.tokens(labelEpoch: "e7")
        XCTAssertThrowsError(try tokens.slotClasses(classNames: ["0"], slotTable: ["0123456789ABCDEF"]))
        XCTAssertThrowsError(try tokens.slotClasses(classNames: ["0"], slotTable: ["0123"]))
    }

    // MARK: - exit_order.json (exit heads in token order, tokens compared as unsigned bytes)

    func testExitOrderEqualsPython() throws {
        let vectors = try Vectors.load("exit_order.json", as: ExitOrderVectors.self)
        let key = try FederationKey(secret: hex(vectors.federationSecret))
        XCTAssertEqual(vectors.cases.count, 5)
        for vector in vectors.cases {
            let tokens = try key.tokens(labelEpoch: vector.labelEpoch)
            XCTAssertEqual(
                try vector.classNames.map { try Hex.encode(tokens.token(className: $0)) }, vector.tokens, vector.name)
            XCTAssertEqual(try tokens.exitOrder(classNames: vector.classNames), vector.exitClasses, vector.name)

            let decoder = try ExitDecoder(federationKey: key, labelEpoch: vector.labelEpoch, classNames: vector.classNames)
            XCTAssertEqual(decoder.outputs, vector.exitClasses.count, vector.name)
            XCTAssertEqual(decoder.exitClasses, vector.exitClasses, vector.name)
            for (output, name) in vector.exitClasses.enumerated() {
                XCTAssertEqual(
                    try decoder.classIndex(output: output), vector.classNames.firstIndex(of: name), "\(vector.name) \(output)")
            }
            XCTAssertEqual(try decoder.classIndex(output: -1), -1, "non-finite logits name no class")
            XCTAssertThrowsError(try decoder.classIndex(output: vector.exitClasses.count), vector.name)
        }
        // The last case: comparing the bytes as signed (Int8) gives another order.
        let last = try XCTUnwrap(vectors.cases.last)
        let tokens = try key.tokens(labelEpoch: last.labelEpoch)
        func signedBytes(_ name: String) throws -> [Int8] {
            try tokens.token(className: name).map { Int8(bitPattern: $0) }
        }
        let signed = try last.classNames.sorted { a, b in try signedBytes(a).lexicographicallyPrecedes(signedBytes(b)) }
        XCTAssertNotEqual(signed, last.exitClasses)
        XCTAssertThrowsError(try ExitDecoder(federationKey: key, labelEpoch: "a b", classNames: ["0"]))
    }

    // MARK: - sealed_upload.json

    func testSealedEnvelopesAreByteEqual() throws {
        let vectors = try Vectors.load("sealed_upload.json", as: SealedUploadVectors.self)
        XCTAssertEqual(vectors.cases.count, 3)
        let ephemeral = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: hex(vectors.ephemeralPrivateKey))
        XCTAssertEqual(Hex.encode(ephemeral.publicKey.rawRepresentation), vectors.ephemeralPublicKey)
        let server = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: hex(vectors.serverPrivateKey))
        XCTAssertEqual(Hex.encode(server.publicKey.rawRepresentation), vectors.serverPublicKey)
        let sealer = try UploadSealer(serverPublicKey: hex(vectors.serverPublicKey))
        for vector in vectors.cases {
            let ad = try AssociatedData(
                deviceID: vector.deviceId, labelEpoch: vector.labelEpoch,
                messageID: XCTUnwrap(UUID(uuidString: vector.messageId)))
            XCTAssertEqual(Hex.encode(ad.encoded()), vector.associatedData, vector.name)
            let envelope = try sealer.sealDeterministically(
                hex(vector.plaintext), associatedData: ad, ephemeralPrivateKey: hex(vectors.ephemeralPrivateKey),
                nonce: hex(vectors.nonce))
            XCTAssertEqual(Hex.encode(envelope), vector.envelope, vector.name)
            let opened = try UploadSealer.open(hex(vector.envelope), serverPrivateKey: server, associatedData: ad)
            XCTAssertEqual(Hex.encode(opened), vector.plaintext, vector.name)
        }
    }

    func testTheFullInterfaceUploadIsReproducedFromScratch() throws {
        // sealed_upload.json case 3: one (1, 64, 8, 8) row, values (i - 2048) / 512, class "4" in epoch "e7"
        let vectors = try Vectors.load("sealed_upload.json", as: SealedUploadVectors.self)
        let secret = try hex(Vectors.load("label_tokens.json", as: LabelTokenVectors.self).federationSecret)
        let metadata = try UploadMetadata(
            labelTokens: [LabelTokens(federationSecret: secret, labelEpoch: "e7").token(className: "4")], splitDepths: [1],
            family: "mobilenet", tier: "mid-android", modelVersion: "golden-v1")
        let features = try FeatureTensor(
            values: (0..<4096).map { (Float($0) - 2048) / 512 }, shape: [1] + FrontEndContract.interfaceShape)
        let plaintext = try UploadPlaintext.encode(metadata: metadata, features: features)
        XCTAssertEqual(Hex.encode(plaintext), vectors.cases[2].plaintext)
    }

    func testRandomSealsOpenAndTamperingFails() throws {
        let server = Curve25519.KeyAgreement.PrivateKey()
        let sealer = try UploadSealer(serverPublicKey: server.publicKey.rawRepresentation)
        let ad = try AssociatedData(deviceID: "dev_test", labelEpoch: "e3", messageID: UUID())
        let plaintext = Data("features".utf8)
        let first = try sealer.seal(plaintext, associatedData: ad)
        let second = try sealer.seal(plaintext, associatedData: ad)
        XCTAssertNotEqual(first, second, "fresh ephemeral key and nonce per upload")
        XCTAssertEqual(first.count, UploadSealer.headerBytes + plaintext.count + UploadSealer.tagBytes)
        XCTAssertEqual(try UploadSealer.open(first, serverPrivateKey: server, associatedData: ad), plaintext)
        var tampered = first
        tampered[tampered.count - 1] ^= 1
        XCTAssertThrowsError(try UploadSealer.open(tampered, serverPrivateKey: server, associatedData: ad))
        let otherEpoch = try AssociatedData(deviceID: "dev_test", labelEpoch: "e4", messageID: ad.messageID)
        XCTAssertThrowsError(try UploadSealer.open(first, serverPrivateKey: server, associatedData: otherEpoch))
        XCTAssertThrowsError(try AssociatedData(deviceID: "dev_test", labelEpoch: "", messageID: ad.messageID))
        XCTAssertThrowsError(try AssociatedData(deviceID: "dev_test", labelEpoch: "e 1", messageID: ad.messageID))
    }

    // MARK: - tier_selection.json, pixel_normalization.json

    func testDeviceClassesAndSelectedTiersEqualPython() throws {
        let vectors = try Vectors.load("tier_selection.json", as: TierSelectionVectors.self)
        XCTAssertEqual(vectors.cases.count, 39)
        for vector in vectors.cases {
            let tiers = try XCTUnwrap(vectors.tierSets[vector.tiers]).map {
                try TierSelectorTests.tier($0.name, depth: $0.splitDepth, width: $0.width, backends: $0.backends)
            }
            let device = DeviceCapabilities(
                platform: try XCTUnwrap(Platform(rawValue: vector.device.platform)), totalRAMMB: vector.device.totalRamMb,
                bigCores: vector.device.bigCores, hasNPU: vector.device.hasNpu, osVersion: vector.device.osVersion,
                lowRAMDevice: vector.device.lowRamDevice)
            let label = "\(vector.tiers) / \(vector.deviceName)"
            XCTAssertEqual(DeviceClass.of(device).rawValue, vector.deviceClass, label)
            if let selected = vector.selected {
                XCTAssertEqual(try TierSelector.select(from: tiers, for: device).name, selected, label)
            } else {
                XCTAssertThrowsError(try TierSelector.select(from: tiers, for: device), label)
            }
        }
    }

    func testNormalizedPixelsEqualPython() throws {
        let vectors = try Vectors.load("pixel_normalization.json", as: PixelNormalizationVectors.self)
        XCTAssertEqual(vectors.cases.count, 4)
        for vector in vectors.cases {
            // the memberwise initializer (internal, hence @testable): no JSON round trip of the doubles
            let normalization = Normalization(pixelScale: vector.pixelScale, mean: vector.mean, std: vector.std)
            XCTAssertEqual(
                try normalization.apply(pixels: vector.pixels, channels: vector.channels), vector.values.map { Float($0) },
                vector.name)
        }
    }

    // MARK: - exit_decisions.json

    func testExitDecisions() throws {
        let vectors = try Vectors.load("exit_decisions.json", as: ExitDecisionVectors.self)
        XCTAssertFalse(vectors.cases.isEmpty)
        for vector in vectors.cases {
            let decision = try ExitPolicy(threshold: vector.threshold).decide(vector.logits.map { Float($0) })
            XCTAssertEqual(decision.topOutput, vector.predictedClass, "\(vector.logits)")
            XCTAssertEqual(decision.confidence, vector.confidence, accuracy: 1e-12, "\(vector.logits)")
            XCTAssertEqual(decision.exitLocally, vector.exitLocally, "\(vector.logits)")
        }
    }

    func testNonFiniteLogitsNeverExit() throws {
        let policy = try ExitPolicy(threshold: 0.5)
        for logits: [Float] in [[.nan, 1], [.infinity, 0], [-.infinity, 2]] {
            let decision = policy.decide(logits)
            XCTAssertFalse(decision.exitLocally)
            XCTAssertEqual(decision.topOutput, -1)
        }
        XCTAssertThrowsError(try ExitPolicy(threshold: 0))
        XCTAssertThrowsError(try ExitPolicy(threshold: 1.01))
    }

    // MARK: - slot_gate_decisions.json

    func testSlotGateDecisions() throws {
        let vectors = try Vectors.load("slot_gate_decisions.json", as: SlotGateVectors.self)
        XCTAssertFalse(vectors.cases.isEmpty)
        for vector in vectors.cases {
            let policy = try SlotGatePolicy(
                prototypes: vector.prototypes.map { $0.map { Float($0) } }, ownSlots: vector.ownSlots,
                threshold: vector.threshold)
            let decision = try policy.decide(
                logits: vector.logits.map { Float($0) }, features: vector.features.map { Float($0) })
            XCTAssertEqual(decision.topOutput, vector.topOutput, "\(vector.features)")
            XCTAssertEqual(decision.confidence, vector.margin, accuracy: 1e-12, "\(vector.features)")
            XCTAssertEqual(decision.exitLocally, vector.exitLocally, "\(vector.features)")
            // the same prototypes as the manifest ships them: one HMFT tensor [slots, features]
            let file = try FeatureTensor(
                values: policy.prototypes.flatMap { $0 }, shape: [policy.prototypes.count, policy.prototypes[0].count])
            let fromFile = try SlotGatePolicy.fromPrototypes(
                file.encoded(), ownSlots: vector.ownSlots, threshold: vector.threshold)
            XCTAssertEqual(fromFile.prototypes, policy.prototypes, "\(vector.features)")
        }
        let cube = try FeatureTensor(values: [1, 0, 0, 1], shape: [1, 2, 2]).encoded()
        XCTAssertThrowsError(try SlotGatePolicy.fromPrototypes(cube, ownSlots: [true], threshold: 0))
        XCTAssertEqual(
            SlotGatePolicy.ownSlots(slotClasses: ["cat", nil, "dog", "bird"], ownClassNames: ["bird", "cat"]),
            [true, false, false, true])
    }

    func testSlotGateNonFiniteInputsNeverExit() throws {
        let policy = try SlotGatePolicy(prototypes: [[1, 0], [0, 1]], ownSlots: [true, false], threshold: -2)
        let broken = try policy.decide(logits: [1, 0], features: [.nan, 1])
        XCTAssertFalse(broken.exitLocally)
        XCTAssertEqual(broken.topOutput, 0)  // the exit head's answer is still named
        XCTAssertTrue(broken.confidence.isNaN)
        XCTAssertFalse(try policy.decide(logits: [.nan, 0], features: [1, 0]).exitLocally)
        XCTAssertTrue(try policy.decide(logits: [1, 0], features: [1, 0]).exitLocally)
        XCTAssertThrowsError(try SlotGatePolicy(prototypes: [[1]], ownSlots: [true, false], threshold: 0))
        XCTAssertThrowsError(try policy.margin([1, 0, 0]))
    }

    // MARK: - manifest_signature.json

    func testManifestSignatureVerifiesAndArtifactsMatch() throws {
        let vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let verifier = try ManifestVerifier(pinnedPublicKey: hex(vectors.publicKey))
        XCTAssertEqual(try ManifestVerifier(publicKeyFile: vectors.signingKeyPub).pinnedPublicKey, verifier.pinnedPublicKey)
        let manifest = try verifier.verify(
            manifestBytes: Data(vectors.manifestText.utf8), signatureFile: Data(vectors.signatureFile.utf8))
        XCTAssertEqual(manifest.tiers.map(\.name), ["entry-android", "flagship"])
        XCTAssertEqual(manifest.modelVersion, "golden-v1")
        let tier = try XCTUnwrap(manifest.tier(named: "entry-android"))
        XCTAssertEqual(tier.threshold, 0.9)
        XCTAssertEqual(tier.input.name, FrontEndContract.inputName)
        XCTAssertEqual(tier.outputs.map(\.name), [FrontEndContract.logitsOutputName, FrontEndContract.featuresOutputName])
        XCTAssertEqual(try FrontEndContract.check(tier).features, 1)

        let directory = try writeExport(vectors)
        defer { try? FileManager.default.removeItem(at: directory) }
        XCTAssertEqual(try verifier.verifyDirectory(directory), manifest)
        for artifact in manifest.tiers.flatMap(\.artifacts) {
            XCTAssertNoThrow(try ManifestVerifier.verifyArtifact(artifact, in: directory))
        }
        let artifact = try XCTUnwrap(tier.artifact(backend: "xnnpack", quantization: "int8"))
        try Data("golden pte int8 tampered".utf8).write(to: directory.appendingPathComponent(artifact.path))
        XCTAssertThrowsError(try ManifestVerifier.verifyArtifact(artifact, in: directory))
    }

    func testTamperedManifestsAreRejected() throws {
        let vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let verifier = try ManifestVerifier(pinnedPublicKey: hex(vectors.publicKey))
        let manifest = Data(vectors.manifestText.utf8)
        let signature = Data(vectors.signatureFile.utf8)
        for index in stride(from: 0, to: manifest.count, by: max(1, manifest.count / 40)) {
            var changed = manifest
            changed[index] ^= 0x01
            XCTAssertThrowsError(try verifier.verify(manifestBytes: changed, signatureFile: signature), "byte \(index)")
        }
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest + Data("\n".utf8), signatureFile: signature))
        var raw = try XCTUnwrap(Data(base64Encoded: vectors.signatureFile))
        raw[0] ^= 0x80
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest, signatureFile: Data(raw.base64EncodedString().utf8)))
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest, signatureFile: Data("not base64!".utf8)))
        let otherKey = Curve25519.Signing.PrivateKey()
        let stranger = try ManifestVerifier(pinnedPublicKey: otherKey.publicKey.rawRepresentation)
        XCTAssertThrowsError(try stranger.verify(manifestBytes: manifest, signatureFile: signature))
        // Signed by the other key, but the pinned key is still the golden one.
        let forged = try otherKey.signature(for: manifest).base64EncodedString()
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest, signatureFile: Data(forged.utf8)))
        // A replaced signing_key.pub beside the manifest is refused.
        let directory = try writeExport(vectors)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(otherKey.publicKey.rawRepresentation.base64EncodedString().utf8)
            .write(to: directory.appendingPathComponent(ManifestVerifier.publicKeyFile))
        XCTAssertThrowsError(try verifier.verifyDirectory(directory))
    }

    // MARK: - manifest_signature.json, ECDSA P-256 (the signature the Android app checks)

    func testP256ManifestSignatureVerifies() throws {
        let vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let verifier = try ManifestVerifier(pinnedP256PublicKey: hex(vectors.p256PublicKey))
        XCTAssertEqual(try ManifestVerifier(p256PublicKeyFile: vectors.signingKeyP256Pub).pinnedKey, verifier.pinnedKey)
        let manifest = try verifier.verify(
            manifestBytes: Data(vectors.manifestText.utf8), signatureFile: Data(vectors.p256SignatureFile.utf8))
        XCTAssertEqual(manifest.modelVersion, "golden-v1")
        XCTAssertEqual(manifest.labelEpoch, "mnist5k-2026-11")
        let key = try FederationKey(secret: hex(Vectors.load("label_tokens.json", as: LabelTokenVectors.self).federationSecret))
        let table = try SlotTable(labelEpoch: XCTUnwrap(manifest.labelEpoch), tokens: XCTUnwrap(manifest.slotTable))
        XCTAssertEqual(try key.tokens(labelEpoch: table.labelEpoch).slotClasses(classNames: manifest.classNames,
                                                                                 slotTable: table.tokens),
                       "3170952846".map { Optional(String($0)) })

        let directory = try writeExport(vectors)
        defer { try? FileManager.default.removeItem(at: directory) }
        XCTAssertEqual(try verifier.verifyDirectory(directory), manifest)
        let other = P256.Signing.PrivateKey()
        try Data(other.publicKey.derRepresentation.base64EncodedString().utf8)
            .write(to: directory.appendingPathComponent(ManifestVerifier.p256PublicKeyFile))
        XCTAssertThrowsError(try verifier.verifyDirectory(directory))
    }

    func testTamperedManifestsFailTheP256Check() throws {
        let vectors = try Vectors.load("manifest_signature.json", as: ManifestVectors.self)
        let verifier = try ManifestVerifier(pinnedP256PublicKey: hex(vectors.p256PublicKey))
        let manifest = Data(vectors.manifestText.utf8)
        let signature = Data(vectors.p256SignatureFile.utf8)
        for index in stride(from: 0, to: manifest.count, by: max(1, manifest.count / 40)) {
            var changed = manifest
            changed[index] ^= 0x01
            XCTAssertThrowsError(try verifier.verify(manifestBytes: changed, signatureFile: signature), "byte \(index)")
        }
        // The Ed25519 signature file is no P-256 signature.
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest, signatureFile: Data(vectors.signatureFile.utf8)))
        let other = P256.Signing.PrivateKey()
        let forged = try other.signature(for: manifest).derRepresentation.base64EncodedString()
        XCTAssertThrowsError(try verifier.verify(manifestBytes: manifest, signatureFile: Data(forged.utf8)))
        let stranger = try ManifestVerifier(pinnedP256PublicKey: other.publicKey.derRepresentation)
        XCTAssertThrowsError(try stranger.verify(manifestBytes: manifest, signatureFile: signature))
        XCTAssertThrowsError(try ManifestVerifier(pinnedP256PublicKey: hex(vectors.publicKey)))
    }

    func testTreeDigestMatchesThePythonExporter() throws {
        // Fixtures/tree_digest.json holds export/manifest.py path_digest() of Fixtures/tree (checked by
        // tests/test_ios_contract.py on the Python side).
        struct Expected: Decodable {
            let sha256: String
            let size: Int64
        }
        let expected = try JSONDecoder().decode(
            Expected.self, from: Data(contentsOf: Vectors.fixtures.appendingPathComponent("tree_digest.json")))
        let actual = try ManifestVerifier.treeDigest(of: Vectors.fixtures.appendingPathComponent("tree", isDirectory: true))
        XCTAssertEqual(actual.sha256, expected.sha256)
        XCTAssertEqual(actual.size, expected.size)
    }

    func testJSONNumbersFollowPydantic() {
        let cases: [(Double, String)] = [
            (1.0, "1.0"), (0.5, "0.5"), (0.0, "0.0"), (-2.5, "-2.5"), (100.0, "100.0"), (0.1, "0.1"),
            (0.0001, "0.0001"), (1e-5, "0.00001"), (1.5e-5, "0.000015"), (1e-6, "1e-6"), (1e-7, "1e-7"),
            (2.5e-10, "2.5e-10"), (1e15, "1000000000000000.0"), (1e16, "1e+16"), (1.5e16, "1.5e+16"),
            (123456789012345680.0, "1.2345678901234568e+17"), (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ]
        for (value, text) in cases {
            XCTAssertEqual(JSONText.number(value), text, "\(value)")
        }
        XCTAssertEqual(JSONText.string("a\"\\/\u{01}\n\té😀"), "\"a\\\"\\\\/\\u0001\\n\\té😀\"")
    }

    // MARK: - helpers

    private func writeExport(_ vectors: ManifestVectors) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString, isDirectory: true)
        for artifact in vectors.artifacts {
            let url = directory.appendingPathComponent(artifact.path)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try XCTUnwrap(Data(base64Encoded: artifact.contentBase64)).write(to: url)
        }
        try Data(vectors.manifestText.utf8).write(to: directory.appendingPathComponent(ManifestVerifier.manifestFile))
        try Data(vectors.signatureFile.utf8).write(to: directory.appendingPathComponent(ManifestVerifier.signatureFile))
        try Data(vectors.signingKeyPub.utf8).write(to: directory.appendingPathComponent(ManifestVerifier.publicKeyFile))
        try Data(vectors.p256SignatureFile.utf8)
            .write(to: directory.appendingPathComponent(ManifestVerifier.p256SignatureFile))
        try Data(vectors.signingKeyP256Pub.utf8)
            .write(to: directory.appendingPathComponent(ManifestVerifier.p256PublicKeyFile))
        return directory
    }
}
