package org.harmonymobile.core.wire;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

class FeatureEncodingVectorTest {
    private final JsonObject vectors = Vectors.load("feature_encoding.json");
    private final byte[] federationSecret = Vectors.load("label_tokens.json").getHex("federation_secret");

    @Test
    void tensorsEncodeToPythonBytesAndBack() {
        List<JsonObject> cases = vectors.getObjectList("tensors");
        assertEquals(5, cases.size());
        for (JsonObject c : cases) {
            FeatureTensor tensor = new FeatureTensor(Vectors.floats(c, "values"), Vectors.ints(c, "shape"));
            assertEquals(c.getString("hmft"), Hex.encode(tensor.encode()), c.getString("name"));
            FeatureTensor decoded = FeatureTensor.decode(Hex.decode(c.getString("hmft")));
            assertEquals(tensor, decoded, c.getString("name"));
        }
    }

    @Test
    void uploadPlaintextsEqualPython() {
        for (JsonObject c : vectors.getObjectList("uploads")) {
            JsonObject meta = c.getObject("metadata");
            LabelTokens tokens = LabelTokens.forEpoch(federationSecret, c.getString("label_epoch"));
            List<byte[]> labelTokens = new ArrayList<>();
            for (String className : c.getStringList("class_names")) {
                labelTokens.add(tokens.token(className));
            }
            List<Integer> depths = new ArrayList<>();
            for (long depth : meta.getLongArray("split_depths")) {
                depths.add((int) depth);
            }
            UploadMetadata metadata = new UploadMetadata(labelTokens, depths, meta.getString("family"),
                    meta.getString("tier"), meta.getString("model_version"),
                    meta.has("clip_norm") ? meta.getDouble("clip_norm") : null,
                    meta.has("noise_multiplier") ? meta.getDouble("noise_multiplier") : null,
                    meta.has("label_dp_epsilon") ? meta.getDouble("label_dp_epsilon") : null);
            assertEquals(c.getString("metadata_json"), metadata.toJson(), c.getString("name"));
            FeatureTensor features = new FeatureTensor(Vectors.floats(c, "values"), Vectors.ints(c, "shape"));
            assertEquals(c.getString("plaintext"), Hex.encode(UploadPlaintext.encode(metadata, features)), c.getString("name"));
        }
    }

    @Test
    void decoderRejectsMalformedBodies() {
        byte[] good = new FeatureTensor(new float[] {1f, -2.5f}, new int[] {1, 2}).encode();
        assertThrows(WireFormatException.class, () -> FeatureTensor.decode(new byte[] {'H', 'M', 'F'}));
        for (int[] mutation : new int[][] {{0, 'X'}, {4, 2}, {5, 2}, {6, 0}, {6, 7}, {7, 1}, {8, 0}}) {
            byte[] bad = good.clone();
            bad[mutation[0]] = (byte) mutation[1];
            assertThrows(WireFormatException.class, () -> FeatureTensor.decode(bad), "byte " + mutation[0]);
        }
        byte[] truncated = java.util.Arrays.copyOf(good, good.length - 1);
        WireFormatException e = assertThrows(WireFormatException.class, () -> FeatureTensor.decode(truncated));
        assertTrue(e.getMessage().contains("data bytes"));
    }

    @Test
    void constructorChecksShape() {
        assertThrows(IllegalArgumentException.class, () -> new FeatureTensor(new float[3], new int[] {2, 2}));
        assertThrows(IllegalArgumentException.class, () -> new FeatureTensor(new float[0], new int[] {0}));
        assertThrows(IllegalArgumentException.class, () -> new FeatureTensor(new float[1], new int[] {1, 1, 1, 1, 1, 1, 1}));
        assertArrayEquals(new int[] {1, 2}, new FeatureTensor(new float[2], new int[] {1, 2}).shape());
    }

    @Test
    void metadataHasNoRoomForALabelAndValidatesFields() {
        byte[] token = new byte[8];
        assertThrows(IllegalArgumentException.class, () -> UploadMetadata.of(List.of(token), List.of(1, 2), "cnn", "t", "v"));
        assertThrows(IllegalArgumentException.class, () -> UploadMetadata.of(List.of(new byte[7]), List.of(1), "cnn", "t", "v"));
        assertThrows(IllegalArgumentException.class, () -> UploadMetadata.of(List.of(token), List.of(0), "cnn", "t", "v"));
        assertThrows(IllegalArgumentException.class, () -> UploadMetadata.of(List.of(token), List.of(1), "cnn", "Bad Tier", "v"));
        assertThrows(IllegalArgumentException.class, () -> UploadPlaintext.encode(
                UploadMetadata.of(List.of(token), List.of(1), "cnn", "t", "v"), new FeatureTensor(new float[2], new int[] {2, 1, 1, 1})));
    }
}
