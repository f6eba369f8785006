package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonException;
import org.junit.jupiter.api.Test;

class TierExitRuleTest {
    private static final String PROTOTYPES = "\"slot_prototypes\": {\"path\": \"slot_prototypes.hmft\", \"sha256\": \""
            + "0".repeat(64) + "\", \"size\": 8, \"shape\": [10, 4096]},";
    private final String manifestText = Vectors.load("manifest_signature.json").getString("manifest_text");

    private String gated(String rule) {
        return manifestText.replaceFirst("\"threshold\": 0.9,", "\"threshold\": 0.9, \"exit_rule\": \"" + rule + "\",");
    }

    @Test
    void aTierWithoutAnExitRuleExitsByMaxSoftmax() {
        Manifest manifest = Manifest.parse(manifestText);
        assertEquals(TierEntry.MAX_SOFTMAX, manifest.tiers().get(0).exitRule());
        assertNull(manifest.slotPrototypes());
    }

    @Test
    void aSlotGatedTierComesWithTheManifestsPrototypes() {
        String text = gated("slot_margin").replaceFirst("\"tiers\":", PROTOTYPES + " \"tiers\":");
        Manifest manifest = Manifest.parse(text);
        assertEquals(TierEntry.SLOT_MARGIN, manifest.tiers().get(0).exitRule());
        assertEquals("slot_prototypes.hmft", manifest.slotPrototypes().path());
        assertEquals(4096, manifest.slotPrototypes().shape()[1]);
        JsonException missing = assertThrows(JsonException.class, () -> Manifest.parse(gated("slot_margin")));
        assertTrue(missing.getMessage().contains("no slot_prototypes"), missing.getMessage());
    }

    @Test
    void aTierGatedByARuleThisBuildDoesNotComputeIsRefusedNotMisread() {
        JsonException refused = assertThrows(JsonException.class, () -> Manifest.parse(gated("energy")));
        assertTrue(refused.getMessage().contains("exits by energy"), refused.getMessage());
    }
}
