package org.harmonymobile.core.personalization;

import java.util.Map;

/**
 * The tier's head program ({@code personalize_head.pte}): exit_hidden rows and the trained
 * parameters (inputs in the manifest's {@code parameter_names} order) -> exit logits, row-major
 * {@code rows x outputs}. The Android app implements it with ExecuTorch's {@code Module}; after
 * personalization the phone answers with the frozen program and this, fed its trained parameters.
 */
public interface HeadProgram {
    float[] logits(float[] exitHidden, int rows, Map<String, float[]> parameters);
}
