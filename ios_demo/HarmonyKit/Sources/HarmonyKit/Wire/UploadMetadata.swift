import Foundation

/// The JSON part of an upload plaintext (docs/PROTOCOL.md 4.4). There is no field that can hold a
/// class id: label tokens only.
///
/// Serialized compactly with the keys in the order of the Python model
/// (`UploadMetadata.model_dump_json(exclude_none=True)` in protocol/wire.py), so
/// Swift, Java and Python produce the same bytes (checked against tests/vectors/feature_encoding.json).
public struct UploadMetadata: Equatable, Sendable {
    /// The JSON keys, in the order pydantic writes them.
    public static let jsonKeys = [
        "label_tokens", "split_depths", "family", "tier", "model_version", "clip_norm", "noise_multiplier",
        "label_dp_epsilon",
    ]
    /// The `tier` pattern of wire.py and docs/PROTOCOL.md.
    public static let tierPattern = "^[a-z0-9][a-z0-9_-]{0,63}$"
    public static let maxFamilyLength = 64
    public static let maxModelVersionLength = 128

    /// One 8-byte token per feature row.
    public let labelTokens: [Data]
    public let splitDepths: [Int]
    public let family: String
    public let tier: String
    public let modelVersion: String
    /// C_z when rows were L2-clipped, else nil.
    public let clipNorm: Double?
    /// sigma when Gaussian noise N(0, sigma^2 C_z^2) was added, else nil.
    public let noiseMultiplier: Double?
    /// epsilon when the tokens went through randomized response, else nil.
    public let labelDPEpsilon: Double?

    public init(
        labelTokens: [Data],
        splitDepths: [Int],
        family: String,
        tier: String,
        modelVersion: String,
        clipNorm: Double? = nil,
        noiseMultiplier: Double? = nil,
        labelDPEpsilon: Double? = nil
    ) throws {
        guard !labelTokens.isEmpty, labelTokens.count == splitDepths.count else {
            throw WireFormatError(
                "\(labelTokens.count) label tokens and \(splitDepths.count) split depths; need equal counts >= 1")
        }
        guard labelTokens.allSatisfy({ $0.count == LabelTokens.tokenBytes }) else {
            throw WireFormatError("label tokens are \(LabelTokens.tokenBytes) bytes")
        }
        guard splitDepths.allSatisfy({ $0 >= 1 }) else {
            throw WireFormatError("split depths are >= 1")
        }
        guard (1...Self.maxFamilyLength).contains(family.unicodeScalars.count) else {
            throw WireFormatError("family must be 1...\(Self.maxFamilyLength) characters")
        }
        guard tier.range(of: Self.tierPattern, options: .regularExpression) != nil else {
            throw WireFormatError("tier must match \(Self.tierPattern): \(tier)")
        }
        guard (1...Self.maxModelVersionLength).contains(modelVersion.unicodeScalars.count) else {
            throw WireFormatError("model version must be 1...\(Self.maxModelVersionLength) characters")
        }
        if let clipNorm, !(clipNorm > 0 && clipNorm.isFinite) {
            throw WireFormatError("clip norm must be finite and > 0")
        }
        if let noiseMultiplier, !(noiseMultiplier >= 0 && noiseMultiplier.isFinite) {
            throw WireFormatError("noise multiplier must be finite and >= 0")
        }
        if let labelDPEpsilon, !(labelDPEpsilon > 0 && labelDPEpsilon.isFinite) {
            throw WireFormatError("label DP epsilon must be finite and > 0")
        }
        self.labelTokens = labelTokens
        self.splitDepths = splitDepths
        self.family = family
        self.tier = tier
        self.modelVersion = modelVersion
        self.clipNorm = clipNorm
        self.noiseMultiplier = noiseMultiplier
        self.labelDPEpsilon = labelDPEpsilon
    }

    /// The exact metadata JSON (compact, keys in `jsonKeys` order, absent optionals omitted).
    public func jsonText() -> String {
        let tokens = labelTokens.map { JSONText.string(Hex.encode($0)) }.joined(separator: ",")
        let depths = splitDepths.map { String($0) }.joined(separator: ",")
        var members = [String]()
        members.append(JSONText.string("label_tokens") + ":[" + tokens + "]")
        members.append(JSONText.string("split_depths") + ":[" + depths + "]")
        members.append(JSONText.string("family") + ":" + JSONText.string(family))
        members.append(JSONText.string("tier") + ":" + JSONText.string(tier))
        members.append(JSONText.string("model_version") + ":" + JSONText.string(modelVersion))
        if let clipNorm {
            members.append(JSONText.string("clip_norm") + ":" + JSONText.number(clipNorm))
        }
        if let noiseMultiplier {
            members.append(JSONText.string("noise_multiplier") + ":" + JSONText.number(noiseMultiplier))
        }
        if let labelDPEpsilon {
            members.append(JSONText.string("label_dp_epsilon") + ":" + JSONText.number(labelDPEpsilon))
        }
        return "{" + members.joined(separator: ",") + "}"
    }
}

/// JSON text written the way pydantic-core writes it, for bodies whose exact bytes matter.
public enum JSONText {
    /// A JSON string: `"` and `\` escaped, \b \f \n \r \t short escapes, other control characters as
    /// `\u00xx` (lowercase hex), everything else (including non-ASCII) written as is in UTF-8.
    public static func string(_ value: String) -> String {
        var out = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }

    /// A finite double in pydantic-core's form: the shortest digits that round-trip; plain notation
    /// with at least one fractional digit when the decimal exponent e is in -5...15 (`1.0`, `0.00001`,
    /// `1000000000000000.0`), otherwise `d[.ddd]e+X` / `d[.ddd]e-X` (`1e-7`, `1e+16`).
    public static func number(_ value: Double) -> String {
        precondition(value.isFinite, "JSON cannot represent \(value)")
        let sign = value.sign == .minus ? "-" : ""
        if value == 0 {
            return sign + "0.0"
        }
        // Swift's description is the shortest round-trip form; only its layout is rewritten here.
        var text = value.magnitude.description
        var exponent = 0
        if let e = text.firstIndex(where: { $0 == "e" || $0 == "E" }) {
            exponent = Int(text[text.index(after: e)...]) ?? 0
            text = String(text[..<e])
        }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        let integerPart = String(parts[0])
        let fractionPart = parts.count > 1 ? String(parts[1]) : ""
        var digits = integerPart + fractionPart
        // value = 0.<digits> x 10^point
        var point = integerPart.count + exponent
        while digits.count > 1, digits.hasPrefix("0") {
            digits.removeFirst()
            point -= 1
        }
        while digits.count > 1, digits.hasSuffix("0") {
            digits.removeLast()
        }
        let scientific = point - 1
        if scientific < -5 || scientific >= 16 {
            var mantissa = String(digits.prefix(1))
            if digits.count > 1 {
                mantissa += "." + String(digits.dropFirst())
            }
            let exponentSign = scientific >= 0 ? "+" : "-"
            return "\(sign)\(mantissa)e\(exponentSign)\(abs(scientific))"
        }
        if point <= 0 {
            return "\(sign)0.\(String(repeating: "0", count: -point))\(digits)"
        }
        if point >= digits.count {
            return "\(sign)\(digits)\(String(repeating: "0", count: point - digits.count)).0"
        }
        let split = digits.index(digits.startIndex, offsetBy: point)
        return "\(sign)\(digits[..<split]).\(digits[split...])"
    }
}
