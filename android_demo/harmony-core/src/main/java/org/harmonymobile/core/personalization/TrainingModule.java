package org.harmonymobile.core.personalization;

import java.util.Map;

/**
 * The tier's training program ({@code personalize_train.pte}, the manifest tier's
 * {@code personalization.training_program}) as the personalization loop sees it. The Android app
 * implements it with ExecuTorch's Java {@code org.pytorch.executorch.training.TrainingModule}:
 * {@code executeForwardBackward(method, EValue.from(hidden), EValue.from(positions))} returns
 * [loss, exit_logits], {@code namedGradients(method)} and {@code namedParameters(method)} the rest.
 * Tests use a fake.
 *
 * <p>Inputs are exactly {@code batch} rows: {@code exitHidden} is row-major {@code batch x hidden}
 * floats (the frozen program's first output), {@code exitPositions} the exit output of each row's
 * label, never a class index.
 */
public interface TrainingModule {
    /** One forward-backward pass; returns the loss. The gradients stay readable until the next call. */
    float forwardBackward(float[] exitHidden, long[] exitPositions);

    /** The gradients of the last {@link #forwardBackward}, by parameter name. */
    Map<String, float[]> namedGradients();

    /**
     * The live parameters by name: an {@link Optimizer} updates them in place, and the head program
     * reads them after training. Only valid after a first {@link #forwardBackward} (ExecuTorch's rule).
     */
    Map<String, float[]> namedParameters();
}
