package org.harmonymobile.core.wire;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * A float32 tensor and its "HMFT" binary form (docs/PROTOCOL.md section 5, protocol/wire.py):
 *
 * <pre>
 *   "HMFT" | version 1 | dtype 1 (float32) | ndim (1..6) | reserved 0 | ndim x u32le dims | float32le data
 * </pre>
 */
public record FeatureTensor(float[] data, int[] shape) {
    public static final byte[] MAGIC = {'H', 'M', 'F', 'T'};
    public static final int VERSION = 1;
    public static final int DTYPE_FLOAT32 = 1;
    public static final int MAX_NDIM = 6;
    public static final int FIXED_HEADER_BYTES = 8;

    public FeatureTensor {
        if (shape.length < 1 || shape.length > MAX_NDIM) {
            throw new IllegalArgumentException("ndim must be 1.." + MAX_NDIM + ", got " + shape.length);
        }
        long count = 1;
        for (int dim : shape) {
            if (dim < 1) {
                throw new IllegalArgumentException("every dimension must be >= 1, got " + Arrays.toString(shape));
            }
            count *= dim;
        }
        if (count != data.length) {
            throw new IllegalArgumentException(
                    "shape " + Arrays.toString(shape) + " holds " + count + " values, data has " + data.length);
        }
        shape = shape.clone();
    }

    public int rows() {
        return shape[0];
    }

    public int encodedSize() {
        return FIXED_HEADER_BYTES + 4 * shape.length + 4 * data.length;
    }

    public byte[] encode() {
        ByteBuffer out = ByteBuffer.allocate(encodedSize()).order(ByteOrder.LITTLE_ENDIAN);
        out.put(MAGIC).put((byte) VERSION).put((byte) DTYPE_FLOAT32).put((byte) shape.length).put((byte) 0);
        for (int dim : shape) {
            out.putInt(dim);
        }
        out.asFloatBuffer().put(data);
        return out.array();
    }

    /** Parses an HMFT body; {@link WireFormatException} names what is wrong. */
    public static FeatureTensor decode(byte[] body) {
        if (body.length < FIXED_HEADER_BYTES) {
            throw new WireFormatException("binary tensor is " + body.length + " bytes, shorter than its fixed header");
        }
        if (!Arrays.equals(Arrays.copyOf(body, 4), MAGIC)) {
            throw new WireFormatException("binary tensor magic is not HMFT");
        }
        int version = body[4] & 0xff;
        int dtype = body[5] & 0xff;
        int ndim = body[6] & 0xff;
        if (version != VERSION) {
            throw new WireFormatException("binary tensor version " + version + " is not supported");
        }
        if (dtype != DTYPE_FLOAT32) {
            throw new WireFormatException("binary tensor dtype code " + dtype + " is not supported (1 = float32 is)");
        }
        if (ndim < 1 || ndim > MAX_NDIM) {
            throw new WireFormatException("binary tensor ndim " + ndim + " is out of range 1.." + MAX_NDIM);
        }
        if (body[7] != 0) {
            throw new WireFormatException("binary tensor reserved byte 7 must be 0");
        }
        int headerSize = FIXED_HEADER_BYTES + 4 * ndim;
        if (body.length < headerSize) {
            throw new WireFormatException("binary tensor is shorter than its " + headerSize + "-byte header");
        }
        ByteBuffer in = ByteBuffer.wrap(body).order(ByteOrder.LITTLE_ENDIAN);
        in.position(FIXED_HEADER_BYTES);
        int[] shape = new int[ndim];
        long count = 1;
        for (int i = 0; i < ndim; i++) {
            long dim = Integer.toUnsignedLong(in.getInt());
            if (dim < 1 || dim > Integer.MAX_VALUE) {
                throw new WireFormatException("binary tensor dimension " + i + " is " + dim);
            }
            shape[i] = (int) dim;
            count *= dim;
            if (count > Integer.MAX_VALUE / 4) {
                throw new WireFormatException("binary tensor is too large");
            }
        }
        if (body.length - headerSize != count * 4) {
            throw new WireFormatException("binary tensor header promises " + count * 4 + " data bytes, body has "
                    + (body.length - headerSize));
        }
        float[] data = new float[(int) count];
        in.asFloatBuffer().get(data);
        return new FeatureTensor(data, shape);
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof FeatureTensor t && Arrays.equals(data, t.data) && Arrays.equals(shape, t.shape);
    }

    @Override
    public int hashCode() {
        return 31 * Arrays.hashCode(data) + Arrays.hashCode(shape);
    }

    @Override
    public String toString() {
        return "FeatureTensor" + Arrays.toString(shape);
    }
}
