package org.harmonymobile.core.wire;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * What a sealed envelope holds (docs/PROTOCOL.md 4.4):
 * {@code "HMUP" | version 1 | u32le M | M bytes of metadata JSON | HMFT tensor (N, C, S, S)}.
 */
public final class UploadPlaintext {
    public static final byte[] MAGIC = {'H', 'M', 'U', 'P'};
    public static final int VERSION = 1;

    private UploadPlaintext() {}

    public static byte[] encode(UploadMetadata metadata, FeatureTensor features) {
        if (features.shape().length != 4) {
            throw new IllegalArgumentException("upload features are (N, C, S, S), got ndim " + features.shape().length);
        }
        if (features.rows() != metadata.labelTokens().size()) {
            throw new IllegalArgumentException(features.rows() + " feature rows but " + metadata.labelTokens().size()
                    + " label tokens");
        }
        byte[] meta = metadata.toJson().getBytes(StandardCharsets.UTF_8);
        byte[] tensor = features.encode();
        return ByteBuffer.allocate(9 + meta.length + tensor.length)
                .order(ByteOrder.LITTLE_ENDIAN)
                .put(MAGIC)
                .put((byte) VERSION)
                .putInt(meta.length)
                .put(meta)
                .put(tensor)
                .array();
    }
}
