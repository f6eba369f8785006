package org.harmonymobile.core.engine;

import org.harmonymobile.core.wire.FeatureTensor;

/**
 * What an exported front-end returns for one image: the tier's outputs {@code exit_logits} (C values)
 * and {@code features}, the interface tensor of shape (1, 64, 8, 8) that the server back-end takes.
 */
public record FrontEndOutput(float[] exitLogits, FeatureTensor features) {}
