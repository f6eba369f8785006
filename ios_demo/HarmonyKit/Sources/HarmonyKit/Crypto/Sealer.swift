import CryptoKit
import Foundation

/// An envelope is malformed, tampered with, bound to other metadata, or sealed to another key.
public struct SealError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// What an envelope is bound to (docs/PROTOCOL.md 4.3, version 2); checked by AES-GCM, never sent:
///
///     "harmony/upload-ad/v2" | u16le len(device id) | device id (UTF-8) | u8 len(label epoch)
///     | label epoch (ASCII) | 16 UUID bytes
public struct AssociatedData: Sendable, Equatable {
    public static let label = "harmony/upload-ad/v2"
    public static let maxDeviceIDBytes = 255

    public let deviceID: String
    public let labelEpoch: String
    public let messageID: UUID

    public init(deviceID: String, labelEpoch: String, messageID: UUID) throws {
        let length = deviceID.utf8.count
        guard (1...Self.maxDeviceIDBytes).contains(length) else {
            throw SealError("device id must be 1...\(Self.maxDeviceIDBytes) UTF-8 bytes, got \(length)")
        }
        do {
            try LabelTokens.checkLabelEpoch(labelEpoch)
        } catch {
            throw SealError("\(error)")
        }
        self.deviceID = deviceID
        self.labelEpoch = labelEpoch
        self.messageID = messageID
    }

    public func encoded() -> Data {
        let device = Data(deviceID.utf8)
        let epoch = Data(labelEpoch.utf8)
        var out = Data(Self.label.utf8)
        out.appendLittleEndian(UInt16(device.count))
        out.append(device)
        out.append(UInt8(epoch.count))
        out.append(epoch)
        out.append(messageID.rfc4122Bytes)
        return out
    }
}

/// Seals an upload plaintext to the server's X25519 key (docs/PROTOCOL.md 4.2,
/// protocol/sealing.py) with CryptoKit:
///
///     shared   = X25519(e, S_pub)                      fresh ephemeral key pair (e, E_pub) per upload
///     key      = HKDF-SHA256(shared, salt = E_pub || S_pub, info = "harmony/upload-seal/v1", 32)
///     envelope = "HMSE" | 0x01 | E_pub (32) | nonce (12) | AES-256-GCM(key, nonce, plaintext, AD) | tag (16)
public struct UploadSealer: Sendable {
    public static let magic: [UInt8] = Array("HMSE".utf8)
    public static let version: UInt8 = 1
    public static let keyBytes = 32
    public static let nonceBytes = 12
    public static let tagBytes = 16
    public static let headerBytes = 49
    public static let hkdfInfo = "harmony/upload-seal/v1"

    /// The raw 32-byte X25519 key from enrolment (`server_public_key`), pinned by the app.
    public let serverPublicKey: Data

    public init(serverPublicKey: Data) throws {
        guard serverPublicKey.count == Self.keyBytes else {
            throw SealError("an X25519 public key is \(Self.keyBytes) bytes, got \(serverPublicKey.count)")
        }
        _ = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: serverPublicKey)
        self.serverPublicKey = serverPublicKey
    }

    /// Seals with a fresh ephemeral key and a random nonce: the production path.
    public func seal(_ plaintext: Data, associatedData: AssociatedData) throws -> Data {
        try seal(
            plaintext, associatedData: associatedData,
            ephemeral: Curve25519.KeyAgreement.PrivateKey(), nonce: AES.GCM.Nonce())
    }

    /// Seals with a given ephemeral private key and nonce. Only for reproducing the golden vectors:
    /// reusing either in production breaks the scheme.
    public func sealDeterministically(
        _ plaintext: Data, associatedData: AssociatedData, ephemeralPrivateKey: Data, nonce: Data
    ) throws -> Data {
        guard nonce.count == Self.nonceBytes else {
            throw SealError("the AES-GCM nonce is \(Self.nonceBytes) bytes, got \(nonce.count)")
        }
        return try seal(
            plaintext, associatedData: associatedData,
            ephemeral: Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeralPrivateKey),
            nonce: AES.GCM.Nonce(data: nonce))
    }

    private func seal(
        _ plaintext: Data, associatedData: AssociatedData,
        ephemeral: Curve25519.KeyAgreement.PrivateKey, nonce: AES.GCM.Nonce
    ) throws -> Data {
        let server = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: serverPublicKey)
        let ephemeralPublic = ephemeral.publicKey.rawRepresentation
        let shared = try ephemeral.sharedSecretFromKeyAgreement(with: server)
        let key = Self.deriveKey(shared, ephemeralPublic: ephemeralPublic, serverPublic: serverPublicKey)
        let box = try AES.GCM.seal(plaintext, using: key, nonce: nonce, authenticating: associatedData.encoded())
        var envelope = Data(capacity: Self.headerBytes + plaintext.count + Self.tagBytes)
        envelope.append(contentsOf: Self.magic)
        envelope.append(Self.version)
        envelope.append(ephemeralPublic)
        envelope.append(nonce.withUnsafeBytes { Data($0) })
        envelope.append(box.ciphertext)
        envelope.append(box.tag)
        return envelope
    }

    static func deriveKey(_ shared: SharedSecret, ephemeralPublic: Data, serverPublic: Data) -> SymmetricKey {
        shared.hkdfDerivedSymmetricKey(
            using: SHA256.self,
            salt: ephemeralPublic + serverPublic,
            sharedInfo: Data(hkdfInfo.utf8),
            outputByteCount: keyBytes
        )
    }

    /// Opens an envelope with the server's private key: what the server does (sealing.open_sealed).
    /// The app never holds that key; tests use this to check round trips.
    public static func open(
        _ envelope: Data, serverPrivateKey: Curve25519.KeyAgreement.PrivateKey, associatedData: AssociatedData
    ) throws -> Data {
        let bytes = [UInt8](envelope)
        guard bytes.count >= headerBytes + tagBytes else {
            throw SealError("envelope is \(bytes.count) bytes, shorter than the minimum \(headerBytes + tagBytes)")
        }
        guard Array(bytes[0..<4]) == magic else { throw SealError("envelope magic is not HMSE") }
        guard bytes[4] == version else { throw SealError("envelope version \(bytes[4]) is not supported") }
        let ephemeralPublic = Data(bytes[5..<(5 + keyBytes)])
        let nonce = Data(bytes[(5 + keyBytes)..<headerBytes])
        let ciphertext = Data(bytes[headerBytes..<(bytes.count - tagBytes)])
        let tag = Data(bytes[(bytes.count - tagBytes)...])
        do {
            let ephemeral = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: ephemeralPublic)
            let shared = try serverPrivateKey.sharedSecretFromKeyAgreement(with: ephemeral)
            let key = deriveKey(
                shared, ephemeralPublic: ephemeralPublic, serverPublic: serverPrivateKey.publicKey.rawRepresentation)
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: nonce), ciphertext: ciphertext, tag: tag)
            return try AES.GCM.open(box, using: key, authenticating: associatedData.encoded())
        } catch {
            throw SealError(
                "envelope failed authentication (tampered, sealed to another server key, "
                    + "or bound to another device id / round / message id)")
        }
    }
}
