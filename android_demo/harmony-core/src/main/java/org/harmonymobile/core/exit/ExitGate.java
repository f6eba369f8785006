package org.harmonymobile.core.exit;

/**
 * Decides, for one sample, whether the phone answers with its exit head or falls back to the server:
 * {@link ExitPolicy} by the exit head's max softmax, {@link SlotGatePolicy} by the slot margin of the
 * sample's features (docs/PROTOCOL.md 3.4-3.5).
 */
public interface ExitGate {
    /** The verdict from the front-end's exit logits and its (flattened) interface features. */
    ExitDecision decide(float[] exitLogits, float[] features);
}
