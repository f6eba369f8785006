import Foundation

/// A provisioning payload is malformed, of another format, or carries no usable secret.
public struct ProvisioningError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// What a phone is provisioned with at run time, never bundled in the app: the federation secret
/// and, optionally, the fallback server's URL, an enrolment the operator made for this phone and the
/// classes the phone holds per tier, which a slot_margin tier gates by (export/provisioning.py writes
/// it; docs/PROVISIONING.md). Read from a deep link / QR code
/// (`uriPrefix` + base64url of the JSON) or from managed app config (the bare JSON under
/// `managedConfigKey` of `com.apple.configuration.managed`). Unknown keys, another kind or format,
/// a secret outside 16...1024 bytes, the public placeholder secret, and own_classes that is not 1...64
/// tiers (names of 1...64 characters) each with 1...1000 distinct class names of 1...128 characters
/// are refused.
/// Counterpart: harmony-core `org.harmonymobile.core.provisioning.ProvisioningPayload`.
public struct ProvisioningPayload: Sendable, CustomStringConvertible {
    public static let uriPrefix = "harmony-mobile://provision/v1#"
    public static let managedConfigKey = "provisioning_payload"
    public static let kind = "harmony-mobile/provisioning"
    public static let format = 1
    public static let minSecretBytes = 16
    public static let maxSecretBytes = 1024
    public static let maxDeviceIDCharacters = 128
    public static let maxTokenCharacters = 512
    public static let serverKeyBytes = 32
    public static let maxOwnClassTiers = 64
    public static let maxTierNameCharacters = 64
    public static let maxOwnClasses = 1000
    public static let maxClassNameCharacters = 128
    /// The placeholder the demo apps once bundled: public, so never a federation's secret.
    static let placeholderSecret = Data("harmony demo federation secret!!!".utf8)

    public let federationSecret: Data
    public let serverURL: String?
    public let device: DeviceCredentials?
    /// Tier name -> the class names the phone holds when it runs that tier's front-end (nil: the payload
    /// names none). The owner knows them; the operator's manifest never says which classes a phone has.
    public let ownClasses: [String: [String]]?

    public var federationKey: FederationKey {
        get throws { try FederationKey(secret: federationSecret) }
    }

    /// The classes the phone holds when it runs `tier`; nil when the payload names none for it.
    public func ownClassNames(tier: String) -> [String]? {
        ownClasses?[tier]
    }

    public var description: String {
        "ProvisioningPayload(secret hidden, server \(serverURL ?? "none"), device \(device?.description ?? "none"), "
            + "own classes of \(ownClasses?.count ?? 0) tier(s))"
    }

    /// A deep link / QR code text or a bare JSON document (managed app config), validated.
    public static func parse(_ text: String) throws -> ProvisioningPayload {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        let json: Data
        if trimmed.hasPrefix(uriPrefix) {
            json = try decodeLink(String(trimmed.dropFirst(uriPrefix.count)))
        } else if trimmed.hasPrefix("{") {
            json = Data(trimmed.utf8)
        } else {
            throw ProvisioningError("a provisioning payload starts with \(uriPrefix) or is a JSON object")
        }
        guard let document = try? JSONSerialization.jsonObject(with: json) as? [String: Any] else {
            throw ProvisioningError("the payload is not a JSON object")
        }
        return try fromDocument(document)
    }

    private static func decodeLink(_ encoded: String) throws -> Data {
        var base64 = encoded.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard let data = Data(base64Encoded: base64), String(data: data, encoding: .utf8) != nil else {
            throw ProvisioningError("the link's payload is not base64url of UTF-8 JSON")
        }
        return data
    }

    private static func fromDocument(_ document: [String: Any]) throws -> ProvisioningPayload {
        let known: Set<String> = ["kind", "format", "federation_secret", "server_url", "device", "own_classes"]
        if let unknown = document.keys.first(where: { !known.contains($0) }) {
            throw ProvisioningError("unknown payload key \"\(unknown)\"")
        }
        guard document["kind"] as? String == kind else { throw ProvisioningError("kind must be \"\(kind)\"") }
        // JSONSerialization reads true as a number too: only an integer 1 is format 1.
        guard let number = document["format"] as? NSNumber, CFGetTypeID(number) != CFBooleanGetTypeID(),
              number.doubleValue == Double(format)
        else { throw ProvisioningError("payload format \(document["format"] ?? "none") is not supported (\(format) is)") }
        let secret = try checkSecret(base64(document["federation_secret"], "federation_secret"))
        var serverURL: String?
        if let value = document["server_url"], !(value is NSNull) {
            serverURL = try string(value, "server_url")
            guard let url = serverURL, url.range(of: #"^https?://[^\s"'\\<>]+$"#, options: .regularExpression) != nil
            else { throw ProvisioningError("server_url must be an http(s) URL") }
        }
        var device: DeviceCredentials?
        if let value = document["device"], !(value is NSNull) {
            device = try deviceCredentials(value)
        }
        var ownClasses: [String: [String]]?
        if let value = document["own_classes"], !(value is NSNull) {
            ownClasses = try checkOwnClasses(value)
        }
        return ProvisioningPayload(
            federationSecret: secret, serverURL: serverURL, device: device, ownClasses: ownClasses)
    }

    /// A secret of the allowed size that is not the public placeholder.
    public static func checkSecret(_ secret: Data) throws -> Data {
        guard (minSecretBytes...maxSecretBytes).contains(secret.count) else {
            throw ProvisioningError("a federation secret has \(minSecretBytes)...\(maxSecretBytes) bytes, this one \(secret.count)")
        }
        guard secret != placeholderSecret else {
            throw ProvisioningError("this is the public placeholder secret, not a federation's secret")
        }
        return secret
    }

    private static func deviceCredentials(_ value: Any) throws -> DeviceCredentials {
        guard let raw = value as? [String: Any], Set(raw.keys) == ["device_id", "token", "server_public_key"] else {
            throw ProvisioningError("device must hold exactly device_id, token and server_public_key")
        }
        let deviceID = try string(raw["device_id"] as Any, "device.device_id")
        let token = try string(raw["token"] as Any, "device.token")
        let serverKey = try base64(raw["server_public_key"], "device.server_public_key")
        guard (1...maxDeviceIDCharacters).contains(deviceID.count) else {
            throw ProvisioningError("device.device_id must have 1...\(maxDeviceIDCharacters) characters")
        }
        guard (1...maxTokenCharacters).contains(token.count) else {
            throw ProvisioningError("device.token must have 1...\(maxTokenCharacters) characters")
        }
        guard serverKey.count == serverKeyBytes else {
            throw ProvisioningError("device.server_public_key must hold \(serverKeyBytes) bytes")
        }
        return DeviceCredentials(deviceID: deviceID, token: token, serverPublicKey: serverKey)
    }

    /// 1...64 tiers, each naming 1...1000 distinct classes; lengths count code points, as Python's len.
    private static func checkOwnClasses(_ value: Any) throws -> [String: [String]] {
        guard let raw = value as? [String: Any] else {
            throw ProvisioningError("own_classes must be a JSON object of tier name -> class names")
        }
        guard (1...maxOwnClassTiers).contains(raw.count) else {
            throw ProvisioningError("own_classes must map 1...\(maxOwnClassTiers) tier names to class names")
        }
        var ownClasses = [String: [String]]()
        for (tier, classes) in raw {
            guard (1...maxTierNameCharacters).contains(tier.unicodeScalars.count) else {
                throw ProvisioningError("own_classes: a tier name has 1...\(maxTierNameCharacters) characters")
            }
            ownClasses[tier] = try checkClassNames(classes, tier: tier)
        }
        return ownClasses
    }

    private static func checkClassNames(_ value: Any, tier: String) throws -> [String] {
        guard let list = value as? [Any] else {
            throw ProvisioningError("own_classes: each tier's classes are a JSON array")
        }
        guard (1...maxOwnClasses).contains(list.count) else {
            throw ProvisioningError("own_classes[\"\(tier)\"] must list 1...\(maxOwnClasses) class names")
        }
        let names = list.compactMap { $0 as? String }
        guard names.count == list.count,
              names.allSatisfy({ (1...maxClassNameCharacters).contains($0.unicodeScalars.count) })
        else {
            throw ProvisioningError(
                "own_classes[\"\(tier)\"]: a class name is a string of 1...\(maxClassNameCharacters) characters")
        }
        guard Set(names).count == names.count else {
            throw ProvisioningError("own_classes[\"\(tier)\"] names a class twice")
        }
        return names
    }

    private static func string(_ value: Any, _ name: String) throws -> String {
        guard let text = value as? String else { throw ProvisioningError("\(name) must be a string") }
        return text
    }

    private static func base64(_ value: Any?, _ name: String) throws -> Data {
        guard let text = value as? String, let data = Data(base64Encoded: text) else {
            throw ProvisioningError("\(name) is not base64")
        }
        return data
    }
}

/// Is a provisioned secret the one this model was trained under? The verified manifest's slot table
/// holds the tokens of its class names under its label epoch: the right secret reproduces them, any
/// other (a typo, another federation's) does not. Apps check this before tokenizing or decoding.
public enum SecretCheck {
    public static func requireMatches(_ key: FederationKey, manifest: Manifest) throws {
        guard let labelEpoch = manifest.labelEpoch, let table = manifest.slotTable else {
            throw ProvisioningError("this export names no label epoch or slot table: re-export it")
        }
        let tokens = try key.tokens(labelEpoch: labelEpoch)
        let expected = Set(try manifest.classNames.map { Hex.encode(try tokens.token(className: $0)) })
        guard expected == Set(table) else {
            throw ProvisioningError(
                "the provisioned federation secret is not this model's: its class tokens are not the manifest's slot table")
        }
    }
}
