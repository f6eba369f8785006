package org.harmonymobile.core.crypto;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;

class SlotMappingVectorTest {
    private final JsonObject vectors = Vectors.load("slot_mapping.json");
    private final byte[] secret = vectors.getHex("federation_secret");

    @Test
    void slotClassesEqualPython() {
        List<JsonObject> cases = vectors.getObjectList("cases");
        assertEquals(4, cases.size());
        for (JsonObject c : cases) {
            LabelTokens tokens = LabelTokens.forEpoch(secret, c.getString("label_epoch"));
            List<Object> expected = new ArrayList<>(c.getArray("slot_classes"));
            assertEquals(expected, new ArrayList<Object>(
                    tokens.slotClasses(c.getStringList("class_names"), c.getStringList("slot_table"))), c.getString("name"));
        }
    }

    @Test
    void malformedTokensAreRejected() {
        LabelTokens tokens = LabelTokens.forEpoch(secret, "e7");
        assertThrows(IllegalArgumentException.class, () -> tokens.slotClasses(List.of("0"), List.of("0123456789ABCDEF")));
        assertThrows(IllegalArgumentException.class, () -> tokens.slotClasses(List.of("0"), List.of("0123")));
    }
}
