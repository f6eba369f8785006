package org.harmonymobile.demo

import android.content.Context
import android.graphics.Bitmap
import android.graphics.Color
import org.harmonymobile.core.image.PixelImages
import org.harmonymobile.core.json.Json
import org.harmonymobile.core.manifest.TierEntry

/** An image as 8-bit planes, channel-major (C x H x W), before the manifest's normalization. */
class PixelImage(val channels: Int, val height: Int, val width: Int, val pixels: ByteArray) {

    /** The model input: the tier's normalization applied (value = (pixel * scale - mean[c]) / std[c]). */
    fun toModelInput(tier: TierEntry): FloatArray {
        val shape = tier.input().shape() // (batch, C, H, W)
        require(shape[1].toInt() == channels && shape[2].toInt() == height && shape[3].toInt() == width) {
            "image is ${channels}x${height}x$width; tier ${tier.name()} takes ${shape.drop(1)}"
        }
        return tier.normalization().apply(pixels, channels)
    }

    /** This image at the tier's input shape (C, H, W): resized, gray replicated to RGB or RGB to gray. */
    fun fitTo(tier: TierEntry): PixelImage {
        val shape = tier.input().shape() // (batch, C, H, W)
        val (c, h, w) = Triple(shape[1].toInt(), shape[2].toInt(), shape[3].toInt())
        return PixelImage(c, h, w, PixelImages.fit(pixels, channels, height, width, c, h, w))
    }

    /** A displayable bitmap (grayscale for one channel, RGB for three). */
    fun toBitmap(): Bitmap {
        val plane = height * width
        val colors = IntArray(plane) { i ->
            if (channels == 1) {
                val v = pixels[i].toInt() and 0xff
                Color.rgb(v, v, v)
            } else {
                Color.rgb(pixels[i].toInt() and 0xff, pixels[plane + i].toInt() and 0xff, pixels[2 * plane + i].toInt() and 0xff)
            }
        }
        return Bitmap.createBitmap(colors, width, height, Bitmap.Config.ARGB_8888)
    }

    companion object {
        /**
         * A camera picture as the tier's input image: center square crop, resize to H x W, and for
         * one-channel (MNIST-style) tiers luminance, inverted when the background is bright, because
         * the training digits are white on black.
         */
        fun fromCamera(bitmap: Bitmap, channels: Int, height: Int, width: Int): PixelImage {
            val side = minOf(bitmap.width, bitmap.height)
            val square = Bitmap.createBitmap(bitmap, (bitmap.width - side) / 2, (bitmap.height - side) / 2, side, side)
            val scaled = Bitmap.createScaledBitmap(square, width, height, true)
            val argb = IntArray(width * height).also { scaled.getPixels(it, 0, width, 0, 0, width, height) }
            val plane = width * height
            val pixels = ByteArray(channels * plane)
            if (channels == 1) {
                val luma = IntArray(plane) { i ->
                    val c = argb[i]
                    (0.299 * Color.red(c) + 0.587 * Color.green(c) + 0.114 * Color.blue(c)).toInt()
                }
                val invert = luma.average() > 127
                for (i in 0 until plane) {
                    pixels[i] = (if (invert) 255 - luma[i] else luma[i]).toByte()
                }
            } else {
                for (i in 0 until plane) {
                    pixels[i] = Color.red(argb[i]).toByte()
                    pixels[plane + i] = Color.green(argb[i]).toByte()
                    pixels[2 * plane + i] = Color.blue(argb[i]).toByte()
                }
            }
            return PixelImage(channels, height, width, pixels)
        }
    }
}

/** A bundled, labelled digit (assets/samples/digits.json, written by android_demo/tools/make_sample_digits.py). */
class SampleDigit(val label: Int, val image: PixelImage)

object SampleDigits {
    fun load(context: Context): List<SampleDigit> {
        val text = context.assets.open("samples/digits.json").use { it.readBytes().toString(Charsets.UTF_8) }
        val document = Json.parseObject(text)
        val height = document.getInt("height")
        val width = document.getInt("width")
        return document.getObjectList("samples").map { sample ->
            val pixels = sample.getLongArray("pixels").map { it.toInt().toByte() }.toByteArray()
            SampleDigit(sample.getInt("label"), PixelImage(1, height, width, pixels))
        }
    }
}
