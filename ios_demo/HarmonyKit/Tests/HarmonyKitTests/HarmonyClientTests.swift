import CryptoKit
import XCTest
@testable import HarmonyKit

final class FakeEngine: InferenceEngine, @unchecked Sendable {
    let backend = "fake"
    let logits: [Float]

    init(logits: [Float]) {
        self.logits = logits
    }

    func run(_ input: [Float]) throws -> FrontEndOutput {
        try FrontEndOutput(
            exitLogits: logits,
            features: FeatureTensor(values: [Float](repeating: 0.25, count: 4096), shape: [1, 64, 8, 8]))
    }
}

struct FakeServer: FallbackServer {
    let answer: ServerPrediction?

    func predict(_ features: FeatureTensor) async throws -> ServerPrediction {
        XCTAssertEqual(features.shape, [1] + FrontEndContract.interfaceShape)
        guard let answer else {
            throw ServerError(status: 503, detail: "inference queue full", retryAfter: 1)
        }
        return answer
    }
}

/// Version "v2"'s slots: slot 0 = class "2", slot 1 = class "0", slot 2 = a class this phone lacks.
struct FakeSlotTables: SlotTableSource {
    static let secret = Data("harmony golden federation secret".utf8)
    let fetches: Counter

    func slotTable(version: String) async throws -> SlotTable {
        await fetches.increment()
        guard version == "v2" else { throw ServerError(status: 404, detail: "unknown version", retryAfter: nil) }
        let tokens = try LabelTokens(federationSecret: Self.secret, labelEpoch: "e1")
        let table = try ["2", "0", "zebra"].map { try Hex.encode(tokens.token(className: $0)) }
        return try SlotTable(labelEpoch: "e1", tokens: table)
    }
}

actor Counter {
    private(set) var value = 0

    func increment() {
        value += 1
    }
}

final class HarmonyClientTests: XCTestCase {
    let server = ServerPrediction(modelVersion: "v2", slotScores: [5, 0, 0], topSlot: 0, confidence: 0.98)
    let fetches = Counter()

    func makeDecoder() throws -> SlotDecoder {
        let key = try FederationKey(secret: FakeSlotTables.secret)
        return SlotDecoder(federationKey: key, classNames: ["0", "1", "2"], source: FakeSlotTables(fetches: fetches))
    }

    /// Exit outputs in token order under "e1" (protocol/label_tokens.py exit_order): output 0 = class "0",
    /// output 1 = class "2", output 2 = class "1".
    func makeExits() throws -> ExitDecoder {
        try ExitDecoder(
            federationKey: FederationKey(secret: FakeSlotTables.secret), labelEpoch: "e1", classNames: ["0", "1", "2"])
    }

    func makeClient(logits: [Float], fallback: (any FallbackServer)?) throws -> HarmonyClient {
        let policy = try ExitPolicy(threshold: 0.9)
        return try HarmonyClient(
            engine: FakeEngine(logits: logits), exitPolicy: policy, exits: makeExits(), fallback: fallback,
            slots: makeDecoder())
    }

    func testAConfidentFrontEndAnswersLocally() async throws {
        let client = try makeClient(logits: [0, 8, 0], fallback: FakeServer(answer: server))
        let result = try await client.classify([Float](repeating: 0, count: 784))
        XCTAssertEqual(result.source, .localExit)
        XCTAssertEqual(result.local.topOutput, 1)
        XCTAssertEqual(result.predictedClass, 2, "exit output 1 is class \"2\"")
        XCTAssertEqual(result.localClass, 2)
        XCTAssertNil(result.server)
    }

    func testAnUnsureFrontEndAsksTheServerAndDecodesTheSlot() async throws {
        let client = try makeClient(logits: [0.5, 0, 1], fallback: FakeServer(answer: server))
        let result = try await client.classify([Float](repeating: 0, count: 784))
        XCTAssertEqual(result.source, .server)
        XCTAssertEqual(result.predictedClass, 2, "slot 0 of version v2 holds class \"2\"")
        XCTAssertEqual(result.confidence, 0.98)
        XCTAssertEqual(result.local.topOutput, 2)
        XCTAssertEqual(result.localClass, 1, "exit output 2 is class \"1\"")
        XCTAssertFalse(result.local.exitLocally)
        _ = try await client.classify([Float](repeating: 0, count: 784))
        let fetched = await fetches.value
        XCTAssertEqual(fetched, 1, "a version's slot table is fetched once")
    }

    func testASlotWithNoClassOfThisPhoneKeepsTheLocalAnswer() async throws {
        let unnamed = ServerPrediction(modelVersion: "v2", slotScores: [0, 0, 5], topSlot: 2, confidence: 0.9)
        let result = try await makeClient(logits: [0.5, 0, 1], fallback: FakeServer(answer: unnamed))
            .classify([Float](repeating: 0, count: 784))
        XCTAssertEqual(result.source, .localServerUnnamed)
        XCTAssertEqual(result.predictedClass, 1, "the local answer: exit output 2, class \"1\"")
        XCTAssertEqual(result.server?.topSlot, 2)
        XCTAssertNotNil(result.serverError)
    }

    func testAFallbackServerNeedsASlotDecoder() throws {
        let policy = try ExitPolicy(threshold: 0.9)
        XCTAssertThrowsError(try HarmonyClient(
            engine: FakeEngine(logits: [1]), exitPolicy: policy, exits: makeExits(), fallback: FakeServer(answer: server),
            slots: nil))
    }

    func testTheLocalAnswerIsTheClassOfTheTopExitOutputNotItsIndex() async throws {
        // exit_order.json's "digits" case: Python's exit_order names each output of a token-ordered head.
        let vectors = try Vectors.load("exit_order.json", as: ExitOrderVectors.self)
        let digits = try XCTUnwrap(vectors.cases.first)
        let exits = try ExitDecoder(
            federationKey: FederationKey(secret: hex(vectors.federationSecret)), labelEpoch: digits.labelEpoch,
            classNames: digits.classNames)
        var moved = 0
        for output in digits.classNames.indices {
            let expected = try XCTUnwrap(digits.classNames.firstIndex(of: digits.exitClasses[output]))
            let cases: [(top: Float, source: Classification.Source)] = [(9, .localExit), (1.2, .localAfterServerFailure)]
            for (top, source) in cases {
                var logits = [Float](repeating: 0, count: digits.classNames.count)
                logits[output] = top
                let client = try HarmonyClient(
                    engine: FakeEngine(logits: logits), exitPolicy: ExitPolicy(threshold: 0.9), exits: exits,
                    fallback: nil, slots: nil)
                let result = try await client.classify([Float](repeating: 0, count: 784))
                XCTAssertEqual(result.source, source, "output \(output)")
                XCTAssertEqual(result.local.topOutput, output)
                XCTAssertEqual(result.predictedClass, expected, "output \(output)")
                XCTAssertEqual(result.localClass, expected, "output \(output)")
            }
            moved += expected == output ? 0 : 1
        }
        XCTAssertGreaterThanOrEqual(moved, 8, "the vector's token order moves most outputs away from their index")
    }

    func testNonFiniteLogitsNameNoClass() async throws {
        let result = try await makeClient(logits: [0, .nan, 3], fallback: nil).classify([Float](repeating: 0, count: 784))
        XCTAssertEqual(result.local.topOutput, -1)
        XCTAssertEqual(result.localClass, -1)
        XCTAssertEqual(result.predictedClass, -1)
    }

    func testAnExitHeadWithAnotherNumberOfOutputsIsRefused() async throws {
        let client = try makeClient(logits: [8, 0], fallback: nil)
        do {
            _ = try await client.classify([Float](repeating: 0, count: 784))
            XCTFail("two logits for three classes must be refused")
        } catch let error as InferenceError {
            XCTAssertTrue(error.description.contains("2 logits"), error.description)
        }
    }

    func testAFailingOrMissingServerLeavesTheLocalAnswer() async throws {
        for fallback: (any FallbackServer)? in [FakeServer(answer: nil), nil] {
            let client = try makeClient(logits: [0.5, 0, 1], fallback: fallback)
            let result = try await client.classify([Float](repeating: 0, count: 784))
            XCTAssertEqual(result.source, .localAfterServerFailure)
            XCTAssertEqual(result.predictedClass, 1)
            XCTAssertNotNil(result.serverError)
        }
    }

    func testConfirmedUploadsAreSealedQueuedAndFlushed() async throws {
        let vectors = try Vectors.load("sealed_upload.json", as: SealedUploadVectors.self)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(UUID().uuidString)
        defer { try? FileManager.default.removeItem(at: directory) }
        let receipt = #"{"upload_id":1,"message_id":"x","rows":1,"duplicate":false,"received_at":"2026-11-29T15:04:05Z"}"#
        let transport = ScriptedTransport([.respond(HTTPResponse(status: 201, body: Data(receipt.utf8)))])
        let device = try DeviceCredentials(deviceID: "dev_golden", token: "t", serverPublicKey: hex(vectors.serverPublicKey))
        let uploads = try ConfirmedUploads(
            queue: UploadQueue(directory: directory, maxEntries: 8, maxBytes: 1 << 20),
            client: HarmonyHTTPClient(transport: transport), device: device,
            federationKey: FederationKey(secret: Data("harmony golden federation secret".utf8)), labelEpoch: "e7",
            classNames: (0..<10).map { String($0) }, family: "mobilenet", tier: "mid-android", splitDepth: 1,
            modelVersion: "golden-v1")
        let features = try FeatureTensor(values: (0..<4096).map { (Float($0) - 2048) / 512 }, shape: [1, 64, 8, 8])
        let queued = try await uploads.enqueue(features: features, confirmedClass: 4).upload

        // The queued body is the JSON of PROTOCOL.md 4.1; its envelope opens with the server key to the
        // golden HMUP plaintext of sealed_upload.json case 3 (same features, class, epoch, tier).
        let body = try XCTUnwrap(JSONSerialization.jsonObject(with: queued.body) as? [String: Any])
        XCTAssertEqual(body["label_epoch"] as? String, "e7")
        XCTAssertEqual(body["message_id"] as? String, queued.messageID.lowercaseString)
        let envelope = try XCTUnwrap(Data(base64Encoded: XCTUnwrap(body["envelope"] as? String)))
        let server = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: hex(vectors.serverPrivateKey))
        let ad = try AssociatedData(deviceID: "dev_golden", labelEpoch: "e7", messageID: queued.messageID)
        XCTAssertEqual(Hex.encode(try UploadSealer.open(envelope, serverPrivateKey: server, associatedData: ad)),
                       vectors.cases[2].plaintext)

        let delivered = try await uploads.flush()
        XCTAssertEqual(delivered, 1)
        let left = try await uploads.pendingCount()
        XCTAssertEqual(left, 0)
        let sentRecorded = await transport.requests.first
        let sent = try XCTUnwrap(sentRecorded)
        XCTAssertEqual(sent.path, Endpoint.uploads.path)
        XCTAssertEqual(sent.body, queued.body)
    }
}
