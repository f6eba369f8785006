package org.harmonymobile.core.image;

/**
 * 8-bit images as channel-major planes (C x H x W, before the manifest's normalization), brought to
 * a tier's input shape: the bundled 28x28 gray sample digits must also feed a 3x32x32 tier, and a
 * camera picture any tier. Bilinear resampling with pixel centres at (i + 0.5) (as PyTorch's
 * {@code interpolate(mode="bilinear", align_corners=False)} and OpenCV's INTER_LINEAR), edges clamped;
 * gray becomes RGB by replication and RGB becomes gray by ITU-R BT.601 luminance. HarmonyKit's
 * PixelImages.swift is the same code.
 */
public final class PixelImages {
    private PixelImages() {}

    /** {@code pixels} (channels x height x width) at {@code toChannels} x {@code toHeight} x {@code toWidth}. */
    public static byte[] fit(byte[] pixels, int channels, int height, int width, int toChannels, int toHeight, int toWidth) {
        if (channels <= 0 || height <= 0 || width <= 0 || pixels.length != channels * height * width) {
            throw new IllegalArgumentException("pixels hold " + pixels.length + " bytes, not " + channels + "x" + height + "x" + width);
        }
        if (toChannels != 1 && toChannels != 3 || channels != 1 && channels != 3 || toHeight <= 0 || toWidth <= 0) {
            throw new IllegalArgumentException("only 1 or 3 channels and positive sizes: " + channels + " -> " + toChannels
                    + " channels, " + toHeight + "x" + toWidth);
        }
        return convertChannels(resize(pixels, channels, height, width, toHeight, toWidth), channels, toHeight * toWidth, toChannels);
    }

    /** Bilinear resize of every plane. */
    public static byte[] resize(byte[] pixels, int channels, int height, int width, int toHeight, int toWidth) {
        if (height == toHeight && width == toWidth) {
            return pixels.clone();
        }
        byte[] out = new byte[channels * toHeight * toWidth];
        double scaleY = (double) height / toHeight;
        double scaleX = (double) width / toWidth;
        for (int c = 0; c < channels; c++) {
            int in = c * height * width;
            for (int y = 0; y < toHeight; y++) {
                double sy = clamp((y + 0.5) * scaleY - 0.5, height - 1);
                int y0 = (int) Math.floor(sy);
                int y1 = Math.min(y0 + 1, height - 1);
                double fy = sy - y0;
                for (int x = 0; x < toWidth; x++) {
                    double sx = clamp((x + 0.5) * scaleX - 0.5, width - 1);
                    int x0 = (int) Math.floor(sx);
                    int x1 = Math.min(x0 + 1, width - 1);
                    double fx = sx - x0;
                    double top = value(pixels, in + y0 * width + x0) * (1 - fx) + value(pixels, in + y0 * width + x1) * fx;
                    double bottom = value(pixels, in + y1 * width + x0) * (1 - fx) + value(pixels, in + y1 * width + x1) * fx;
                    out[(c * toHeight + y) * toWidth + x] = (byte) Math.round(top * (1 - fy) + bottom * fy);
                }
            }
        }
        return out;
    }

    private static byte[] convertChannels(byte[] pixels, int channels, int plane, int toChannels) {
        if (channels == toChannels) {
            return pixels;
        }
        byte[] out = new byte[toChannels * plane];
        for (int i = 0; i < plane; i++) {
            if (toChannels == 3) {
                out[i] = out[plane + i] = out[2 * plane + i] = pixels[i];
            } else {
                double luma = 0.299 * value(pixels, i) + 0.587 * value(pixels, plane + i) + 0.114 * value(pixels, 2 * plane + i);
                out[i] = (byte) Math.round(luma);
            }
        }
        return out;
    }

    private static double clamp(double position, int last) {
        return Math.max(0.0, Math.min(position, last));
    }

    private static int value(byte[] pixels, int index) {
        return pixels[index] & 0xff;
    }
}
