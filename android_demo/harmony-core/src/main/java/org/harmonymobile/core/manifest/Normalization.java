package org.harmonymobile.core.manifest;

import org.harmonymobile.core.json.JsonObject;

/** value = (pixel * pixelScale - mean[c]) / std[c], per channel c, in NCHW order. */
public record Normalization(double pixelScale, double[] mean, double[] std) {
    static Normalization from(JsonObject json) {
        return new Normalization(json.getDouble("pixel_scale"), json.getDoubleArray("mean"), json.getDoubleArray("std"));
    }

    /**
     * Turns 8-bit pixels laid out as channels x (height * width) into the model's float input.
     *
     * @param pixels one byte per channel value, channel-major (NCHW without the batch)
     */
    public float[] apply(byte[] pixels, int channels) {
        if (channels != mean.length || pixels.length % channels != 0) {
            throw new IllegalArgumentException(
                    pixels.length + " pixel values do not fit " + channels + " channel(s) of this normalization");
        }
        int plane = pixels.length / channels;
        float[] out = new float[pixels.length];
        for (int c = 0; c < channels; c++) {
            for (int i = 0; i < plane; i++) {
                int index = c * plane + i;
                out[index] = (float) (((pixels[index] & 0xff) * pixelScale - mean[c]) / std[c]);
            }
        }
        return out;
    }
}
