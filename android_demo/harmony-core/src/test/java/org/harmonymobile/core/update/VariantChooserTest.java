package org.harmonymobile.core.update;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import java.util.ArrayList;
import java.util.List;
import org.harmonymobile.core.manifest.Artifact;
import org.harmonymobile.core.manifest.Normalization;
import org.harmonymobile.core.manifest.TensorSpec;
import org.harmonymobile.core.manifest.TierEntry;
import org.harmonymobile.core.manifest.VariantChooser;
import org.junit.jupiter.api.Test;

/** A phone runs a variant that passed the export's checks first; the same rule as device/manifest.py. */
class VariantChooserTest {
    private static TierEntry tier(String... backendQuantizationVerdict) {
        List<Artifact> artifacts = new ArrayList<>();
        for (String spec : backendQuantizationVerdict) {
            String[] parts = spec.split(" ");
            artifacts.add(new Artifact(parts[0], parts[1], "pte", parts[1] + ".pte", "0".repeat(64), 1, 1, 1, parts[2],
                    parts[2].equals("fail") ? List.of("int8_top1_agreement_ge_98") : List.of()));
        }
        return new TierEntry("t", "cnn", 1, 1.0, null, (Normalization) null, List.<TensorSpec>of(), List.of(), new long[0],
                0.9, List.of(), List.of(), 1.0, artifacts, TierEntry.MAX_SOFTMAX);
    }

    private static String chosen(TierEntry tier) {
        return VariantChooser.choose(tier, "xnnpack", VariantChooser.PTE_PREFERENCE).get().quantization();
    }

    @Test
    void aPassingVariantComesFirstThenThePreferredQuantization() {
        assertEquals("int8", chosen(tier("xnnpack fp32 pass", "xnnpack int8 pass")));
        assertEquals("fp32", chosen(tier("xnnpack fp32 pass", "xnnpack int8 fail")));
        assertEquals("fp32", chosen(tier("xnnpack int8 fail", "xnnpack fp32 not_checked")));
        assertEquals("int8", chosen(tier("xnnpack int8 fail")));
        assertEquals("int8", chosen(tier("coreml coreml-fp16 pass", "xnnpack int8 not_checked")));
        assertFalse(VariantChooser.choose(tier("coreml coreml-fp16 pass"), "xnnpack", VariantChooser.PTE_PREFERENCE).isPresent());
    }

    @Test
    void anExportWithoutVerdictsKeepsThePreferenceOrder() {
        Artifact fp32 = new Artifact("xnnpack", "fp32", "pte", "a", "0".repeat(64), 1, 1, 1);
        Artifact int8 = new Artifact("xnnpack", "int8", "pte", "b", "0".repeat(64), 1, 1, 1);
        TierEntry tier = new TierEntry("t", "cnn", 1, 1.0, null, null, List.of(), List.of(), new long[0], 0.9, List.of(),
                List.of(), 1.0, List.of(fp32, int8), TierEntry.MAX_SOFTMAX);
        assertEquals(Artifact.NOT_CHECKED, fp32.verdict());
        assertEquals("int8", chosen(tier));
    }
}
