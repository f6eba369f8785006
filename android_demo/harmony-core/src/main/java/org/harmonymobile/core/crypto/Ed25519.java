package org.harmonymobile.core.crypto;

import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.NoSuchAlgorithmException;
import java.security.PublicKey;
import java.security.Signature;
import java.security.spec.X509EncodedKeySpec;

/**
 * Ed25519 signature verification through the platform's JCA ({@code Signature "Ed25519"}).
 *
 * <p>Keys travel as the raw 32 bytes (RFC 8032); they are wrapped in their fixed X.509
 * SubjectPublicKeyInfo DER prefix, which every provider accepts, instead of using
 * {@code EdECPublicKeySpec}, which Android's Conscrypt does not take.
 */
public final class Ed25519 {
    public static final int PUBLIC_KEY_BYTES = 32;
    public static final int SIGNATURE_BYTES = 64;
    private static final byte[] X509_PREFIX = {
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00
    };

    private Ed25519() {}

    /** True when the signature is a valid Ed25519 signature of {@code message} under the raw public key. */
    public static boolean verify(byte[] rawPublicKey, byte[] message, byte[] signature) {
        if (rawPublicKey.length != PUBLIC_KEY_BYTES) {
            throw new IllegalArgumentException("an Ed25519 public key has 32 bytes, got " + rawPublicKey.length);
        }
        if (signature.length != SIGNATURE_BYTES) {
            return false;
        }
        Signature verifier;
        PublicKey key;
        try {
            verifier = Signature.getInstance("Ed25519");
            key = keyFactory().generatePublic(new X509EncodedKeySpec(Bytes.concat(X509_PREFIX, rawPublicKey)));
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("Ed25519", e);
        }
        try {
            verifier.initVerify(key);
            verifier.update(message);
            return verifier.verify(signature);
        } catch (GeneralSecurityException malformed) {
            return false;
        }
    }

    private static KeyFactory keyFactory() throws NoSuchAlgorithmException {
        try {
            return KeyFactory.getInstance("Ed25519");
        } catch (NoSuchAlgorithmException e) {
            return KeyFactory.getInstance("EdDSA");
        }
    }
}
