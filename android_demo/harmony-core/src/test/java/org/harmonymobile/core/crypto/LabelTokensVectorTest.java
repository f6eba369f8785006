package org.harmonymobile.core.crypto;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Map;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

class LabelTokensVectorTest {
    private final JsonObject vectors = Vectors.load("label_tokens.json");
    private final byte[] secret = vectors.getHex("federation_secret");

    @Test
    void epochKeysAndClassNameTokensEqualPython() {
        int checked = 0;
        for (JsonObject epoch : vectors.getObjectList("cases")) {
            String labelEpoch = epoch.getString("label_epoch");
            LabelTokens tokens = LabelTokens.forEpoch(secret, labelEpoch);
            assertEquals(epoch.getString("epoch_key"), Hex.encode(tokens.epochKey()), "epoch key of " + labelEpoch);
            for (Map.Entry<String, Object> token : epoch.getObject("tokens").asMap().entrySet()) {
                assertEquals(token.getValue(), Hex.encode(tokens.token(token.getKey())),
                        "epoch " + labelEpoch + " class " + token.getKey());
                checked++;
            }
        }
        assertEquals(75, checked);
    }

    @Test
    void invalidEpochsAreRejectedLikePython() {
        for (String epoch : vectors.getStringList("invalid_epochs")) {
            assertThrows(IllegalArgumentException.class, () -> LabelTokens.forEpoch(secret, epoch), epoch);
        }
        assertThrows(IllegalArgumentException.class, () -> LabelTokens.forEpoch(secret, null));
    }

    @Test
    void epochsAreUnlinkableAndClassesDistinct() {
        assertNotEquals(Hex.encode(LabelTokens.forEpoch(secret, "e1").token("3")),
                Hex.encode(LabelTokens.forEpoch(secret, "e2").token("3")));
        assertNotEquals(Hex.encode(LabelTokens.forEpoch(secret, "e1").token("3")),
                Hex.encode(LabelTokens.forEpoch(secret, "e1").token("4")));
    }

    @Test
    void rejectsShortSecretsAndEmptyNames() {
        assertThrows(IllegalArgumentException.class, () -> LabelTokens.forEpoch(new byte[15], "e0"));
        assertThrows(IllegalArgumentException.class, () -> LabelTokens.forEpoch(new byte[16], "e0").token(""));
    }
}
