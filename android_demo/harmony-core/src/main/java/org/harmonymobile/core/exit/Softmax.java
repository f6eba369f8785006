package org.harmonymobile.core.exit;

/** Numerically stable softmax over float logits, computed in double precision. */
public final class Softmax {
    private Softmax() {}

    public static double[] probabilities(float[] logits) {
        if (logits.length == 0) {
            throw new IllegalArgumentException("softmax of an empty logit vector");
        }
        double max = Double.NEGATIVE_INFINITY;
        for (float logit : logits) {
            max = Math.max(max, logit);
        }
        double[] out = new double[logits.length];
        double sum = 0;
        for (int i = 0; i < logits.length; i++) {
            out[i] = Math.exp(logits[i] - max);
            sum += out[i];
        }
        for (int i = 0; i < out.length; i++) {
            out[i] /= sum;
        }
        return out;
    }

    /** Index of the largest value; the first one on ties (as torch.argmax and numpy.argmax). */
    public static int argmax(double[] values) {
        int best = 0;
        for (int i = 1; i < values.length; i++) {
            if (values[i] > values[best]) {
                best = i;
            }
        }
        return best;
    }
}
