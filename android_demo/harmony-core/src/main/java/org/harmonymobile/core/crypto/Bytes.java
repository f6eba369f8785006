package org.harmonymobile.core.crypto;

import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/** Byte array helpers shared by the crypto classes. */
public final class Bytes {
    private Bytes() {}

    public static byte[] concat(byte[]... parts) {
        int length = 0;
        for (byte[] part : parts) {
            length += part.length;
        }
        byte[] out = new byte[length];
        int offset = 0;
        for (byte[] part : parts) {
            System.arraycopy(part, 0, out, offset, part.length);
            offset += part.length;
        }
        return out;
    }

    public static byte[] sha256(byte[] data) {
        return newSha256().digest(data);
    }

    public static MessageDigest newSha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new CryptoUnavailableException("SHA-256", e);
        }
    }
}
