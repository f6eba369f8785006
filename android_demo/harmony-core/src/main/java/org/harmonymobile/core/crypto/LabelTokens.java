package org.harmonymobile.core.crypto;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import javax.crypto.Mac;

/**
 * Label tokens: what the server gets instead of a label (mirrors harmony_mobile/privacy/label_tokens.py).
 *
 * <pre>
 *   K_r = HKDF-SHA256(federation_secret, salt = none, info = "harmony/label-token/" + r, 32 bytes)
 *   t   = first 8 bytes of HMAC-SHA256(K_r, class id as 4-byte big-endian)
 * </pre>
 *
 * Equal labels give equal tokens within a round on every phone; rounds are unlinkable; without the
 * federation secret (held only by phones) the server cannot map a token to a class.
 */
public final class LabelTokens {
    public static final int TOKEN_BYTES = 8;
    public static final int ROUND_KEY_BYTES = 32;
    public static final String INFO_PREFIX = "harmony/label-token/";
    public static final int MIN_SECRET_BYTES = 16;

    private final byte[] roundKey;

    private LabelTokens(byte[] roundKey) {
        this.roundKey = roundKey;
    }

    /** The token generator of round (or key epoch) {@code roundId}. */
    public static LabelTokens forRound(byte[] federationSecret, String roundId) {
        return new LabelTokens(roundKey(federationSecret, roundId));
    }

    public static LabelTokens forRound(byte[] federationSecret, long roundId) {
        return forRound(federationSecret, Long.toString(roundId));
    }

    public static byte[] roundKey(byte[] federationSecret, String roundId) {
        if (federationSecret.length < MIN_SECRET_BYTES) {
            throw new IllegalArgumentException("the federation secret must be at least " + MIN_SECRET_BYTES + " bytes");
        }
        byte[] info = (INFO_PREFIX + roundId).getBytes(StandardCharsets.UTF_8);
        return Hkdf.derive(federationSecret, null, info, ROUND_KEY_BYTES);
    }

    public byte[] token(int classId) {
        if (classId < 0) {
            throw new IllegalArgumentException("class ids are non-negative, got " + classId);
        }
        Mac mac = Hkdf.hmac(roundKey);
        byte[] full = mac.doFinal(ByteBuffer.allocate(4).putInt(classId).array());
        return Arrays.copyOf(full, TOKEN_BYTES);
    }

    public byte[] roundKey() {
        return roundKey.clone();
    }
}
