import Foundation

/// Uploads of samples whose label the user confirmed: class name -> token under the label epoch's
/// key, features + token -> HMUP plaintext, plaintext -> envelope sealed to the server and bound to
/// (device, label epoch, message id), stored in the durable queue, sent when the network allows.
/// Only sealed bytes touch the disk.
public struct ConfirmedUploads: Sendable {
    /// Refusals that resending the same bytes cannot fix (docs/PROTOCOL.md 4.5 and 8): malformed or
    /// failing authentication (400), message id reused with other bytes (409), too large (413),
    /// invalid values (422). Everything else (401/403 until re-enrolment, 404, 429, 5xx) keeps the
    /// upload for a later flush.
    public static let permanentStatuses: Set<Int> = [400, 409, 413, 422]

    public let queue: UploadQueue
    public let client: HarmonyHTTPClient
    public let device: DeviceCredentials
    public let labelEpoch: String
    /// The verified manifest's class names; a confirmed class is an index into them.
    public let classNames: [String]
    public let family: String
    public let tier: String
    public let splitDepth: Int
    public let modelVersion: String
    private let tokens: LabelTokens
    private let sealer: UploadSealer

    /// - Parameter labelEpoch: the epoch uploads name (the enrolment response's or the manifest's).
    public init(
        queue: UploadQueue, client: HarmonyHTTPClient, device: DeviceCredentials, federationKey: FederationKey,
        labelEpoch: String, classNames: [String], family: String, tier: String, splitDepth: Int,
        modelVersion: String
    ) throws {
        self.queue = queue
        self.client = client
        self.device = device
        self.labelEpoch = try LabelTokens.checkLabelEpoch(labelEpoch)
        self.classNames = classNames
        self.family = family
        self.tier = tier
        self.splitDepth = splitDepth
        self.modelVersion = modelVersion
        self.tokens = try federationKey.tokens(labelEpoch: labelEpoch)
        self.sealer = try UploadSealer(serverPublicKey: device.serverPublicKey)
    }

    /// Seals and queues the features of one sample (shape (1, 64, 8, 8)) with its confirmed class index.
    @discardableResult
    public func enqueue(features: FeatureTensor, confirmedClass: Int) async throws -> UploadQueue.EnqueueResult {
        guard classNames.indices.contains(confirmedClass) else {
            throw HarmonyFormatError("class \(confirmedClass) is not one of the manifest's \(classNames.count) classes")
        }
        let metadata = try UploadMetadata(
            labelTokens: [tokens.token(className: classNames[confirmedClass])], splitDepths: [splitDepth],
            family: family, tier: tier, modelVersion: modelVersion)
        let plaintext = try UploadPlaintext.encode(metadata: metadata, features: features)
        let labelEpoch = self.labelEpoch
        let deviceID = device.deviceID
        let sealer = self.sealer
        return try await queue.enqueue { messageID in
            let ad = try AssociatedData(deviceID: deviceID, labelEpoch: labelEpoch, messageID: messageID)
            return try HarmonyHTTPClient.uploadBody(
                labelEpoch: labelEpoch, messageID: messageID, envelope: sealer.seal(plaintext, associatedData: ad))
        }
    }

    /// Sends what is queued, oldest first; stops at the first transient failure.
    /// - Returns: the number of uploads the server acknowledged.
    public func flush() async throws -> Int {
        let client = self.client
        let device = self.device
        return try await queue.drain { upload in
            do {
                _ = try await client.upload(body: upload.body, device: device)
                return .delivered
            } catch let error as ServerError {
                return Self.permanentStatuses.contains(error.status) ? .rejected : .retryLater
            }
        }
    }

    public func pendingCount() async throws -> Int {
        try await queue.count()
    }
}
