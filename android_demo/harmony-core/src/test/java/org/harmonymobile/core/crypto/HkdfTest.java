package org.harmonymobile.core.crypto;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;

/** RFC 5869 appendix A, test cases 1-3 (SHA-256). */
class HkdfTest {
    @Test
    void rfc5869Case1() {
        byte[] ikm = Hex.decode("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
        byte[] salt = Hex.decode("000102030405060708090a0b0c");
        byte[] info = Hex.decode("f0f1f2f3f4f5f6f7f8f9");
        assertEquals("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5",
                Hex.encode(Hkdf.extract(salt, ikm)));
        assertEquals("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
                Hex.encode(Hkdf.derive(ikm, salt, info, 42)));
    }

    @Test
    void rfc5869Case2LongInputs() {
        byte[] ikm = range(0x00, 80);
        byte[] salt = range(0x60, 80);
        byte[] info = range(0xb0, 80);
        assertEquals("b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09"
                        + "da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87",
                Hex.encode(Hkdf.derive(ikm, salt, info, 82)));
    }

    @Test
    void rfc5869Case3NoSaltNoInfo() {
        byte[] ikm = Hex.decode("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b");
        assertEquals("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
                Hex.encode(Hkdf.derive(ikm, null, new byte[0], 42)));
        assertEquals(Hex.encode(Hkdf.derive(ikm, new byte[0], null, 42)), Hex.encode(Hkdf.derive(ikm, null, null, 42)));
    }

    @Test
    void rejectsImpossibleLengths() {
        assertThrows(IllegalArgumentException.class, () -> Hkdf.derive(new byte[1], null, null, 0));
        assertThrows(IllegalArgumentException.class, () -> Hkdf.derive(new byte[1], null, null, 255 * 32 + 1));
    }

    private static byte[] range(int start, int length) {
        byte[] out = new byte[length];
        for (int i = 0; i < length; i++) {
            out[i] = (byte) (start + i);
        }
        return out;
    }
}
