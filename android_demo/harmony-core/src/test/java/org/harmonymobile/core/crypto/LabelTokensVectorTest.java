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

    @Test
    void roundKeysAndTokensEqualPython() {
        byte[] secret = vectors.getHex("federation_secret");
        int checked = 0;
        for (JsonObject round : vectors.getObjectList("cases")) {
            long roundId = round.getLong("round_id");
            LabelTokens tokens = LabelTokens.forRound(secret, roundId);
            assertEquals(round.getString("round_key"), Hex.encode(tokens.roundKey()), "round key of round " + roundId);
            for (Map.Entry<String, Object> token : round.getObject("tokens").asMap().entrySet()) {
                int classId = Integer.parseInt(token.getKey());
                assertEquals(token.getValue(), Hex.encode(tokens.token(classId)), "round " + roundId + " class " + classId);
                checked++;
            }
        }
        assertEquals(60, checked);
    }

    @Test
    void roundsAreUnlinkableAndClassesDistinct() {
        byte[] secret = vectors.getHex("federation_secret");
        assertNotEquals(Hex.encode(LabelTokens.forRound(secret, 1).token(3)), Hex.encode(LabelTokens.forRound(secret, 2).token(3)));
        assertNotEquals(Hex.encode(LabelTokens.forRound(secret, 1).token(3)), Hex.encode(LabelTokens.forRound(secret, 1).token(4)));
    }

    @Test
    void rejectsShortSecretsAndNegativeClasses() {
        assertThrows(IllegalArgumentException.class, () -> LabelTokens.forRound(new byte[15], 0));
        assertThrows(IllegalArgumentException.class, () -> LabelTokens.forRound(new byte[16], 0).token(-1));
    }
}
