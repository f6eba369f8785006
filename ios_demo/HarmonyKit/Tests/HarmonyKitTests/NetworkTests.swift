import XCTest
@testable import HarmonyKit

/// A transport that answers from a script and records what it was asked.
actor ScriptedTransport: HTTPTransport {
    enum Step {
        case respond(HTTPResponse)
        case fail(URLError.Code)
    }

    private var script: [Step]
    private(set) var requests = [HTTPRequest]()

    init(_ script: [Step]) {
        self.script = script
    }

    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        requests.append(request)
        guard !script.isEmpty else { throw URLError(.cannotConnectToHost) }
        switch script.removeFirst() {
        case .respond(let response): return response
        case .fail(let code): throw URLError(code)
        }
    }
}

actor RecordingSleeper: Sleeper {
    private(set) var waits = [TimeInterval]()

    func sleep(seconds: TimeInterval) async throws {
        waits.append(seconds)
    }
}

final class NetworkTests: XCTestCase {
    private func json(_ status: Int, _ text: String, headers: [String: String] = [:]) -> ScriptedTransport.Step {
        .respond(HTTPResponse(status: status, headers: headers, body: Data(text.utf8)))
    }

    private func retrying(_ transport: ScriptedTransport, _ sleeper: RecordingSleeper,
                          policy: RetryPolicy = .standard) -> RetryingTransport {
        RetryingTransport(transport, policy: policy, sleeper: sleeper,
                          now: { Date(timeIntervalSince1970: 1_700_000_000) }, unitRandom: { 1.0 })
    }

    func testA503ThenSuccessIsRetriedWithRetryAfter() async throws {
        let transport = ScriptedTransport([json(503, #"{"detail":"queue full"}"#, headers: ["Retry-After": "2"]), json(200, "{}")])
        let sleeper = RecordingSleeper()
        let response = try await retrying(transport, sleeper).send(HTTPRequest(method: "GET", path: "/v2/health/ready"))
        XCTAssertEqual(response.status, 200)
        let waits = await sleeper.waits
        XCTAssertEqual(waits, [2])
    }

    func testBackoffGrowsExponentiallyUpToTheCap() async throws {
        let transport = ScriptedTransport([json(429, "{}"), json(502, "{}"), .fail(.timedOut), json(504, "{}"), json(200, "{}")])
        let sleeper = RecordingSleeper()
        let policy = RetryPolicy(maxAttempts: 5, initialDelay: 0.25, multiplier: 2, maxDelay: 1, maxRetryAfter: 30)
        let response = try await retrying(transport, sleeper, policy: policy).send(HTTPRequest(method: "GET", path: "/"))
        XCTAssertEqual(response.status, 200)
        let waits = await sleeper.waits
        XCTAssertEqual(waits, [0.25, 0.5, 1, 1]) // unitRandom = 1: the top of each [d/2, d] interval
        XCTAssertEqual(policy.backoff(retry: 1, unit: 0), 0.25, "equal jitter: at least half of d")
    }

    func testALongRetryAfterGivesUpAtOnceAndA400IsNotRetried() async throws {
        let sleeper = RecordingSleeper()
        let busy = ScriptedTransport([json(503, "{}", headers: ["Retry-After": "120"]), json(200, "{}")])
        let first = try await retrying(busy, sleeper).send(HTTPRequest(method: "GET", path: "/"))
        XCTAssertEqual(first.status, 503)
        let bad = ScriptedTransport([json(400, #"{"detail":"bad base64"}"#), json(200, "{}")])
        let second = try await retrying(bad, sleeper).send(HTTPRequest(method: "GET", path: "/"))
        XCTAssertEqual(second.status, 400)
        let waits = await sleeper.waits
        XCTAssertEqual(waits, [])
    }

    func testNetworkFailuresAreRetriedThenThrown() async throws {
        let sleeper = RecordingSleeper()
        let down = ScriptedTransport([.fail(.cannotConnectToHost), .fail(.cannotConnectToHost)])
        let policy = RetryPolicy(maxAttempts: 2, initialDelay: 0.1, multiplier: 2, maxDelay: 1, maxRetryAfter: 1)
        do {
            _ = try await retrying(down, sleeper, policy: policy).send(HTTPRequest(method: "GET", path: "/"))
            XCTFail("expected the last error")
        } catch let error as URLError {
            XCTAssertEqual(error.code, .cannotConnectToHost)
        }
        let attempts = await down.requests.count
        XCTAssertEqual(attempts, 2)
    }

    func testRetryAfterParsing() {
        let now = Date(timeIntervalSince1970: 1_700_000_000) // Tue, 14 Nov 2023 22:13:20 GMT
        XCTAssertEqual(RetryAfter.parse("7", now: now), 7)
        XCTAssertEqual(RetryAfter.parse(" 0 ", now: now), 0)
        XCTAssertNil(RetryAfter.parse("-1", now: now))
        XCTAssertNil(RetryAfter.parse("soon", now: now))
        XCTAssertNil(RetryAfter.parse(nil, now: now))
        XCTAssertEqual(RetryAfter.parse("Tue, 14 Nov 2023 22:13:50 GMT", now: now), 30)
        XCTAssertEqual(RetryAfter.parse("Tue, 14 Nov 2023 22:00:00 GMT", now: now), 0)
    }

    func testInferSendsAnHMFTBodyAndParsesPredictions() async throws {
        let answer = #"""
        {"model_name":"harmony-backend","model_version":"v1-r2","outputs":[
         {"name":"slot_scores","datatype":"FP32","shape":[1,3],"data":[0.5,2.0,-1.0]},
         {"name":"top_slot","datatype":"INT64","shape":[1],"data":[1]},
         {"name":"confidence","datatype":"FP32","shape":[1],"data":[0.75]}]}
        """#
        let transport = ScriptedTransport([json(200, answer)])
        let client = HarmonyHTTPClient(transport: transport)
        let device = DeviceCredentials(deviceID: "dev_1", token: "secret-token", serverPublicKey: Data(count: 32))
        let features = try FeatureTensor(values: [Float](repeating: 0.5, count: 4096), shape: [1, 64, 8, 8])
        let predictions = try await client.infer(features, device: device, tier: "mid-ios")
        XCTAssertEqual(
            predictions, [ServerPrediction(modelVersion: "v1-r2", slotScores: [0.5, 2, -1], topSlot: 1, confidence: 0.75)])
        let requestRecorded = await transport.requests.first
        let request = try XCTUnwrap(requestRecorded)
        XCTAssertEqual(request.method, "POST")
        XCTAssertEqual(request.path, "/v2/models/harmony-backend/infer")
        XCTAssertEqual(request.headers["Authorization"], "Bearer secret-token")
        XCTAssertEqual(request.headers["Content-Type"], "application/octet-stream")
        XCTAssertEqual(request.headers[HarmonyHTTPClient.tierHeader], "mid-ios")
        XCTAssertEqual(request.body, features.encoded())
        XCTAssertEqual(Endpoint.inferVersion.resolvedPath(version: "v1 r2"), "/v2/models/harmony-backend/versions/v1%20r2/infer")
    }

    func testATopSlotOutsideTheSlotsIsAMalformedAnswer() async throws {
        let answer = #"""
        {"model_name":"harmony-backend","model_version":"v1","outputs":[
         {"name":"slot_scores","datatype":"FP32","shape":[1,2],"data":[0.5,2.0]},
         {"name":"top_slot","datatype":"INT64","shape":[1],"data":[2]},
         {"name":"confidence","datatype":"FP32","shape":[1],"data":[0.75]}]}
        """#
        let client = HarmonyHTTPClient(transport: ScriptedTransport([json(200, answer)]))
        let device = DeviceCredentials(deviceID: "dev_1", token: "t", serverPublicKey: Data(count: 32))
        let features = try FeatureTensor(values: [Float](repeating: 0.5, count: 4096), shape: [1, 64, 8, 8])
        do {
            _ = try await client.infer(features, device: device, tier: nil)
            XCTFail("expected a ServerError")
        } catch let error as ServerError {
            XCTAssertTrue(error.detail.contains("top_slot"))
        }
    }

    func testAVersionsSlotTableComesFromItsMetadata() async throws {
        let metadata = #"""
        {"name":"harmony-backend","versions":["v1","v1-r1"],"platform":"pytorch","inputs":[],"outputs":[],
         "parameters":{"label_epoch":"mnist-e1","slot_table":["0123456789abcdef","fedcba9876543210"]}}
        """#
        let transport = ScriptedTransport([json(200, metadata)])
        let device = DeviceCredentials(deviceID: "dev_1", token: "t", serverPublicKey: Data(count: 32))
        let table = try await HarmonyHTTPClient(transport: transport).slotTable(version: "v1-r1", device: device)
        XCTAssertEqual(table, try SlotTable(labelEpoch: "mnist-e1", tokens: ["0123456789abcdef", "fedcba9876543210"]))
        let requestRecorded = await transport.requests.first
        let request = try XCTUnwrap(requestRecorded)
        XCTAssertEqual(request.method, "GET")
        XCTAssertEqual(request.path, "/v2/models/harmony-backend/versions/v1-r1")
    }

    func testErrorsCarryTheServerDetail() async throws {
        let transport = ScriptedTransport([json(409, #"{"detail":"message_id reused with different envelope bytes"}"#)])
        let client = HarmonyHTTPClient(transport: transport)
        let device = DeviceCredentials(deviceID: "dev_1", token: "t", serverPublicKey: Data(count: 32))
        do {
            _ = try await client.upload(body: Data("{}".utf8), device: device)
            XCTFail("expected a ServerError")
        } catch let error as ServerError {
            XCTAssertEqual(error.status, 409)
            XCTAssertEqual(error.detail, "message_id reused with different envelope bytes")
            XCTAssertTrue(ConfirmedUploads.permanentStatuses.contains(error.status))
        }
    }

    func testEnrolmentWithoutABackendHasNullVersionEpochAndSlots() async throws {
        let enrolment = #"""
        {"device_id":"dev_1","token":"tok","server_public_key":"B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9/AsrhtHHw=",
         "seal_version":1,"model_name":"harmony-backend","default_version":null,"label_epoch":null,"slot_table":null,
         "interface_shape":null,"manifest":null,"manifest_signature":null,"manifest_p256_signature":null,
         "limits":{"max_body_bytes":8388608,"max_request_rows":64,"max_upload_rows":256,"rate_limit_per_second":50.0,"rate_limit_burst":100}}
        """#
        let result = try await HarmonyHTTPClient(transport: ScriptedTransport([json(201, enrolment)]))
            .enroll(adminToken: "admin")
        XCTAssertNil(result.defaultVersion)
        XCTAssertNil(result.labelEpoch)
        XCTAssertNil(result.defaultSlotTable)
        XCTAssertNil(result.interfaceShape)
    }

    func testEnrolmentAndUploadBodies() async throws {
        let enrolment = #"""
        {"device_id":"dev_4f1c2a9be03d7781","token":"tok","server_public_key":"B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9/AsrhtHHw=",
         "seal_version":1,"model_name":"harmony-backend","default_version":"v1","label_epoch":"mnist-e1",
         "slot_table":["0123456789abcdef"],"interface_shape":[64,8,8],
         "manifest":null,"manifest_signature":null,"manifest_p256_signature":null,
         "limits":{"max_body_bytes":8388608,"max_request_rows":64,"max_upload_rows":256,"rate_limit_per_second":50.0,"rate_limit_burst":100}}
        """#
        let transport = ScriptedTransport([json(201, enrolment)])
        let result = try await HarmonyHTTPClient(transport: transport).enroll(adminToken: "admin", name: "iphone", tier: "mid-ios")
        XCTAssertEqual(result.deviceID, "dev_4f1c2a9be03d7781")
        XCTAssertEqual(result.serverPublicKey.count, 32)
        XCTAssertNil(result.manifest)
        XCTAssertEqual(result.limits.maxUploadRows, 256)
        XCTAssertEqual(result.defaultSlotTable, try SlotTable(labelEpoch: "mnist-e1", tokens: ["0123456789abcdef"]))
        let requestRecorded = await transport.requests.first
        let request = try XCTUnwrap(requestRecorded)
        XCTAssertEqual(request.path, "/v1/devices")
        let sent = try JSONSerialization.jsonObject(with: XCTUnwrap(request.body)) as? [String: String]
        XCTAssertEqual(sent, ["name": "iphone", "tier": "mid-ios"])

        let id = try XCTUnwrap(UUID(uuidString: "3F2B8C4E-9D1A-4C55-8A0E-61F0B7D2C9AA"))
        let body = try HarmonyHTTPClient.uploadBody(
            labelEpoch: "mnist-e1", messageID: id, envelope: Data([0x48, 0x4d, 0x53, 0x45]))
        XCTAssertEqual(
            String(decoding: body, as: UTF8.self),
            #"{"label_epoch":"mnist-e1","message_id":"3f2b8c4e-9d1a-4c55-8a0e-61f0b7d2c9aa","envelope":"SE1TRQ=="}"#)
        XCTAssertThrowsError(try HarmonyHTTPClient.uploadBody(labelEpoch: "a b", messageID: id, envelope: Data()))
    }
}
