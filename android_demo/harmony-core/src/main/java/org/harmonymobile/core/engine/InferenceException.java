package org.harmonymobile.core.engine;

/** The on-device runtime failed to load or run the model. */
public final class InferenceException extends Exception {
    public InferenceException(String message, Throwable cause) {
        super(message, cause);
    }

    public InferenceException(String message) {
        super(message);
    }
}
