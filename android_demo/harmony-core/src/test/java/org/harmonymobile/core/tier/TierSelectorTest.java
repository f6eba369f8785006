package org.harmonymobile.core.tier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.List;
import java.util.NoSuchElementException;
import org.harmonymobile.core.manifest.Artifact;
import org.harmonymobile.core.manifest.Normalization;
import org.harmonymobile.core.manifest.TensorSpec;
import org.harmonymobile.core.manifest.TierEntry;
import org.junit.jupiter.api.Test;

class TierSelectorTest {
    /** The default tiers of harmony_mobile/models/default_tiers.yaml. */
    private static final List<TierEntry> DEFAULT_TIERS = List.of(
            tier("entry-android", 1, 1.0, "xnnpack"),
            tier("mid-android", 2, 1.0, "xnnpack"),
            tier("mid-ios", 2, 1.0, "xnnpack", "coreml"),
            tier("flagship", 3, 2.0, "xnnpack", "coreml"));

    private static TierEntry tier(String name, int depth, double width, String... backends) {
        List<Artifact> artifacts = java.util.Arrays.stream(backends)
                .map(b -> new Artifact(b, b.equals("xnnpack") ? "fp32" : "coreml-fp16", "pte", name + "/" + b, "0".repeat(64), 1, 1, 1))
                .toList();
        return new TierEntry(name, "cnn", depth, width, new TensorSpec("image", new long[] {1, 1, 28, 28}, "float32"),
                new Normalization(1 / 255.0, new double[] {0.1307}, new double[] {0.3081}), List.of(), List.of(),
                new long[] {64, 8, 8}, 0.9, List.of("fp32"), List.of(backends), 2.0, artifacts, TierEntry.MAX_SOFTMAX);
    }

    private static DeviceCapabilities android(long ramMb, int bigCores, boolean npu, int api) {
        return new DeviceCapabilities(DeviceCapabilities.ANDROID, ramMb, bigCores, npu, api, false);
    }

    @Test
    void deviceClasses() {
        assertEquals(DeviceClass.ENTRY, DeviceClass.of(android(2048, 2, false, 34)));
        assertEquals(DeviceClass.ENTRY, DeviceClass.of(android(8192, 0, true, 34)));
        assertEquals(DeviceClass.ENTRY, DeviceClass.of(android(8192, 4, true, 28)));
        assertEquals(DeviceClass.ENTRY, DeviceClass.of(new DeviceCapabilities("android", 8192, 4, true, 34, true)));
        assertEquals(DeviceClass.MID, DeviceClass.of(android(4096, 2, false, 33)));
        assertEquals(DeviceClass.MID, DeviceClass.of(android(8192, 2, false, 34)));
        assertEquals(DeviceClass.FLAGSHIP, DeviceClass.of(android(5800, 2, true, 34)));
        assertEquals(DeviceClass.FLAGSHIP, DeviceClass.of(new DeviceCapabilities("ios", 6144, 2, true, 17, false)));
    }

    @Test
    void androidPhonesGetTheirClassesTier() {
        assertEquals("entry-android", TierSelector.select(DEFAULT_TIERS, android(2048, 2, false, 33)).name());
        assertEquals("mid-android", TierSelector.select(DEFAULT_TIERS, android(4096, 2, false, 33)).name());
        assertEquals("flagship", TierSelector.select(DEFAULT_TIERS, android(12288, 4, true, 35)).name());
    }

    @Test
    void iPhonesWithANeuralEngineGetCoreMlTiers() {
        DeviceCapabilities mid = new DeviceCapabilities(DeviceCapabilities.IOS, 4096, 2, true, 17, false);
        assertEquals("mid-ios", TierSelector.select(DEFAULT_TIERS, mid).name());
        DeviceCapabilities flagship = new DeviceCapabilities(DeviceCapabilities.IOS, 8192, 2, true, 18, false);
        assertEquals("flagship", TierSelector.select(DEFAULT_TIERS, flagship).name());
    }

    @Test
    void platformWithoutARunnableArtifactFallsBackOrFails() {
        List<TierEntry> onlyCoreMl = List.of(tier("ios-only", 1, 1.0, "coreml"));
        assertThrows(NoSuchElementException.class, () -> TierSelector.select(onlyCoreMl, android(8192, 4, true, 34)));
        List<TierEntry> onlyHeavy = List.of(tier("heavy", 3, 2.0, "xnnpack"), tier("heavier", 3, 3.0, "xnnpack"));
        assertEquals("heavy", TierSelector.select(onlyHeavy, android(2048, 1, false, 33)).name());
    }

    @Test
    void capabilitiesAreValidated() {
        assertThrows(IllegalArgumentException.class, () -> new DeviceCapabilities("symbian", 1024, 1, false, 1, false));
        assertThrows(IllegalArgumentException.class, () -> android(0, 1, false, 33));
    }
}
