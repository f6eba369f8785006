package org.harmonymobile.core.exit;

/**
 * The early-exit verdict for one sample.
 *
 * @param topOutput argmax of the exit head's logits (first index on ties); -1 for non-finite logits. Exit
 *     heads are in token order, not class order: {@code ExitDecoder} names the class of an output
 * @param confidence the exit score: the maximum softmax probability ({@code ExitPolicy}) or the slot
 *     margin ({@code SlotGatePolicy})
 * @param exitLocally true when the phone answers itself: confidence >= threshold
 */
public record ExitDecision(int topOutput, double confidence, boolean exitLocally) {}
