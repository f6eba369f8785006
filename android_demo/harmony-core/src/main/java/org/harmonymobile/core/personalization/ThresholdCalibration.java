package org.harmonymobile.core.personalization;

import java.util.Arrays;
import java.util.Comparator;

/**
 * tau after personalization: the most permissive threshold (exit iff confidence >= tau) whose
 * local-exit accuracy on the phone's own validation samples reaches the target; just above every
 * confidence when none does (everything falls back). The rule training calibrates with
 * (docs/ALGORITHM.md, Inference; harmony_mobile/device/personalization.py calibrate_exit_threshold).
 */
public final class ThresholdCalibration {
    private ThresholdCalibration() {}

    public static double calibrate(float[] confidences, boolean[] correct, double targetAccuracy) {
        if (confidences.length != correct.length) {
            throw new IllegalArgumentException(confidences.length + " confidences but " + correct.length + " outcomes");
        }
        if (confidences.length == 0) {
            return 1.0;
        }
        Integer[] order = new Integer[confidences.length];
        for (int i = 0; i < order.length; i++) {
            order[i] = i;
        }
        Arrays.sort(order, Comparator.comparingDouble((Integer i) -> -confidences[i]));
        int best = -1;
        int right = 0;
        for (int k = 0; k < order.length; k++) {
            right += correct[order[k]] ? 1 : 0;
            boolean lastOfTie = k == order.length - 1 || confidences[order[k + 1]] < confidences[order[k]];
            if (lastOfTie && (double) right / (k + 1) >= targetAccuracy) {
                best = k; // a threshold at this score also exits every sample tied with it
            }
        }
        if (best < 0) {
            return Math.nextUp(confidences[order[0]]);
        }
        return confidences[order[best]];
    }
}
