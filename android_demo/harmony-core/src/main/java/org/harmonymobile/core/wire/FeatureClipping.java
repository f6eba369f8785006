package org.harmonymobile.core.wire;

/**
 * Feature clipping (docs/PROTOCOL.md 4.4, when the manifest's {@code run.feature_clip} is a number C):
 * each row z of an upload, all its values at once, becomes z * min(1, C / ||z||) with ||z|| its L2
 * norm. The rule of harmony_mobile/privacy/feature_noise.py {@code clip_rows}, checked against
 * tests/vectors/feature_clipping.json. Noise, when the run turns it on, is added after clipping.
 */
public final class FeatureClipping {
    /**
     * The floor under ||z||, as Python's {@code clamp_min(1e-12)}: an all-zero row gets a finite scale
     * instead of 0 / 0 and stays zero.
     */
    static final double MIN_NORM = 1e-12;

    private FeatureClipping() {}

    /**
     * {@code features} with each row (everything after the first dimension) scaled to L2 norm at most
     * {@code clip}; rows already within it come back bit for bit.
     *
     * <p>The norm and the scale are computed in double and each value is rounded to float once: Python
     * works in float32 with its own summation order, and the vector's bound (1e-6 relative) is stated
     * for this double computation, not for a float sum in another order.
     */
    public static FeatureTensor clipRows(FeatureTensor features, double clip) {
        if (!(clip > 0) || Double.isInfinite(clip)) {
            throw new IllegalArgumentException("the feature clip norm must be finite and > 0, got " + clip);
        }
        float[] values = features.data();
        int rowLength = values.length / features.rows();
        float[] clipped = new float[values.length];
        for (int start = 0; start < values.length; start += rowLength) {
            double squares = 0;
            for (int i = start; i < start + rowLength; i++) {
                squares += (double) values[i] * values[i];
            }
            double scale = Math.min(1.0, clip / Math.max(Math.sqrt(squares), MIN_NORM));
            for (int i = start; i < start + rowLength; i++) {
                clipped[i] = (float) (values[i] * scale);
            }
        }
        return new FeatureTensor(clipped, features.shape());
    }
}
