import Foundation

/// What a sealed envelope holds (docs/PROTOCOL.md 4.4), integers little-endian:
///
///     "HMUP" | version 1 | u32 M | M bytes of metadata JSON (UTF-8) | HMFT tensor (N, C, S, S)
public enum UploadPlaintext {
    public static let magic: [UInt8] = Array("HMUP".utf8)
    public static let version: UInt8 = 1
    public static let fixedHeaderBytes = 9

    public static func encode(metadata: UploadMetadata, features: FeatureTensor) throws -> Data {
        guard features.shape.count == 4 else {
            throw WireFormatError("upload features are (N, C, S, S), got shape \(features.shape)")
        }
        guard features.rows == metadata.labelTokens.count else {
            throw WireFormatError("\(features.rows) feature rows but \(metadata.labelTokens.count) label tokens")
        }
        let meta = Data(metadata.jsonText().utf8)
        var out = Data(capacity: fixedHeaderBytes + meta.count + features.encodedSize)
        out.append(contentsOf: magic)
        out.append(version)
        out.appendLittleEndian(UInt32(meta.count))
        out.append(meta)
        out.append(features.encoded())
        return out
    }
}
