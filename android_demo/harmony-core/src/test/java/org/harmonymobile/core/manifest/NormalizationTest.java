package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

/** The app turns 8-bit pixels into model input exactly as the manifest says: (p / 255 - mean[c]) / std[c]. */
class NormalizationTest {
    @Test
    void grayscaleMatchesTheTrainingNormalization() {
        Normalization mnist = new Normalization(1 / 255.0, new double[] {0.1307}, new double[] {0.3081});
        float[] out = mnist.apply(new byte[] {0, (byte) 255, (byte) 128}, 1);
        assertEquals((float) ((0 - 0.1307) / 0.3081), out[0]);
        assertEquals((float) ((1 - 0.1307) / 0.3081), out[1]);
        assertEquals((float) ((128 / 255.0 - 0.1307) / 0.3081), out[2]);
    }

    @Test
    void channelsArePlanesInNchwOrder() {
        Normalization rgb = new Normalization(1.0, new double[] {0, 10, 20}, new double[] {1, 2, 4});
        byte[] pixels = {1, 2, 30, 40, 100, 120}; // R plane, G plane, B plane of a 2-pixel image
        assertArrayEquals(new float[] {1, 2, 10, 15, 20, 25}, rgb.apply(pixels, 3));
        assertThrows(IllegalArgumentException.class, () -> rgb.apply(pixels, 1));
        assertThrows(IllegalArgumentException.class, () -> rgb.apply(new byte[5], 3));
    }

    @Test
    void tensorSpecCountsOneSample() {
        assertEquals(784, new TensorSpec("image", new long[] {1, 1, 28, 28}, "float32").elementsPerSample());
        assertEquals(4096, new TensorSpec("features", new long[] {8, 64, 8, 8}, "float32").elementsPerSample());
    }
}
