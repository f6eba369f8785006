package org.harmonymobile.core.exit;

/**
 * Answer locally when the exit head's maximum softmax probability is at least the tier's threshold
 * tau (ALGORITHM.md, Inference); otherwise fall back to the server.
 *
 * <p>Logits containing NaN or infinity never exit locally: a broken front-end must not answer.
 */
public final class ExitPolicy implements ExitGate {
    private final double threshold;

    public ExitPolicy(double threshold) {
        if (!(threshold > 0 && threshold <= 1)) {
            throw new IllegalArgumentException("the exit threshold must be in (0, 1], got " + threshold);
        }
        this.threshold = threshold;
    }

    public double threshold() {
        return threshold;
    }

    @Override
    public ExitDecision decide(float[] exitLogits, float[] features) {
        return decide(exitLogits);
    }

    public ExitDecision decide(float[] logits) {
        for (float logit : logits) {
            if (!Float.isFinite(logit)) {
                return new ExitDecision(-1, Double.NaN, false);
            }
        }
        double[] probabilities = Softmax.probabilities(logits);
        int best = Softmax.argmax(probabilities);
        double confidence = probabilities[best];
        return new ExitDecision(best, confidence, confidence >= threshold);
    }
}
