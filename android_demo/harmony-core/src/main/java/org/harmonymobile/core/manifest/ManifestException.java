package org.harmonymobile.core.manifest;

/** A manifest that failed its signature check, its schema, or a file digest: never load its models. */
public class ManifestException extends Exception {
    public ManifestException(String message) {
        super(message);
    }

    public ManifestException(String message, Throwable cause) {
        super(message, cause);
    }
}
