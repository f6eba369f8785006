package org.harmonymobile.core.tier;

import java.util.Comparator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.stream.Collectors;
import org.harmonymobile.core.manifest.TierEntry;

/**
 * Picks the tier a phone runs: the most expensive tier (by {@link TierEntry#relativeCost()}) that its
 * {@link DeviceClass} affords and that has an artifact for a backend of its platform; if none is
 * affordable, the cheapest runnable one.
 *
 * <p>Ties in cost prefer (1) tiers whose backends all run on this platform (a tier made only for
 * Android beats one also made for iOS), (2) on iOS with a Neural Engine, tiers with a Core ML
 * artifact, (3) the tier name, so the answer is deterministic.
 */
public final class TierSelector {
    private static final Set<String> ANDROID_BACKENDS = Set.of("xnnpack");
    private static final Set<String> IOS_BACKENDS = Set.of("xnnpack", "coreml");

    private TierSelector() {}

    public static Set<String> backendsOf(DeviceCapabilities device) {
        return DeviceCapabilities.ANDROID.equals(device.platform()) ? ANDROID_BACKENDS : IOS_BACKENDS;
    }

    public static TierEntry select(List<TierEntry> tiers, DeviceCapabilities device) {
        Set<String> runnable = backendsOf(device);
        List<TierEntry> candidates = tiers.stream()
                .filter(t -> t.artifacts().stream().anyMatch(a -> runnable.contains(a.backend())))
                .collect(Collectors.toList());
        if (candidates.isEmpty()) {
            throw new NoSuchElementException("no tier has an artifact for backends " + runnable + " of " + device.platform());
        }
        double budget = DeviceClass.of(device).maxRelativeCost;
        Comparator<TierEntry> preference = Comparator.comparingDouble(TierEntry::relativeCost)
                .thenComparing(t -> runnable.containsAll(t.backends()))
                .thenComparing(t -> device.hasNpu() && DeviceCapabilities.IOS.equals(device.platform())
                        && t.backends().contains("coreml"))
                .thenComparing(TierEntry::name, Comparator.reverseOrder());
        List<TierEntry> affordable =
                candidates.stream().filter(t -> t.relativeCost() <= budget).collect(Collectors.toList());
        if (affordable.isEmpty()) {
            double cheapest = candidates.stream().mapToDouble(TierEntry::relativeCost).min().getAsDouble();
            return candidates.stream()
                    .filter(t -> t.relativeCost() == cheapest)
                    .max(preference)
                    .get();
        }
        return affordable.stream().max(preference).get();
    }
}
