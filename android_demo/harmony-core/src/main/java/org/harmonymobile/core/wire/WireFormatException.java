package org.harmonymobile.core.wire;

/** Bytes that do not follow the documented binary layout. */
public final class WireFormatException extends IllegalArgumentException {
    public WireFormatException(String message) {
        super(message);
    }
}
