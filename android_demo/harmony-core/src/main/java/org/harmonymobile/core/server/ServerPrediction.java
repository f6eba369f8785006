package org.harmonymobile.core.server;

/**
 * The server back-end's answer for one row (docs/PROTOCOL.md 6.3).
 *
 * @param confidence max softmax probability of the server logits
 */
public record ServerPrediction(String modelVersion, float[] logits, int topClass, double confidence) {}
