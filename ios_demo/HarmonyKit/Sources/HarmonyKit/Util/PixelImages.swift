import Foundation

/// 8-bit images as channel-major planes (C x H x W, before the manifest's normalization), brought to
/// a tier's input shape: the bundled 28x28 gray sample digits must also feed a 3x32x32 tier.
/// Bilinear resampling with pixel centres at (i + 0.5) (as PyTorch's `interpolate(mode="bilinear",
/// align_corners=False)`), edges clamped; gray becomes RGB by replication, RGB becomes gray by
/// ITU-R BT.601 luminance. harmony-core's `image.PixelImages` is the same code.
public enum PixelImages {
    public static func fit(
        _ pixels: [UInt8], channels: Int, height: Int, width: Int, toChannels: Int, toHeight: Int, toWidth: Int
    ) throws -> [UInt8] {
        guard channels > 0, height > 0, width > 0, pixels.count == channels * height * width else {
            throw HarmonyFormatError("pixels hold \(pixels.count) bytes, not \(channels)x\(height)x\(width)")
        }
        guard [1, 3].contains(channels), [1, 3].contains(toChannels), toHeight > 0, toWidth > 0 else {
            throw HarmonyFormatError("only 1 or 3 channels and positive sizes: \(channels) -> \(toChannels), \(toHeight)x\(toWidth)")
        }
        let resized = resize(pixels, channels: channels, height: height, width: width, toHeight: toHeight, toWidth: toWidth)
        return convert(resized, channels: channels, plane: toHeight * toWidth, toChannels: toChannels)
    }

    public static func resize(
        _ pixels: [UInt8], channels: Int, height: Int, width: Int, toHeight: Int, toWidth: Int
    ) -> [UInt8] {
        if height == toHeight, width == toWidth { return pixels }
        var out = [UInt8](repeating: 0, count: channels * toHeight * toWidth)
        let scaleY = Double(height) / Double(toHeight), scaleX = Double(width) / Double(toWidth)
        func source(_ target: Int, _ scale: Double, _ size: Int) -> (Int, Int, Double) {
            let position = min(max((Double(target) + 0.5) * scale - 0.5, 0), Double(size - 1))
            let low = Int(position.rounded(.down))
            return (low, min(low + 1, size - 1), position - Double(low))
        }
        for c in 0..<channels {
            let base = c * height * width
            for y in 0..<toHeight {
                let (y0, y1, fy) = source(y, scaleY, height)
                for x in 0..<toWidth {
                    let (x0, x1, fx) = source(x, scaleX, width)
                    func at(_ row: Int, _ column: Int) -> Double { Double(pixels[base + row * width + column]) }
                    let top = at(y0, x0) * (1 - fx) + at(y0, x1) * fx
                    let bottom = at(y1, x0) * (1 - fx) + at(y1, x1) * fx
                    // Java's Math.round: halves round up
                    out[(c * toHeight + y) * toWidth + x] = UInt8((top * (1 - fy) + bottom * fy + 0.5).rounded(.down))
                }
            }
        }
        return out
    }

    private static func convert(_ pixels: [UInt8], channels: Int, plane: Int, toChannels: Int) -> [UInt8] {
        if channels == toChannels { return pixels }
        if toChannels == 3 { return pixels + pixels + pixels }
        return (0..<plane).map { i in
            let luma = 0.299 * Double(pixels[i]) + 0.587 * Double(pixels[plane + i]) + 0.114 * Double(pixels[2 * plane + i])
            return UInt8((luma + 0.5).rounded(.down))
        }
    }
}
