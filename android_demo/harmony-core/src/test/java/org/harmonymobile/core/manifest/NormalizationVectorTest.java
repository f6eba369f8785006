package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;

/** tests/vectors/pixel_normalization.json: 8-bit pixels to model input, bit for bit. */
class NormalizationVectorTest {
    @Test
    void normalizedPixelsEqualPython() {
        List<JsonObject> cases = Vectors.load("pixel_normalization.json").getObjectList("cases");
        assertEquals(4, cases.size());
        for (JsonObject c : cases) {
            Normalization normalization = new Normalization(
                    c.getDouble("pixel_scale"), c.getDoubleArray("mean"), c.getDoubleArray("std"));
            long[] pixels = c.getLongArray("pixels");
            byte[] bytes = new byte[pixels.length];
            for (int i = 0; i < pixels.length; i++) {
                bytes[i] = (byte) pixels[i];
            }
            assertArrayEquals(Vectors.floats(c, "values"), normalization.apply(bytes, c.getInt("channels")), c.getString("name"));
        }
    }
}
