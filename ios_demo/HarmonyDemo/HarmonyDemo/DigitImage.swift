import CoreGraphics
import Foundation
import HarmonyKit
import UIKit

/// An image as 8-bit planes, channel-major (C x H x W), before the manifest's normalization.
struct PixelImage: Equatable {
    let channels: Int
    let height: Int
    let width: Int
    let pixels: [UInt8]

    /// The model input: the tier's normalization applied, after checking the tier's input shape.
    func modelInput(for tier: TierEntry) throws -> [Float] {
        let shape = tier.input.shape // (1, C, H, W)
        guard shape.count == 4, shape[1] == channels, shape[2] == height, shape[3] == width else {
            throw InferenceError("image is \(channels)x\(height)x\(width); tier \(tier.name) takes \(Array(shape.dropFirst()))")
        }
        return try tier.normalization.apply(pixels: pixels, channels: channels)
    }

    /// The same picture at the tier's input shape: resized, a gray digit replicated into R, G and B
    /// (the bundled digits are 28x28 gray; a CIFAR tier takes 3x32x32).
    func fitted(to tier: TierEntry) throws -> PixelImage {
        let shape = tier.input.shape // (1, C, H, W)
        guard shape.count == 4 else { throw InferenceError("tier \(tier.name) has input shape \(shape)") }
        let fitted = try PixelImages.fit(
            pixels, channels: channels, height: height, width: width,
            toChannels: shape[1], toHeight: shape[2], toWidth: shape[3])
        return PixelImage(channels: shape[1], height: shape[2], width: shape[3], pixels: fitted)
    }

    /// For display (gray for one channel, RGB for three).
    var cgImage: CGImage? {
        let plane = height * width
        var rgba = [UInt8](repeating: 255, count: plane * 4)
        for index in 0..<plane {
            for component in 0..<3 {
                rgba[index * 4 + component] = pixels[(channels == 1 ? 0 : component * plane) + index]
            }
        }
        guard let provider = CGDataProvider(data: Data(rgba) as CFData) else { return nil }
        return CGImage(
            width: width, height: height, bitsPerComponent: 8, bitsPerPixel: 32, bytesPerRow: width * 4,
            space: CGColorSpaceCreateDeviceRGB(), bitmapInfo: CGBitmapInfo(rawValue: CGImageAlphaInfo.noneSkipLast.rawValue),
            provider: provider, decode: nil, shouldInterpolate: false, intent: .defaultIntent)
    }

    /// A photo as the tier's input image: center square crop, resized to H x W; for one-channel
    /// (MNIST-style) tiers luminance, inverted when the background is bright, because the training
    /// digits are white on black.
    static func from(photo: UIImage, channels: Int, height: Int, width: Int) -> PixelImage? {
        let format = UIGraphicsImageRendererFormat()
        format.scale = 1
        format.opaque = true
        let target = CGSize(width: width, height: height)
        let side = min(photo.size.width, photo.size.height)
        guard side > 0 else { return nil }
        let scale = CGFloat(width) / side
        let drawn = CGSize(width: photo.size.width * scale, height: photo.size.height * scale)
        let square = UIGraphicsImageRenderer(size: target, format: format).image { _ in
            // draw(in:) honours the photo's orientation
            photo.draw(in: CGRect(
                x: (target.width - drawn.width) / 2, y: (target.height - drawn.height) / 2,
                width: drawn.width, height: drawn.height))
        }
        guard let cgImage = square.cgImage else { return nil }
        var rgba = [UInt8](repeating: 0, count: width * height * 4)
        let drewPixels = rgba.withUnsafeMutableBytes { buffer -> Bool in
            guard let context = CGContext(
                data: buffer.baseAddress, width: width, height: height, bitsPerComponent: 8, bytesPerRow: width * 4,
                space: CGColorSpaceCreateDeviceRGB(), bitmapInfo: CGImageAlphaInfo.noneSkipLast.rawValue)
            else { return false }
            context.draw(cgImage, in: CGRect(x: 0, y: 0, width: width, height: height))
            return true
        }
        guard drewPixels else { return nil }
        let plane = width * height
        var pixels = [UInt8](repeating: 0, count: channels * plane)
        if channels == 1 {
            let luma = (0..<plane).map { index -> Int in
                let r = Double(rgba[index * 4]), g = Double(rgba[index * 4 + 1]), b = Double(rgba[index * 4 + 2])
                return Int(0.299 * r + 0.587 * g + 0.114 * b)
            }
            let invert = Double(luma.reduce(0, +)) / Double(plane) > 127
            for index in 0..<plane {
                pixels[index] = UInt8(clamping: invert ? 255 - luma[index] : luma[index])
            }
        } else {
            for index in 0..<plane {
                for component in 0..<min(channels, 3) {
                    pixels[component * plane + index] = rgba[index * 4 + component]
                }
            }
        }
        return PixelImage(channels: channels, height: height, width: width, pixels: pixels)
    }
}

/// A bundled, labelled digit (Resources/digits.json: the same 20 real MNIST digits as the Android
/// demo's assets/samples/digits.json, written by android_demo/tools/make_sample_digits.py).
struct SampleDigit: Identifiable {
    let id: Int
    let label: Int
    let image: PixelImage

    static func loadBundled() -> [SampleDigit] {
        struct File: Decodable {
            struct Sample: Decodable {
                let label: Int
                let pixels: [Int]
            }

            let height: Int
            let width: Int
            let samples: [Sample]
        }
        guard let url = Bundle.main.url(forResource: "digits", withExtension: "json"),
              let data = try? Data(contentsOf: url),
              let file = try? JSONDecoder().decode(File.self, from: data)
        else { return [] }
        return file.samples.enumerated().map { index, sample in
            SampleDigit(
                id: index, label: sample.label,
                image: PixelImage(channels: 1, height: file.height, width: file.width,
                                  pixels: sample.pixels.map { UInt8(clamping: $0) }))
        }
    }
}
