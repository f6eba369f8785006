package org.harmonymobile.core.seal;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.UUID;
import org.harmonymobile.core.crypto.LabelTokens;

/**
 * What an envelope is bound to (docs/PROTOCOL.md 4.3, version 2); checked by AES-GCM, never sent:
 * {@code "harmony/upload-ad/v2" | u16le len(device id) | device id UTF-8 | u8 len(label epoch) |
 * label epoch ASCII | 16 UUID bytes}.
 */
public record AssociatedData(String deviceId, String labelEpoch, UUID messageId) {
    public static final byte[] LABEL = "harmony/upload-ad/v2".getBytes(StandardCharsets.US_ASCII);
    public static final int MAX_DEVICE_ID_BYTES = 255;

    public AssociatedData {
        int length = deviceId.getBytes(StandardCharsets.UTF_8).length;
        if (length < 1 || length > MAX_DEVICE_ID_BYTES) {
            throw new IllegalArgumentException("device id must be 1.." + MAX_DEVICE_ID_BYTES + " UTF-8 bytes, got " + length);
        }
        LabelTokens.checkLabelEpoch(labelEpoch);
    }

    public byte[] encode() {
        byte[] device = deviceId.getBytes(StandardCharsets.UTF_8);
        byte[] epoch = labelEpoch.getBytes(StandardCharsets.US_ASCII);
        ByteBuffer out = ByteBuffer.allocate(LABEL.length + 2 + device.length + 1 + epoch.length + 16);
        out.put(LABEL);
        out.order(ByteOrder.LITTLE_ENDIAN).putShort((short) device.length).put(device);
        out.put((byte) epoch.length).put(epoch);
        // RFC 4122 byte order: most significant 64 bits then least, each big-endian.
        out.order(ByteOrder.BIG_ENDIAN).putLong(messageId.getMostSignificantBits()).putLong(messageId.getLeastSignificantBits());
        return out.array();
    }
}
