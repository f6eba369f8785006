package org.harmonymobile.core.image;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;

/** The bundled 28x28 gray digits become any tier's input (3x32x32 too) without throwing. */
class PixelImagesTest {
    private static byte[] bytes(int... values) {
        byte[] out = new byte[values.length];
        for (int i = 0; i < values.length; i++) {
            out[i] = (byte) values[i];
        }
        return out;
    }

    @Test
    void halfPixelCentresAsPyTorchAndOpenCv() {
        // source centres at 0 and 1; target centres at -0.25 (clamped), 0.25, 0.75, 1.25 (clamped):
        // torch.nn.functional.interpolate gives 0, 63.75, 191.25, 255
        assertArrayEquals(bytes(0, 64, 191, 255), PixelImages.resize(bytes(0, 255), 1, 1, 2, 1, 4));
        assertArrayEquals(bytes(32, 223), PixelImages.resize(bytes(0, 64, 191, 255), 1, 1, 4, 1, 2)); // torch: 32, 223
    }

    @Test
    void aConstantImageStaysConstantAndTheSameSizeIsACopy() {
        byte[] gray = new byte[28 * 28];
        java.util.Arrays.fill(gray, (byte) 200);
        byte[] big = PixelImages.fit(gray, 1, 28, 28, 3, 32, 32);
        assertEquals(3 * 32 * 32, big.length);
        for (byte b : big) {
            assertEquals(200, b & 0xff);
        }
        byte[] same = PixelImages.resize(gray, 1, 28, 28, 28, 28);
        assertArrayEquals(gray, same);
    }

    @Test
    void grayIsReplicatedIntoRgbAndRgbBecomesLuminance() {
        assertArrayEquals(bytes(10, 20, 10, 20, 10, 20), PixelImages.fit(bytes(10, 20), 1, 1, 2, 3, 1, 2));
        assertArrayEquals(bytes(76, 150), PixelImages.fit(bytes(255, 0, 0, 255, 0, 0), 3, 1, 2, 1, 1, 2));
    }

    @Test
    void everyBundledSampleFitsEveryTierShape() throws Exception {
        Path samples = Path.of("../app/src/main/assets/samples/digits.json");
        JsonObject document = Json.parseObject(new String(Files.readAllBytes(samples), StandardCharsets.UTF_8));
        int height = document.getInt("height");
        int width = document.getInt("width");
        for (JsonObject sample : document.getObjectList("samples")) {
            long[] values = sample.getLongArray("pixels");
            byte[] pixels = new byte[values.length];
            for (int i = 0; i < values.length; i++) {
                pixels[i] = (byte) values[i];
            }
            for (int[] shape : List.of(new int[] {1, 28, 28}, new int[] {3, 32, 32}, new int[] {1, 32, 32})) {
                assertEquals(shape[0] * shape[1] * shape[2],
                        PixelImages.fit(pixels, 1, height, width, shape[0], shape[1], shape[2]).length);
            }
        }
    }

    @Test
    void badShapesSayWhatIsWrong() {
        assertThrows(IllegalArgumentException.class, () -> PixelImages.fit(new byte[5], 1, 2, 2, 1, 2, 2));
        assertThrows(IllegalArgumentException.class, () -> PixelImages.fit(new byte[4], 1, 2, 2, 2, 2, 2));
    }
}
