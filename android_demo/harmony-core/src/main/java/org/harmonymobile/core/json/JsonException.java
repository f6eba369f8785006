package org.harmonymobile.core.json;

/** Malformed JSON text, or a JSON value of the wrong shape for what the caller expected. */
public final class JsonException extends RuntimeException {
    public JsonException(String message) {
        super(message);
    }
}
