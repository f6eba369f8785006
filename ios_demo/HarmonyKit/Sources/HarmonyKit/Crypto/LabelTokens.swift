import CryptoKit
import Foundation

/// Label tokens, slot decoding and exit-output order (docs/PROTOCOL.md 3, protocol/label_tokens.py):
///
///     K_e = HKDF-SHA256(ikm = federation_secret, salt = none (32 zero bytes),
///                       info = "harmony/label-token/" + e, length = 32)
///     t   = first 8 bytes of HMAC-SHA256(K_e, UTF-8 class name)
///
/// `e` is the label epoch of a model lineage. Within an epoch equal class names give equal tokens
/// on every phone; epochs are unlinkable; without the federation secret (held by phones only, never
/// by the server) neither a token nor the slot the server gave it reveals a class.
public struct LabelTokens: Sendable {
    public static let tokenBytes = 8
    public static let epochKeyBytes = 32
    public static let infoPrefix = "harmony/label-token/"
    public static let minSecretBytes = 16
    public static let maxLabelEpochLength = 64

    /// K_e.
    public let epochKey: Data

    /// The token generator of label epoch `labelEpoch`.
    public init(federationSecret: Data, labelEpoch: String) throws {
        epochKey = try Self.epochKey(federationSecret: federationSecret, labelEpoch: labelEpoch)
    }

    /// Throws unless `labelEpoch` is 1-64 characters of [A-Za-z0-9._-].
    @discardableResult
    public static func checkLabelEpoch(_ labelEpoch: String) throws -> String {
        let allowed = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-".unicodeScalars)
        let scalars = labelEpoch.unicodeScalars
        guard (1...maxLabelEpochLength).contains(scalars.count), scalars.allSatisfy({ allowed.contains($0) }) else {
            throw HarmonyFormatError("a label epoch is 1-64 characters of [A-Za-z0-9._-], got \"\(labelEpoch)\"")
        }
        return labelEpoch
    }

    public static func epochKey(federationSecret: Data, labelEpoch: String) throws -> Data {
        guard federationSecret.count >= minSecretBytes else {
            throw HarmonyFormatError("the federation secret must be at least \(minSecretBytes) bytes")
        }
        try checkLabelEpoch(labelEpoch)
        // RFC 5869: an absent salt is HashLen zero bytes; pass them explicitly.
        let key = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: federationSecret),
            salt: Data(repeating: 0, count: 32),
            info: Data((infoPrefix + labelEpoch).utf8),
            outputByteCount: epochKeyBytes
        )
        return key.withUnsafeBytes { Data($0) }
    }

    /// The token of a class name (the manifest's `class_names` entry).
    public func token(className: String) throws -> Data {
        guard !className.isEmpty else { throw HarmonyFormatError("a class name is a non-empty string") }
        let mac = HMAC<SHA256>.authenticationCode(for: Data(className.utf8), using: SymmetricKey(data: epochKey))
        return Data(mac).prefix(Self.tokenBytes)
    }

    /// The class behind each slot: entry i is the name whose token is `slotTable[i]` (lowercase hex),
    /// or nil when none of `classNames` has that token (another epoch, or a class this manifest lacks).
    public func slotClasses(classNames: [String], slotTable: [String]) throws -> [String?] {
        var byToken = [String: String]()
        for name in classNames {
            let key = try Hex.encode(token(className: name))
            byToken[key] = name
        }
        return try slotTable.enumerated().map { (slot, token) -> String? in
            guard token.utf8.count == 2 * Self.tokenBytes,
                  token.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) })
            else {
                throw HarmonyFormatError("slot \(slot): a token is 16 lowercase hex characters, got \"\(token)\"")
            }
            return byToken[token]
        }
    }

    /// The class behind each output of an exit head (protocol/label_tokens.py `exit_order`): exit heads
    /// are trained and shipped in token order, so entry j is the name whose token is the j-th smallest,
    /// comparing the 8 bytes as unsigned bytes (`UInt8`), first byte first; ties (equal tokens) go by name.
    public func exitOrder(classNames: [String]) throws -> [String] {
        let tokens = try classNames.map { try token(className: $0) }
        return zip(tokens, classNames).sorted { a, b in
            a.0 == b.0 ? a.1 < b.1 : a.0.lexicographicallyPrecedes(b.0)
        }.map { $0.1 }
    }
}

/// The label-token key material a phone is provisioned with out of band (MDM / managed app
/// configuration, docs/PROTOCOL.md 2-3): the federation secret, which the server never holds. The
/// label epoch uploads name comes from the verified manifest or the enrolment response.
public struct FederationKey: Sendable, CustomStringConvertible {
    public let secret: Data

    public init(secret: Data) throws {
        guard secret.count >= LabelTokens.minSecretBytes else {
            throw HarmonyFormatError("the federation secret must be at least \(LabelTokens.minSecretBytes) bytes")
        }
        self.secret = secret
    }

    /// The tokens of one label epoch.
    public func tokens(labelEpoch: String) throws -> LabelTokens {
        try LabelTokens(federationSecret: secret, labelEpoch: labelEpoch)
    }

    public var description: String { "FederationKey(secret hidden)" }
}

/// A back-end version's slot table: slot i's label token (16 lowercase hex characters) at index i,
/// and the label epoch whose key made the tokens (enrolment response, manifest, V2 model metadata).
public struct SlotTable: Codable, Sendable, Equatable {
    public let labelEpoch: String
    public let tokens: [String]

    public init(labelEpoch: String, tokens: [String]) throws {
        self.labelEpoch = try LabelTokens.checkLabelEpoch(labelEpoch)
        self.tokens = tokens
    }

    enum CodingKeys: String, CodingKey {
        case labelEpoch = "label_epoch"
        case tokens = "slot_table"
    }
}
