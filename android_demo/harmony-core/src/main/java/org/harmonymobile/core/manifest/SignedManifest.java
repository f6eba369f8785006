package org.harmonymobile.core.manifest;

/**
 * A manifest as fetched, before verification: the exact bytes of manifest.json and of the signature
 * file ({@code manifest.sig} or {@code manifest.p256.sig}, whichever the verifier reads).
 */
public record SignedManifest(byte[] manifest, byte[] signature) {
    public SignedManifest {
        manifest = manifest.clone();
        signature = signature.clone();
    }
}
