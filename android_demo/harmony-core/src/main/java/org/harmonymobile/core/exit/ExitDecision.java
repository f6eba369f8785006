package org.harmonymobile.core.exit;

/**
 * The early-exit verdict for one sample.
 *
 * @param predictedClass argmax of the exit head's logits (first index on ties)
 * @param confidence the maximum softmax probability
 * @param exitLocally true when the phone answers itself: confidence >= threshold
 */
public record ExitDecision(int predictedClass, double confidence, boolean exitLocally) {}
