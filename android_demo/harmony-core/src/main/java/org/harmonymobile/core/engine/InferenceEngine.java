package org.harmonymobile.core.engine;

/**
 * Runs a tier's front-end on one preprocessed input. The Android app implements it with ExecuTorch
 * ({@code org.pytorch.executorch.Module}), tests with a fake; nothing else in this library knows
 * which runtime is underneath.
 */
public interface InferenceEngine extends AutoCloseable {
    /**
     * @param input one normalized image, NCHW without the batch (the manifest tier's input shape)
     * @return the exit head's logits and the interface features of that image
     */
    FrontEndOutput run(float[] input) throws InferenceException;

    @Override
    void close();
}
