package org.harmonymobile.core.personalization;

import java.util.Map;

/**
 * One optimizer step over a {@link TrainingModule}'s parameters. The Android app can wrap
 * ExecuTorch's {@code org.pytorch.executorch.training.SGD} (which updates the native tensors in
 * place); {@link Sgd} does the same on the float arrays of {@code namedParameters()}.
 */
public interface Optimizer {
    void step(Map<String, float[]> namedGradients);
}
