package org.harmonymobile.core.crypto;

import java.security.GeneralSecurityException;

/**
 * The platform's security providers lack an algorithm this library needs, e.g. {@code "Ed25519"} on
 * an Android whose Conscrypt predates it (see android_demo/README.md). Callers fail closed: no
 * unverified model is loaded and nothing is sent unsealed.
 */
public final class CryptoUnavailableException extends IllegalStateException {
    public CryptoUnavailableException(String algorithm, GeneralSecurityException cause) {
        super("the platform's security providers lack " + algorithm + ": " + cause.getMessage(), cause);
    }
}
