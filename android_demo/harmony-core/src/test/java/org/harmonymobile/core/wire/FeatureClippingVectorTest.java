package org.harmonymobile.core.wire;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.List;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

/** tests/vectors/feature_clipping.json: z * min(1, C / ||z||) per row, as Python's clip_rows. */
class FeatureClippingVectorTest {
    private final List<JsonObject> cases = Vectors.load("feature_clipping.json").getObjectList("cases");

    @Test
    void clippedRowsEqualPython() {
        assertEquals(5, cases.size());
        for (JsonObject c : cases) {
            String name = c.getString("name");
            float[][] rows = matrix(c, "rows");
            float[] values = new float[rows.length * rows[0].length];
            for (int r = 0; r < rows.length; r++) {
                System.arraycopy(rows[r], 0, values, r * rows[0].length, rows[0].length);
            }
            FeatureTensor features = new FeatureTensor(values, new int[] {rows.length, rows[0].length});
            FeatureTensor clipped = FeatureClipping.clipRows(features, c.getDouble("clip"));
            assertArrayEquals(features.shape(), clipped.shape(), name);
            float[][] expected = matrix(c, "clipped");
            assertEquals(rows.length, expected.length, name);
            for (int r = 0; r < expected.length; r++) {
                for (int i = 0; i < expected[r].length; i++) {
                    double python = expected[r][i];
                    // The vector's bound for float64 arithmetic rounded to float32: 1e-6 relative (zeros exact).
                    assertEquals(python, clipped.data()[r * expected[r].length + i], 1e-6 * Math.abs(python), name);
                }
            }
        }
    }

    @Test
    void sampleIdsHashTheRowsBeforeClipping() throws NoSuchAlgorithmException {
        // The phones draw no label DP yet; this pins the bytes of Python's default sample id
        // (label_draws.py feature_sample_ids) that an implementation would key its stored draws on.
        for (JsonObject c : cases) {
            float[][] rows = matrix(c, "rows");
            List<String> ids = c.getStringList("sample_ids");
            assertEquals(rows.length, ids.size(), c.getString("name"));
            for (int r = 0; r < rows.length; r++) {
                ByteBuffer bytes = ByteBuffer.allocate(4 * rows[r].length).order(ByteOrder.LITTLE_ENDIAN);
                bytes.asFloatBuffer().put(rows[r]);
                byte[] digest = MessageDigest.getInstance("SHA-256").digest(bytes.array());
                assertEquals(ids.get(r), Hex.encode(digest), c.getString("name"));
            }
        }
    }

    @Test
    void clipNormMustBeFiniteAndPositive() {
        FeatureTensor row = new FeatureTensor(new float[] {3f, 4f}, new int[] {1, 2});
        for (double clip : new double[] {0, -1, Double.NaN, Double.POSITIVE_INFINITY}) {
            assertThrows(IllegalArgumentException.class, () -> FeatureClipping.clipRows(row, clip), "clip " + clip);
        }
    }

    /** A JSON array of arrays of numbers, each narrowed to float32 (the vector writes exact float32 values). */
    private static float[][] matrix(JsonObject c, String key) {
        List<Object> rows = c.getArray(key);
        float[][] out = new float[rows.size()][];
        for (int r = 0; r < out.length; r++) {
            List<?> row = (List<?>) rows.get(r);
            out[r] = new float[row.size()];
            for (int i = 0; i < out[r].length; i++) {
                out[r][i] = ((Number) row.get(i)).floatValue();
            }
        }
        return out;
    }
}
