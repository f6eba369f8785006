import CryptoKit
import Foundation

/// Label tokens: what the server gets instead of a label (docs/PROTOCOL.md 3,
/// harmony_mobile/privacy/label_tokens.py):
///
///     K_r = HKDF-SHA256(ikm = federation_secret, salt = none (32 zero bytes),
///                       info = "harmony/label-token/" + decimal(r), length = 32)
///     t   = first 8 bytes of HMAC-SHA256(K_r, u32be(class_id))
///
/// Within round r equal labels give equal tokens on every phone; rounds are unlinkable; without
/// the federation secret (held by phones only, never by the server) a token reveals no class.
public struct LabelTokens: Sendable {
    public static let tokenBytes = 8
    public static let roundKeyBytes = 32
    public static let infoPrefix = "harmony/label-token/"
    public static let minSecretBytes = 16

    /// K_r.
    public let roundKey: Data

    /// The token generator of round (key epoch) `roundID`.
    public init(federationSecret: Data, roundID: Int64) throws {
        guard roundID >= 0 else { throw HarmonyFormatError("round ids are >= 0, got \(roundID)") }
        roundKey = try Self.roundKey(federationSecret: federationSecret, roundID: String(roundID))
    }

    public static func roundKey(federationSecret: Data, roundID: String) throws -> Data {
        guard federationSecret.count >= minSecretBytes else {
            throw HarmonyFormatError("the federation secret must be at least \(minSecretBytes) bytes")
        }
        // RFC 5869: an absent salt is HashLen zero bytes; pass them explicitly.
        let key = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: federationSecret),
            salt: Data(repeating: 0, count: 32),
            info: Data((infoPrefix + roundID).utf8),
            outputByteCount: roundKeyBytes
        )
        return key.withUnsafeBytes { Data($0) }
    }

    /// The token of a class id (0...2^32-1).
    public func token(classID: Int) throws -> Data {
        guard classID >= 0, classID <= Int(UInt32.max) else {
            throw HarmonyFormatError("class ids are in 0...\(UInt32.max), got \(classID)")
        }
        var message = Data()
        message.appendBigEndian(UInt32(classID))
        let mac = HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: roundKey))
        return Data(mac).prefix(Self.tokenBytes)
    }
}

/// The label-token key material a phone is provisioned with out of band (MDM / managed app
/// configuration, docs/PROTOCOL.md 2-3): the federation secret, which the server never holds, and
/// the current round (key epoch) id that uploads name as `round_id`.
public struct FederationKey: Sendable, CustomStringConvertible {
    public let secret: Data
    public let roundID: Int64

    public init(secret: Data, roundID: Int64) throws {
        guard secret.count >= LabelTokens.minSecretBytes else {
            throw HarmonyFormatError("the federation secret must be at least \(LabelTokens.minSecretBytes) bytes")
        }
        guard roundID >= 0 else { throw HarmonyFormatError("round ids are >= 0") }
        self.secret = secret
        self.roundID = roundID
    }

    public var description: String { "FederationKey(round \(roundID), secret hidden)" }
}
