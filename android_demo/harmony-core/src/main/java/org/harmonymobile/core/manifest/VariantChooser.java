package org.harmonymobile.core.manifest;

import java.util.Comparator;
import java.util.List;
import java.util.Optional;

/**
 * Which variant of a tier a phone runs: one that passed the export's quality checks first (the
 * manifest's verdicts), then one nothing checked (Core ML parity runs on a Mac), a failed one only
 * when nothing else is there; among equals, the app's preferred quantization (e.g. int8 before
 * fp32: smaller and faster). Counterparts: harmony_mobile/device/manifest.py choose_artifact,
 * HarmonyKit VariantChooser.
 */
public final class VariantChooser {
    public static final List<String> VERDICT_ORDER = List.of("pass", Artifact.NOT_CHECKED, "fail");
    public static final List<String> PTE_PREFERENCE = List.of("int8", "fp32");

    private VariantChooser() {}

    public static Optional<Artifact> choose(TierEntry tier, String backend, List<String> preference) {
        Comparator<Artifact> order = Comparator.comparingInt((Artifact a) -> rank(VERDICT_ORDER, a.verdict()))
                .thenComparingInt(a -> rank(preference, a.quantization()));
        return tier.artifacts().stream().filter(a -> a.backend().equals(backend)).min(order);
    }

    private static int rank(List<String> order, String value) {
        int index = order.indexOf(value);
        return index < 0 ? order.size() : index;
    }
}
