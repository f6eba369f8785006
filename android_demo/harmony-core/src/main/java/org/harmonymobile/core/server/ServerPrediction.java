package org.harmonymobile.core.server;

/**
 * The server back-end's answer for one row (docs/PROTOCOL.md 6.3), in slot space: the server never
 * knows classes, only the slots it assigned to label tokens. {@link org.harmonymobile.core.SlotDecoder}
 * turns a slot into a class with the phone's federation secret.
 *
 * @param modelVersion the back-end version that answered (its slot table decodes {@code topSlot})
 * @param slotScores one score per slot
 * @param confidence max softmax probability over the slots
 */
public record ServerPrediction(String modelVersion, float[] slotScores, int topSlot, double confidence) {}
