package org.harmonymobile.core.crypto;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.harmonymobile.core.ExitDecoder;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

class ExitOrderVectorTest {
    private final JsonObject vectors = Vectors.load("exit_order.json");
    private final byte[] secret = vectors.getHex("federation_secret");

    @Test
    void exitOrderEqualsPython() {
        List<JsonObject> cases = vectors.getObjectList("cases");
        assertEquals(5, cases.size());
        for (JsonObject c : cases) {
            String name = c.getString("name");
            List<String> classNames = c.getStringList("class_names");
            LabelTokens tokens = LabelTokens.forEpoch(secret, c.getString("label_epoch"));
            List<String> hex = new ArrayList<>();
            for (String className : classNames) {
                hex.add(Hex.encode(tokens.token(className)));
            }
            assertEquals(c.getStringList("tokens"), hex, name);
            assertEquals(c.getStringList("exit_classes"), tokens.exitOrder(classNames), name);
        }
    }

    @Test
    void theDecoderMapsEachOutputToItsClassIndex() {
        for (JsonObject c : vectors.getObjectList("cases")) {
            List<String> classNames = c.getStringList("class_names");
            List<String> expected = c.getStringList("exit_classes");
            ExitDecoder decoder = new ExitDecoder(new FederationKey(secret), c.getString("label_epoch"), classNames);
            assertEquals(expected.size(), decoder.outputs());
            assertEquals(expected, decoder.exitClasses());
            for (int j = 0; j < expected.size(); j++) {
                assertEquals(classNames.indexOf(expected.get(j)), decoder.classIndex(j), c.getString("name") + " output " + j);
            }
            assertEquals(-1, decoder.classIndex(-1), "non-finite logits name no class");
            assertThrows(IndexOutOfBoundsException.class, () -> decoder.classIndex(expected.size()));
        }
    }

    @Test
    void tokensCompareAsUnsignedBytes() {
        // The last case needs it: a signed comparison (Java's byte) gives another order.
        JsonObject c = vectors.getObjectList("cases").get(4);
        List<String> classNames = c.getStringList("class_names");
        LabelTokens tokens = LabelTokens.forEpoch(secret, c.getString("label_epoch"));
        List<String> signed = new ArrayList<>(classNames);
        signed.sort((a, b) -> java.util.Arrays.compare(tokens.token(a), tokens.token(b)));
        assertNotEquals(c.getStringList("exit_classes"), signed);

        assertTrue(LabelTokens.compareUnsigned(new byte[] {(byte) 0x80}, new byte[] {0x7f}) > 0);
        assertTrue(LabelTokens.compareUnsigned(new byte[] {1, (byte) 0xff}, new byte[] {1, 0x00}) > 0);
        assertTrue(LabelTokens.compareUnsigned(new byte[] {(byte) 0xff, 0}, new byte[] {(byte) 0xff, 1}) < 0);
        assertEquals(0, LabelTokens.compareUnsigned(Hex.decode("86b7b0833364ffcf"), Hex.decode("86b7b0833364ffcf")));
    }

    @Test
    void epochsAreChecked() {
        assertThrows(IllegalArgumentException.class, () -> new ExitDecoder(new FederationKey(secret), null, List.of("0")));
        assertThrows(IllegalArgumentException.class, () -> new ExitDecoder(new FederationKey(secret), "a b", List.of("0")));
    }
}
