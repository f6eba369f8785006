package org.harmonymobile.core.crypto;

import java.security.InvalidKeyException;
import java.security.NoSuchAlgorithmException;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * HKDF with HMAC-SHA256 (RFC 5869), built on the platform's {@code Mac "HmacSHA256"}.
 *
 * <p>Android has no public HKDF API below API 35 ({@code javax.crypto.KDF} is JDK 24+), so the two
 * steps of the RFC are written out here; the RFC 5869 test vectors are in the unit tests.
 */
public final class Hkdf {
    private static final String HMAC = "HmacSHA256";
    private static final int HASH_LEN = 32;

    private Hkdf() {}

    /** HKDF-Extract then HKDF-Expand; a null or empty salt means HashLen zero bytes (RFC 5869 2.2). */
    public static byte[] derive(byte[] inputKeyMaterial, byte[] salt, byte[] info, int length) {
        return expand(extract(salt, inputKeyMaterial), info, length);
    }

    public static byte[] extract(byte[] salt, byte[] inputKeyMaterial) {
        byte[] effectiveSalt = (salt == null || salt.length == 0) ? new byte[HASH_LEN] : salt;
        return hmac(effectiveSalt).doFinal(inputKeyMaterial);
    }

    public static byte[] expand(byte[] pseudoRandomKey, byte[] info, int length) {
        if (length <= 0 || length > 255 * HASH_LEN) {
            throw new IllegalArgumentException("HKDF output length must be 1.." + 255 * HASH_LEN + ", got " + length);
        }
        Mac mac = hmac(pseudoRandomKey);
        byte[] out = new byte[length];
        byte[] block = new byte[0];
        int written = 0;
        for (int counter = 1; written < length; counter++) {
            mac.update(block);
            if (info != null) {
                mac.update(info);
            }
            mac.update((byte) counter);
            block = mac.doFinal();
            int n = Math.min(block.length, length - written);
            System.arraycopy(block, 0, out, written, n);
            written += n;
        }
        return out;
    }

    static Mac hmac(byte[] key) {
        try {
            Mac mac = Mac.getInstance(HMAC);
            mac.init(new SecretKeySpec(key, HMAC));
            return mac;
        } catch (NoSuchAlgorithmException | InvalidKeyException e) {
            throw new CryptoUnavailableException(HMAC, e);
        }
    }
}
