import Foundation

/// Bytes that do not follow the documented binary layout (docs/PROTOCOL.md sections 4.4 and 5).
public struct WireFormatError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// A float32 tensor and its "HMFT" binary form (docs/PROTOCOL.md section 5,
/// protocol/wire.py), all integers little-endian:
///
///     "HMFT" | version 1 | dtype 1 (float32) | ndim 1...6 | reserved 0 | ndim x u32 dims | float32 data
///
/// This is the body of a binary inference request and the feature part of an upload plaintext.
public struct FeatureTensor: Equatable, Sendable {
    public static let magic: [UInt8] = Array("HMFT".utf8)
    public static let version: UInt8 = 1
    public static let dtypeFloat32: UInt8 = 1
    public static let maxNdim = 6
    public static let fixedHeaderBytes = 8

    /// Row-major (C order) values.
    public let values: [Float]
    public let shape: [Int]

    public init(values: [Float], shape: [Int]) throws {
        guard (1...Self.maxNdim).contains(shape.count) else {
            throw WireFormatError("ndim must be 1...\(Self.maxNdim), got \(shape.count)")
        }
        var count = 1
        for dim in shape {
            guard dim >= 1, dim <= Int(UInt32.max) else {
                throw WireFormatError("every dimension must be in 1...\(UInt32.max), got shape \(shape)")
            }
            let (product, overflow) = count.multipliedReportingOverflow(by: dim)
            guard !overflow else { throw WireFormatError("shape \(shape) is too large") }
            count = product
        }
        guard count == values.count else {
            throw WireFormatError("shape \(shape) holds \(count) values, got \(values.count)")
        }
        self.values = values
        self.shape = shape
    }

    /// The first dimension: the number of samples (rows) in a batch.
    public var rows: Int { shape[0] }

    public var encodedSize: Int {
        Self.fixedHeaderBytes + 4 * shape.count + 4 * values.count
    }

    /// The HMFT body.
    public func encoded() -> Data {
        var out = Data(capacity: encodedSize)
        out.append(contentsOf: Self.magic)
        out.append(contentsOf: [Self.version, Self.dtypeFloat32, UInt8(shape.count), 0])
        for dim in shape {
            out.appendLittleEndian(UInt32(dim))
        }
        for value in values {
            out.appendLittleEndian(value.bitPattern)
        }
        return out
    }

    /// Parses an HMFT body; the error names what is wrong.
    public static func decode(_ body: Data) throws -> FeatureTensor {
        var reader = ByteReader(body)
        guard reader.remaining >= fixedHeaderBytes else {
            throw WireFormatError("binary tensor is \(body.count) bytes, shorter than its \(fixedHeaderBytes)-byte fixed header")
        }
        guard try reader.read(4) == magic else {
            throw WireFormatError("binary tensor magic is not HMFT")
        }
        let version = try reader.readUInt8()
        let dtype = try reader.readUInt8()
        let ndim = try Int(reader.readUInt8())
        let reserved = try reader.readUInt8()
        guard version == Self.version else {
            throw WireFormatError("binary tensor version \(version) is not supported (expected \(Self.version))")
        }
        guard dtype == dtypeFloat32 else {
            throw WireFormatError("binary tensor dtype code \(dtype) is not supported (1 = float32 is)")
        }
        guard (1...maxNdim).contains(ndim) else {
            throw WireFormatError("binary tensor ndim \(ndim) is out of range 1...\(maxNdim)")
        }
        guard reserved == 0 else {
            throw WireFormatError("binary tensor reserved byte 7 must be 0, got \(reserved)")
        }
        guard reader.remaining >= 4 * ndim else {
            throw WireFormatError("binary tensor is shorter than its \(fixedHeaderBytes + 4 * ndim)-byte header")
        }
        var shape = [Int]()
        var count = 1
        for index in 0..<ndim {
            let dim = try Int(reader.readLittleEndian(UInt32.self))
            guard dim >= 1 else { throw WireFormatError("binary tensor dimension \(index) is 0") }
            let (product, overflow) = count.multipliedReportingOverflow(by: dim)
            guard !overflow, product <= Int(Int32.max) / 4 else {
                throw WireFormatError("binary tensor is too large")
            }
            count = product
            shape.append(dim)
        }
        guard reader.remaining == 4 * count else {
            throw WireFormatError("binary tensor header promises \(4 * count) data bytes, body has \(reader.remaining)")
        }
        var values = [Float]()
        values.reserveCapacity(count)
        for _ in 0..<count {
            values.append(try Float(bitPattern: reader.readLittleEndian(UInt32.self)))
        }
        return try FeatureTensor(values: values, shape: shape)
    }
}
