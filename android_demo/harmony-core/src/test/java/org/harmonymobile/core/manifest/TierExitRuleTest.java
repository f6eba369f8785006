package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonException;
import org.junit.jupiter.api.Test;

class TierExitRuleTest {
    private final String manifestText = Vectors.load("manifest_signature.json").getString("manifest_text");

    @Test
    void aTierWithoutAnExitRuleExitsByMaxSoftmax() {
        assertEquals(0.9, Manifest.parse(manifestText).tiers().get(0).threshold());
    }

    @Test
    void aTierGatedByAnotherRuleIsRefusedNotMisread() {
        String gated = manifestText.replaceFirst("\"threshold\": 0.9,", "\"threshold\": 0.9, \"exit_rule\": \"slot_margin\",");
        assertTrue(gated.contains("slot_margin"));
        JsonException refused = assertThrows(JsonException.class, () -> Manifest.parse(gated));
        assertTrue(refused.getMessage().contains("exits by slot_margin"), refused.getMessage());
    }
}
