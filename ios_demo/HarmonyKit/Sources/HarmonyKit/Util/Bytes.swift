import Foundation

/// Lowercase hex, the encoding docs/PROTOCOL.md and tests/vectors use for bytes.
public enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    public static func encode<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        var out = [UInt8]()
        out.reserveCapacity(bytes.underestimatedCount * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Parses hex (either case); throws on an odd length or a non-hex character.
    public static func decode(_ text: String) throws -> Data {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else {
            throw HarmonyFormatError("hex text has an odd length (\(chars.count))")
        }
        var out = Data(capacity: chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = value(of: chars[index]), let low = value(of: chars[index + 1]) else {
                throw HarmonyFormatError("not a hex character at offset \(index)")
            }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }

    private static func value(of char: UInt8) -> UInt8? {
        switch char {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return char - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return char - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return char - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// Text that does not follow a documented encoding (hex, base64, JSON field).
public struct HarmonyFormatError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

extension Data {
    mutating func appendLittleEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) }
    }

    mutating func appendBigEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}

/// Reads fixed-width integers from a byte array; every read is bounds-checked.
struct ByteReader {
    let bytes: [UInt8]
    private(set) var offset = 0

    init(_ data: Data) {
        bytes = [UInt8](data)
    }

    var remaining: Int { bytes.count - offset }

    mutating func read(_ count: Int) throws -> [UInt8] {
        guard count >= 0, count <= remaining else {
            throw HarmonyFormatError("needs \(count) bytes at offset \(offset), \(remaining) left")
        }
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    mutating func readUInt8() throws -> UInt8 {
        try read(1)[0]
    }

    mutating func readLittleEndian<T: FixedWidthInteger>(_: T.Type) throws -> T {
        try read(MemoryLayout<T>.size).reversed().reduce(T(0)) { $0 << 8 | T($1) }
    }

    mutating func readBigEndian<T: FixedWidthInteger>(_: T.Type) throws -> T {
        try read(MemoryLayout<T>.size).reduce(T(0)) { $0 << 8 | T($1) }
    }
}

extension UUID {
    /// The 16 bytes in RFC 4122 order (the `uuid` tuple in order), as the associated data uses them.
    var rfc4122Bytes: Data {
        Swift.withUnsafeBytes(of: uuid) { Data($0) }
    }

    /// Lowercase canonical text, as Python's `str(uuid.UUID)` writes it.
    var lowercaseString: String {
        uuidString.lowercased()
    }
}
