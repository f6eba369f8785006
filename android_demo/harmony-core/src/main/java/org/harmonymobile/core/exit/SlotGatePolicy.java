package org.harmonymobile.core.exit;

import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import org.harmonymobile.core.wire.FeatureTensor;

/**
 * Answer locally when a sample sits nearer one of this phone's own slots than any other slot
 * (docs/ALGORITHM.md, section 8): the server ships one unit-norm prototype per slot; the phone knows
 * which slots are its own from the slot table its secret decodes. The score is the cosine to the
 * nearest own slot's prototype minus the cosine to the nearest other slot's, in [-2, 2]; a slot
 * without a prototype (an all-zero row) takes no part, and a side with none counts as -1.
 *
 * <p>Non-finite logits or features never exit locally: a broken front-end must not answer.
 */
public final class SlotGatePolicy implements ExitGate {
    private static final double MIN_NORM = 1e-12; // as torch.nn.functional.normalize

    private final float[][] prototypes;
    private final boolean[] ownSlots;
    private final boolean[] present;
    private final double threshold;

    public SlotGatePolicy(float[][] prototypes, boolean[] ownSlots, double threshold) {
        if (prototypes.length == 0 || prototypes.length != ownSlots.length) {
            throw new IllegalArgumentException(
                    "one own-slot flag per prototype, got " + prototypes.length + " prototypes and "
                            + ownSlots.length + " flags");
        }
        if (!Double.isFinite(threshold)) {
            throw new IllegalArgumentException("the slot-gate threshold must be finite, got " + threshold);
        }
        int dim = prototypes[0].length;
        this.prototypes = new float[prototypes.length][];
        this.present = new boolean[prototypes.length];
        for (int s = 0; s < prototypes.length; s++) {
            if (prototypes[s].length != dim || dim == 0) {
                throw new IllegalArgumentException("every prototype has the same non-zero length");
            }
            this.prototypes[s] = prototypes[s].clone();
            for (float v : prototypes[s]) {
                if (!Float.isFinite(v)) {
                    throw new IllegalArgumentException("prototype " + s + " holds a non-finite value");
                }
                present[s] |= v != 0f;
            }
        }
        this.ownSlots = ownSlots.clone();
        this.threshold = threshold;
    }

    /**
     * A gate from the manifest's slot prototypes file (an HMFT float32 tensor [slots, features], checked
     * against the manifest by the model store).
     */
    public static SlotGatePolicy fromPrototypes(byte[] hmft, boolean[] ownSlots, double threshold) {
        FeatureTensor tensor = FeatureTensor.decode(hmft);
        int[] shape = tensor.shape();
        if (shape.length != 2) {
            throw new IllegalArgumentException("slot prototypes are [slots, features], got " + shape.length + " dimensions");
        }
        float[][] rows = new float[shape[0]][];
        for (int s = 0; s < shape[0]; s++) {
            rows[s] = Arrays.copyOfRange(tensor.data(), s * shape[1], (s + 1) * shape[1]);
        }
        return new SlotGatePolicy(rows, ownSlots, threshold);
    }

    /** Which slots are this phone's: those whose decoded class is one the phone holds. */
    public static boolean[] ownSlots(List<String> slotClasses, Collection<String> ownClassNames) {
        boolean[] own = new boolean[slotClasses.size()];
        for (int s = 0; s < own.length; s++) {
            own[s] = slotClasses.get(s) != null && ownClassNames.contains(slotClasses.get(s));
        }
        return own;
    }

    public double threshold() {
        return threshold;
    }

    /** The margin of one sample's interface features (flattened); NaN when any value is not finite. */
    public double margin(float[] features) {
        if (features.length != prototypes[0].length) {
            throw new IllegalArgumentException(
                    "features of length " + features.length + ", prototypes of " + prototypes[0].length);
        }
        double norm = 0;
        for (float v : features) {
            if (!Float.isFinite(v)) {
                return Double.NaN;
            }
            norm += (double) v * v;
        }
        norm = Math.max(Math.sqrt(norm), MIN_NORM);
        double own = -2;
        double other = -2;
        for (int s = 0; s < prototypes.length; s++) {
            if (!present[s]) {
                continue;
            }
            double cosine = 0;
            for (int i = 0; i < features.length; i++) {
                cosine += features[i] / norm * prototypes[s][i];
            }
            if (ownSlots[s]) {
                own = Math.max(own, cosine);
            } else {
                other = Math.max(other, cosine);
            }
        }
        return Math.max(own, -1) - Math.max(other, -1);
    }

    /** The verdict: the exit head's top output, with the margin as its confidence. */
    @Override
    public ExitDecision decide(float[] logits, float[] features) {
        for (float logit : logits) {
            if (!Float.isFinite(logit)) {
                return new ExitDecision(-1, Double.NaN, false);
            }
        }
        if (logits.length == 0) {
            throw new IllegalArgumentException("no logits");
        }
        double margin = margin(features);
        int best = 0;
        for (int i = 1; i < logits.length; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        // non-finite features: no exit (NaN >= threshold is false), the exit head's answer still named
        return new ExitDecision(best, margin, margin >= threshold);
    }
}
