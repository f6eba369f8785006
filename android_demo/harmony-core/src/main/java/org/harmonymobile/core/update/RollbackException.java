package org.harmonymobile.core.update;

import org.harmonymobile.core.manifest.ManifestException;

/** A signed manifest older than the installed one, or as old with other content: never installed. */
public final class RollbackException extends ManifestException {
    public RollbackException(String message) {
        super(message);
    }
}
