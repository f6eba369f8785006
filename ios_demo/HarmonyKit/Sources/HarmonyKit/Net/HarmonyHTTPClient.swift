import Foundation

/// One endpoint of docs/PROTOCOL.md. tests/test_ios_contract.py checks every `Endpoint` below against
/// server/openapi.json and PROTOCOL.md.
public struct Endpoint: Sendable, Equatable {
    public let method: String
    /// Path template, `{name}` / `{version}` as in the OpenAPI document.
    public let path: String

    public init(method: String, path: String) {
        self.method = method
        self.path = path
    }

    /// `POST /v1/devices` (admin token): enrol a device.
    public static let enrol = Endpoint(method: "POST", path: "/v1/devices")
    /// `POST /v1/uploads` (device token): a sealed feature upload.
    public static let uploads = Endpoint(method: "POST", path: "/v1/uploads")
    /// `GET /v1/manifest` (device token): manifest.json, verbatim.
    public static let manifest = Endpoint(method: "GET", path: "/v1/manifest")
    /// `GET /v1/manifest.sig` (device token): manifest.sig, verbatim.
    public static let manifestSignature = Endpoint(method: "GET", path: "/v1/manifest.sig")
    /// `GET /v1/artifacts/{path}` (device token): a file of the served manifest, byte for byte
    /// (docs/PROTOCOL.md 2.4); the default artifact base of an update.
    public static let artifact = Endpoint(method: "GET", path: "/v1/artifacts/{path}")
    /// `GET /v2/health/ready`: 200 once a back-end is loaded, else 503.
    public static let ready = Endpoint(method: "GET", path: "/v2/health/ready")
    /// `POST /v2/models/{name}/infer`: inference with the default back-end version.
    public static let infer = Endpoint(method: "POST", path: "/v2/models/{name}/infer")
    /// `GET /v2/models/{name}/versions/{version}`: a version's metadata, with its slot table in `parameters`.
    public static let modelVersion = Endpoint(method: "GET", path: "/v2/models/{name}/versions/{version}")
    /// `POST /v2/models/{name}/versions/{version}/infer`: inference with one version.
    public static let inferVersion = Endpoint(method: "POST", path: "/v2/models/{name}/versions/{version}/infer")

    /// The path with `{name}` and `{version}` filled in (percent-encoded).
    public func resolvedPath(name: String = HarmonyHTTPClient.modelName, version: String? = nil) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/")
        let encode = { (part: String) in part.addingPercentEncoding(withAllowedCharacters: allowed) ?? part }
        var filled = self.path.replacingOccurrences(of: "{name}", with: encode(name))
        if let version {
            filled = filled.replacingOccurrences(of: "{version}", with: encode(version))
        }
        return filled
    }

    /// The path with `{path}` filled in with a manifest path, each '/'-separated segment percent-encoded.
    public func resolvedPath(artifactPath: String) -> String {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "/")
        let segments = artifactPath.split(separator: "/", omittingEmptySubsequences: false).map { part in
            String(part).addingPercentEncoding(withAllowedCharacters: allowed) ?? String(part)
        }
        return path.replacingOccurrences(of: "{path}", with: segments.joined(separator: "/"))
    }
}

/// The server answered with an error status; `detail` is its one-sentence explanation.
public struct ServerError: Error, CustomStringConvertible, Sendable {
    public let status: Int
    public let detail: String
    public let retryAfter: TimeInterval?

    public var description: String { "server answered \(status): \(detail)" }

    /// 429 / 502 / 503 / 504: the same request may succeed later.
    public var isTransient: Bool { RetryPolicy.isRetryable(status: status) }
}

/// What a device keeps after enrolment: its id, bearer token and the pinned server X25519 key.
/// Store it in the Keychain (the demo's `CredentialStore`).
public struct DeviceCredentials: Codable, Sendable, Equatable, CustomStringConvertible {
    public let deviceID: String
    public let token: String
    public let serverPublicKey: Data

    public init(deviceID: String, token: String, serverPublicKey: Data) {
        self.deviceID = deviceID
        self.token = token
        self.serverPublicKey = serverPublicKey
    }

    public var description: String { "DeviceCredentials(\(deviceID), token hidden)" }
}

/// The answer to `POST /v1/devices` (docs/PROTOCOL.md 2). `defaultVersion`, `labelEpoch`,
/// `slotTable` and `interfaceShape` are nil while the server has no back-end loaded: the phone then
/// answers locally and cannot upload yet (uploads name the label epoch).
public struct Enrollment: Decodable, Sendable {
    public struct Limits: Decodable, Sendable {
        public let maxBodyBytes: Int
        public let maxRequestRows: Int
        public let maxUploadRows: Int
        public let rateLimitPerSecond: Double
        public let rateLimitBurst: Int

        enum CodingKeys: String, CodingKey {
            case maxBodyBytes = "max_body_bytes"
            case maxRequestRows = "max_request_rows"
            case maxUploadRows = "max_upload_rows"
            case rateLimitPerSecond = "rate_limit_per_second"
            case rateLimitBurst = "rate_limit_burst"
        }
    }

    public let deviceID: String
    /// Shown exactly once: keep it in the Keychain.
    public let token: String
    /// Raw 32-byte X25519 key (base64 in JSON); pin it.
    public let serverPublicKey: Data
    public let sealVersion: Int
    public let modelName: String
    public let defaultVersion: String?
    /// The label epoch of the default version: uploads name it.
    public let labelEpoch: String?
    /// The default version's slot table (lowercase hex tokens, slot i at index i).
    public let slotTable: [String]?
    public let interfaceShape: [Int]?
    /// The exact text of manifest.json, or nil; verify with `ManifestVerifier` before use.
    public let manifest: String?
    /// The text of manifest.sig (base64 of the Ed25519 signature), or nil.
    public let manifestSignature: String?
    /// The text of manifest.p256.sig (base64 of the DER ECDSA P-256 signature), or nil.
    public let manifestP256Signature: String?
    public let limits: Limits

    /// The default version's slot table with its epoch, when the server has a back-end.
    public var defaultSlotTable: SlotTable? {
        guard let labelEpoch, let slotTable else { return nil }
        return try? SlotTable(labelEpoch: labelEpoch, tokens: slotTable)
    }

    enum CodingKeys: String, CodingKey {
        case deviceID = "device_id"
        case token
        case serverPublicKey = "server_public_key"
        case sealVersion = "seal_version"
        case modelName = "model_name"
        case defaultVersion = "default_version"
        case labelEpoch = "label_epoch"
        case slotTable = "slot_table"
        case interfaceShape = "interface_shape"
        case manifest
        case manifestSignature = "manifest_signature"
        case manifestP256Signature = "manifest_p256_signature"
        case limits
    }

    public var credentials: DeviceCredentials {
        DeviceCredentials(deviceID: deviceID, token: token, serverPublicKey: serverPublicKey)
    }
}

/// The server's acknowledgement of a stored upload; `duplicate` = a replay of a stored message id.
public struct UploadReceipt: Decodable, Sendable, Equatable {
    public let uploadID: Int64
    public let messageID: String
    public let rows: Int
    public let duplicate: Bool

    enum CodingKeys: String, CodingKey {
        case uploadID = "upload_id"
        case messageID = "message_id"
        case rows
        case duplicate
    }
}

/// The back-end's answer for one row (docs/PROTOCOL.md 6.3), in slot space: the server never knows
/// classes, only the slots it gave label tokens. `SlotDecoder` turns a slot into a class.
public struct ServerPrediction: Sendable, Equatable {
    /// The back-end version that answered; its slot table decodes `topSlot`.
    public let modelVersion: String
    public let slotScores: [Float]
    public let topSlot: Int
    /// Max softmax probability over the slots.
    public let confidence: Double

    public init(modelVersion: String, slotScores: [Float], topSlot: Int, confidence: Double) {
        self.modelVersion = modelVersion
        self.slotScores = slotScores
        self.topSlot = topSlot
        self.confidence = confidence
    }
}

/// `GET /v2/models/{name}/versions/{version}`: only the part a phone reads.
struct ModelMetadataResponse: Decodable {
    let parameters: SlotTable?
}

struct InferResponse: Decodable {
    struct Output: Decodable {
        let name: String
        let datatype: String
        let shape: [Int]
        let data: [Double]
    }

    let modelName: String
    let modelVersion: String
    let outputs: [Output]

    enum CodingKeys: String, CodingKey {
        case modelName = "model_name"
        case modelVersion = "model_version"
        case outputs
    }
}

/// The fallback server's API as docs/PROTOCOL.md defines it: enrolment, binary-body inference,
/// sealed uploads and the manifest. Retries and timeouts belong to the transport: build it with
/// `HarmonyHTTPClient(baseURL:policy:)` or wrap your own in a `RetryingTransport`.
public struct HarmonyHTTPClient: Sendable {
    public static let modelName = "harmony-backend"
    /// The default artifact base, relative to the server URL: where `Endpoint.artifact` serves
    /// manifest paths (the Python device runtime's ARTIFACTS_PATH, harmony-core's ARTIFACTS_PATH).
    public static let artifactBasePath = "v1/artifacts"
    public static let tierHeader = "X-Harmony-Tier"
    static let jsonType = "application/json"
    static let binaryType = "application/octet-stream"

    public let transport: any HTTPTransport

    public init(transport: any HTTPTransport) {
        self.transport = transport
    }

    /// URLSession with timeouts, wrapped in retries with backoff and Retry-After.
    public init(
        baseURL: URL, policy: RetryPolicy = .standard, requestTimeout: TimeInterval = 10,
        resourceTimeout: TimeInterval = 30
    ) {
        let session = URLSessionTransport(
            baseURL: baseURL, requestTimeout: requestTimeout, resourceTimeout: resourceTimeout)
        self.init(transport: RetryingTransport(session, policy: policy))
    }

    /// `POST /v1/devices` with the admin token (a provisioning step, not something a phone does in the field).
    public func enroll(adminToken: String, name: String? = nil, tier: String? = nil) async throws -> Enrollment {
        struct Body: Encodable {
            let name: String?
            let tier: String?
        }
        let body = try JSONEncoder().encode(Body(name: name, tier: tier))
        let response = try await send(Endpoint.enrol, path: Endpoint.enrol.resolvedPath(), token: adminToken,
                                      contentType: Self.jsonType, body: body)
        return try decode(Enrollment.self, from: response)
    }

    /// Binary-body inference (PROTOCOL.md 6.2): one prediction per row of `features`.
    ///
    /// - Parameter version: a registry version, or nil for the server's default.
    public func infer(
        _ features: FeatureTensor, device: DeviceCredentials, tier: String?, version: String? = nil
    ) async throws -> [ServerPrediction] {
        let endpoint = version == nil ? Endpoint.infer : Endpoint.inferVersion
        var headers = [String: String]()
        if let tier {
            headers[Self.tierHeader] = tier
        }
        let response = try await send(endpoint, path: endpoint.resolvedPath(version: version), token: device.token,
                                      contentType: Self.binaryType, body: features.encoded(), headers: headers)
        return try Self.predictions(decode(InferResponse.self, from: response))
    }

    /// A version's slot table (V2 model metadata `parameters`): needed when an inference answer
    /// names a version this phone has no table for.
    public func slotTable(version: String, device: DeviceCredentials) async throws -> SlotTable {
        let endpoint = Endpoint.modelVersion
        let response = try await send(endpoint, path: endpoint.resolvedPath(version: version), token: device.token)
        guard let table = try decode(ModelMetadataResponse.self, from: response).parameters else {
            throw ServerError(status: response.status, detail: "model metadata of version \(version) carries no slot table",
                              retryAfter: nil)
        }
        return table
    }

    /// The exact JSON body of `POST /v1/uploads`; the upload queue stores and resends these bytes.
    public static func uploadBody(labelEpoch: String, messageID: UUID, envelope: Data) throws -> Data {
        let members = [
            JSONText.string("label_epoch") + ":" + JSONText.string(try LabelTokens.checkLabelEpoch(labelEpoch)),
            JSONText.string("message_id") + ":" + JSONText.string(messageID.lowercaseString),
            JSONText.string("envelope") + ":" + JSONText.string(envelope.base64EncodedString()),
        ]
        return Data(("{" + members.joined(separator: ",") + "}").utf8)
    }

    /// Sends a queued upload body; 201 (stored) and 200 (replay of a stored message id) both acknowledge.
    public func upload(body: Data, device: DeviceCredentials) async throws -> UploadReceipt {
        let response = try await send(Endpoint.uploads, path: Endpoint.uploads.path, token: device.token,
                                      contentType: Self.jsonType, body: body)
        return try decode(UploadReceipt.self, from: response)
    }

    /// The server's copy of manifest.json and manifest.sig (verify them before use).
    public func manifest(device: DeviceCredentials) async throws -> (manifest: Data, signature: Data) {
        let manifest = try await send(Endpoint.manifest, path: Endpoint.manifest.path, token: device.token)
        let signature = try await send(Endpoint.manifestSignature, path: Endpoint.manifestSignature.path,
                                       token: device.token)
        return (manifest.body, signature.body)
    }

    /// A file of the served manifest (`GET /v1/artifacts/{path}`), unverified: check its sha256 and
    /// size against the verified manifest before use (ModelStore.install does).
    public func artifact(path: String, device: DeviceCredentials) async throws -> Data {
        let endpoint = Endpoint.artifact
        return try await send(endpoint, path: endpoint.resolvedPath(artifactPath: path), token: device.token).body
    }

    /// true when the server has a back-end loaded.
    public func isReady() async -> Bool {
        (try? await send(Endpoint.ready, path: Endpoint.ready.path, token: nil)) != nil
    }

    // MARK: - Plumbing

    private func send(
        _ endpoint: Endpoint, path: String, token: String?, contentType: String? = nil, body: Data? = nil,
        headers extra: [String: String] = [:]
    ) async throws -> HTTPResponse {
        var headers = extra
        headers["Accept"] = Self.jsonType
        if let token {
            headers["Authorization"] = "Bearer " + token
        }
        if let contentType {
            headers["Content-Type"] = contentType
        }
        let response = try await transport.send(
            HTTPRequest(method: endpoint.method, path: path, headers: headers, body: body))
        guard response.isSuccess else {
            throw Self.error(from: response)
        }
        return response
    }

    private func decode<T: Decodable>(_ type: T.Type, from response: HTTPResponse) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: response.body)
        } catch {
            throw ServerError(status: response.status, detail: "malformed server response: \(error)", retryAfter: nil)
        }
    }

    static func error(from response: HTTPResponse) -> ServerError {
        ServerError(
            status: response.status, detail: errorMessage(from: response.body),
            retryAfter: RetryAfter.parse(response.header("Retry-After"), now: Date()))
    }

    /// The server's sentence: a string `error` (the /v2 routes, as the V2 inference protocol has it),
    /// else a string `detail` (the /v1 routes), else the body itself (a proxy's page); see
    /// tests/vectors/error_bodies.json.
    public static func errorMessage(from body: Data) -> String {
        if let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] {
            for key in ["error", "detail"] {
                if let sentence = object[key] as? String {
                    return sentence
                }
            }
        }
        return String(decoding: body.prefix(512), as: UTF8.self)
    }

    static func predictions(_ response: InferResponse) throws -> [ServerPrediction] {
        func output(_ name: String) throws -> InferResponse.Output {
            guard let found = response.outputs.first(where: { $0.name == name }) else {
                throw ServerError(status: 200, detail: "inference response lacks output \"\(name)\"", retryAfter: nil)
            }
            return found
        }
        let scores = try output("slot_scores")
        let topSlot = try output("top_slot")
        let confidence = try output("confidence")
        guard scores.shape.count == 2 else {
            throw ServerError(status: 200, detail: "slot_scores shape \(scores.shape) is not [N, slots]", retryAfter: nil)
        }
        let rows = scores.shape[0]
        let slots = scores.shape[1]
        guard scores.data.count == rows * slots, topSlot.data.count == rows, confidence.data.count == rows else {
            throw ServerError(status: 200, detail: "inference outputs disagree on the number of rows", retryAfter: nil)
        }
        guard topSlot.data.allSatisfy({ $0 >= 0 && $0 < Double(slots) && $0 == $0.rounded() }) else {
            throw ServerError(status: 200, detail: "a top_slot is not one of the \(slots) slots", retryAfter: nil)
        }
        return (0..<rows).map { row in
            ServerPrediction(
                modelVersion: response.modelVersion,
                slotScores: scores.data[(row * slots)..<((row + 1) * slots)].map { Float($0) },
                topSlot: Int(topSlot.data[row]),
                confidence: confidence.data[row])
        }
    }
}
