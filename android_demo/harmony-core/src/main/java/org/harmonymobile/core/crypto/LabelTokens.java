package org.harmonymobile.core.crypto;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import org.harmonymobile.core.util.Hex;

/**
 * Label tokens, slot decoding and exit-output order (mirrors protocol/label_tokens.py):
 *
 * <pre>
 *   K_e = HKDF-SHA256(federation_secret, salt = none, info = "harmony/label-token/" + e, 32 bytes)
 *   t   = first 8 bytes of HMAC-SHA256(K_e, UTF-8 class name)
 * </pre>
 *
 * {@code e} is the label epoch of a model lineage. Equal class names give equal tokens on every
 * phone within an epoch; epochs are unlinkable; without the federation secret (held only by phones)
 * the server cannot map a token, or the slot it assigned to one, to a class.
 */
public final class LabelTokens {
    public static final int TOKEN_BYTES = 8;
    public static final int EPOCH_KEY_BYTES = 32;
    public static final String INFO_PREFIX = "harmony/label-token/";
    public static final int MIN_SECRET_BYTES = 16;
    public static final Pattern LABEL_EPOCH = Pattern.compile("[A-Za-z0-9._-]{1,64}");
    private static final Pattern HEX_TOKEN = Pattern.compile("[0-9a-f]{16}");

    private final byte[] epochKey;

    private LabelTokens(byte[] epochKey) {
        this.epochKey = epochKey;
    }

    /** The token generator of label epoch {@code labelEpoch}. */
    public static LabelTokens forEpoch(byte[] federationSecret, String labelEpoch) {
        return new LabelTokens(epochKey(federationSecret, labelEpoch));
    }

    public static String checkLabelEpoch(String labelEpoch) {
        if (labelEpoch == null || !LABEL_EPOCH.matcher(labelEpoch).matches()) {
            throw new IllegalArgumentException(
                    "a label epoch is 1-64 characters of [A-Za-z0-9._-], got \"" + labelEpoch + "\"");
        }
        return labelEpoch;
    }

    public static byte[] epochKey(byte[] federationSecret, String labelEpoch) {
        if (federationSecret.length < MIN_SECRET_BYTES) {
            throw new IllegalArgumentException("the federation secret must be at least " + MIN_SECRET_BYTES + " bytes");
        }
        byte[] info = (INFO_PREFIX + checkLabelEpoch(labelEpoch)).getBytes(StandardCharsets.US_ASCII);
        return Hkdf.derive(federationSecret, null, info, EPOCH_KEY_BYTES);
    }

    public byte[] token(String className) {
        if (className == null || className.isEmpty()) {
            throw new IllegalArgumentException("a class name is a non-empty string");
        }
        Mac mac = Hkdf.hmac(epochKey);
        return Arrays.copyOf(mac.doFinal(className.getBytes(StandardCharsets.UTF_8)), TOKEN_BYTES);
    }

    /**
     * The class behind each slot: entry i is the name whose token is {@code slotTable.get(i)}, or null when
     * none of {@code classNames} has that token (another epoch, or a class the manifest does not list).
     *
     * @param slotTable lowercase 16-hex-character tokens, slot i at index i
     */
    public List<String> slotClasses(List<String> classNames, List<String> slotTable) {
        Map<String, String> byToken = new HashMap<>();
        for (String name : classNames) {
            byToken.put(Hex.encode(token(name)), name);
        }
        List<String> out = new ArrayList<>(slotTable.size());
        for (int i = 0; i < slotTable.size(); i++) {
            String token = slotTable.get(i);
            if (token == null || !HEX_TOKEN.matcher(token).matches()) {
                throw new IllegalArgumentException("slot " + i + ": a token is 16 lowercase hex characters, got " + token);
            }
            out.add(byToken.get(token));
        }
        return out;
    }

    /**
     * The class behind each output of an exit head (protocol/label_tokens.py {@code exit_order}): exit
     * heads are trained and shipped in token order, so entry j is the name whose token is the j-th
     * smallest, comparing the 8 bytes as unsigned bytes, first byte first ({@link #compareUnsigned});
     * ties, which need equal tokens, go by name.
     */
    public List<String> exitOrder(List<String> classNames) {
        Map<String, byte[]> tokens = new HashMap<>();
        for (String name : classNames) {
            tokens.computeIfAbsent(name, this::token);
        }
        List<String> order = new ArrayList<>(classNames);
        order.sort(Comparator.<String, byte[]>comparing(tokens::get, LabelTokens::compareUnsigned)
                .thenComparing(Comparator.naturalOrder()));
        return order;
    }

    /**
     * Lexicographic order of byte strings read as unsigned (0x80-0xff after 0x00-0x7f), as Python orders
     * {@code bytes}. Java's {@code byte} is signed: comparing the raw values would put 0x80-0xff first.
     */
    public static int compareUnsigned(byte[] a, byte[] b) {
        int common = Math.min(a.length, b.length);
        for (int i = 0; i < common; i++) {
            int order = Integer.compare(a[i] & 0xff, b[i] & 0xff);
            if (order != 0) {
                return order;
            }
        }
        return Integer.compare(a.length, b.length);
    }

    public byte[] epochKey() {
        return epochKey.clone();
    }
}
