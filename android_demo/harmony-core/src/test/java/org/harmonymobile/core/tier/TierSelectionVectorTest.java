package org.harmonymobile.core.tier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.NoSuchElementException;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.manifest.Artifact;
import org.harmonymobile.core.manifest.Normalization;
import org.harmonymobile.core.manifest.TensorSpec;
import org.harmonymobile.core.manifest.TierEntry;
import org.junit.jupiter.api.Test;

/** tests/vectors/tier_selection.json: the same device class and tier as harmony_mobile/models/tier_selection.py. */
class TierSelectionVectorTest {
    private final JsonObject vectors = Vectors.load("tier_selection.json");

    private static TierEntry tier(JsonObject json) {
        List<String> backends = json.getStringList("backends");
        List<Artifact> artifacts = new ArrayList<>();
        for (String backend : backends) {
            artifacts.add(new Artifact(backend, "fp32", "pte", json.getString("name") + "/" + backend, "0".repeat(64), 1, 1, 1));
        }
        return new TierEntry(json.getString("name"), "cnn", json.getInt("split_depth"), json.getDouble("width"),
                new TensorSpec("image", new long[] {1, 1, 28, 28}, "float32"),
                new Normalization(1 / 255.0, new double[] {0.1307}, new double[] {0.3081}), List.of(), List.of(),
                new long[] {64, 8, 8}, 0.9, List.of("fp32"), backends, 2.0, artifacts, TierEntry.MAX_SOFTMAX);
    }

    @Test
    void deviceClassesAndSelectedTiersEqualPython() {
        JsonObject sets = vectors.getObject("tier_sets");
        List<JsonObject> cases = vectors.getObjectList("cases");
        assertEquals(39, cases.size());
        for (JsonObject c : cases) {
            List<TierEntry> tiers = new ArrayList<>();
            for (JsonObject t : sets.getObjectList(c.getString("tiers"))) {
                tiers.add(tier(t));
            }
            JsonObject d = c.getObject("device");
            DeviceCapabilities device = new DeviceCapabilities(d.getString("platform"), d.getLong("total_ram_mb"),
                    d.getInt("big_cores"), d.getBoolean("has_npu"), d.getInt("os_version"), d.getBoolean("low_ram_device"));
            String label = c.getString("tiers") + " / " + c.getString("device_name");
            assertEquals(c.getString("device_class"), DeviceClass.of(device).name().toLowerCase(Locale.ROOT), label);
            if (c.has("selected")) {
                assertEquals(c.getString("selected"), TierSelector.select(tiers, device).name(), label);
            } else {
                assertThrows(NoSuchElementException.class, () -> TierSelector.select(tiers, device), label);
            }
        }
    }
}
