import Foundation

/// Feature clipping (docs/PROTOCOL.md 4.4, when the manifest's `run.feature_clip` is a number C):
/// each row z of an upload, all its values at once, becomes z * min(1, C / ||z||) with ||z|| its L2
/// norm. The rule of harmony_mobile/privacy/feature_noise.py `clip_rows`, checked against
/// tests/vectors/feature_clipping.json. Noise, when the run turns it on, is added after clipping.
public enum FeatureClipping {
    /// The floor under ||z||, as Python's `clamp_min(1e-12)`: an all-zero row gets a finite scale
    /// instead of 0 / 0 and stays zero.
    static let minNorm = 1e-12

    /// `features` with each row (everything after the first dimension) scaled to L2 norm at most
    /// `clip`; rows already within it are returned bit for bit.
    ///
    /// The norm and the scale are computed in Double and each value is rounded to Float once:
    /// Python works in float32 with its own summation order, and the vector's bound (1e-6
    /// relative) is stated for this Double computation, not for a Float sum in another order.
    public static func clipRows(_ features: FeatureTensor, clip: Double) throws -> FeatureTensor {
        guard clip > 0, clip.isFinite else {
            throw WireFormatError("the feature clip norm must be finite and > 0, got \(clip)")
        }
        let values = features.values
        let rowLength = values.count / features.rows
        var clipped = [Float]()
        clipped.reserveCapacity(values.count)
        for start in stride(from: 0, to: values.count, by: rowLength) {
            let row = values[start..<(start + rowLength)]
            let squares = row.reduce(0.0) { sum, value in sum + Double(value) * Double(value) }
            let scale = min(1.0, clip / max(squares.squareRoot(), minNorm))
            clipped.append(contentsOf: row.map { Float(Double($0) * scale) })
        }
        return try FeatureTensor(values: clipped, shape: features.shape)
    }
}
