package org.harmonymobile.core.seal;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.SecureRandom;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Arrays;
import javax.crypto.Cipher;
import javax.crypto.KeyAgreement;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.crypto.CryptoUnavailableException;
import org.harmonymobile.core.crypto.Hkdf;

/**
 * Seals an upload to the server's X25519 key (docs/PROTOCOL.md 4.2, protocol/sealing.py):
 *
 * <pre>
 *   shared   = X25519(e, S_pub)                     fresh ephemeral key pair (e, E_pub) per upload
 *   key      = HKDF-SHA256(shared, salt = E_pub || S_pub, info = "harmony/upload-seal/v1", 32)
 *   envelope = "HMSE" | 0x01 | E_pub | nonce (12) | AES-256-GCM(key, nonce, plaintext, AD) | tag (16)
 * </pre>
 *
 * Only JDK / Android platform providers are used: {@code KeyPairGenerator/KeyFactory/KeyAgreement "XDH"},
 * {@code Mac "HmacSHA256"}, {@code Cipher "AES/GCM/NoPadding"}. Keys cross the API as raw 32 bytes and are
 * wrapped in their fixed DER prefixes, because Android's Conscrypt accepts only X.509 / PKCS#8 key specs.
 */
public final class UploadSealer {
    public static final byte[] MAGIC = {'H', 'M', 'S', 'E'};
    public static final int VERSION = 1;
    public static final int KEY_BYTES = 32;
    public static final int NONCE_BYTES = 12;
    public static final int TAG_BYTES = 16;
    public static final int HEADER_BYTES = 4 + 1 + KEY_BYTES + NONCE_BYTES;
    public static final byte[] HKDF_INFO = "harmony/upload-seal/v1".getBytes(StandardCharsets.US_ASCII);

    private static final byte[] X509_PREFIX = {
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00
    };
    private static final byte[] PKCS8_PREFIX = {
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04, 0x20
    };
    /** The X25519 base point u = 9: agreeing with it yields a private key's public key (RFC 7748 6.1). */
    private static final byte[] BASE_POINT = basePoint();

    private final byte[] serverPublicKey;
    private final PublicKey serverKey;
    private final SecureRandom random;

    public UploadSealer(byte[] serverPublicKey, SecureRandom random) {
        if (serverPublicKey.length != KEY_BYTES) {
            throw new IllegalArgumentException("an X25519 public key is 32 bytes, got " + serverPublicKey.length);
        }
        this.serverPublicKey = serverPublicKey.clone();
        this.serverKey = publicKey(serverPublicKey);
        this.random = random;
    }

    public UploadSealer(byte[] serverPublicKey) {
        this(serverPublicKey, new SecureRandom());
    }

    /** Seals with a fresh ephemeral key and a random nonce: the production path. */
    public byte[] seal(byte[] plaintext, AssociatedData ad) {
        KeyPair ephemeral = generateKeyPair();
        byte[] nonce = new byte[NONCE_BYTES];
        random.nextBytes(nonce);
        return seal(plaintext, ad, ephemeral.getPrivate(), rawPublicKey(ephemeral.getPublic()), nonce);
    }

    /**
     * Seals with a given ephemeral private key and nonce. Only for reproducing golden vectors: reusing
     * either in production breaks the scheme.
     */
    public byte[] sealDeterministically(byte[] plaintext, AssociatedData ad, byte[] ephemeralPrivateKey, byte[] nonce) {
        PrivateKey ephemeral = privateKey(ephemeralPrivateKey);
        return seal(plaintext, ad, ephemeral, publicKeyOf(ephemeral), nonce);
    }

    private byte[] seal(byte[] plaintext, AssociatedData ad, PrivateKey ephemeral, byte[] ephemeralPublic, byte[] nonce) {
        if (nonce.length != NONCE_BYTES) {
            throw new IllegalArgumentException("the AES-GCM nonce is 12 bytes, got " + nonce.length);
        }
        byte[] shared = agree(ephemeral, serverKey);
        byte[] key = Hkdf.derive(shared, Bytes.concat(ephemeralPublic, serverPublicKey), HKDF_INFO, KEY_BYTES);
        Arrays.fill(shared, (byte) 0);
        byte[] sealed;
        try {
            Cipher cipher = Cipher.getInstance("AES/GCM/NoPadding");
            cipher.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(TAG_BYTES * 8, nonce));
            cipher.updateAAD(ad.encode());
            sealed = cipher.doFinal(plaintext); // ciphertext || tag
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("AES/GCM/NoPadding", e);
        } finally {
            Arrays.fill(key, (byte) 0);
        }
        return ByteBuffer.allocate(HEADER_BYTES + sealed.length)
                .put(MAGIC)
                .put((byte) VERSION)
                .put(ephemeralPublic)
                .put(nonce)
                .put(sealed)
                .array();
    }

    /** The raw public key of a raw X25519 private key. */
    public static byte[] publicKeyOf(byte[] rawPrivateKey) {
        return publicKeyOf(privateKey(rawPrivateKey));
    }

    private static byte[] publicKeyOf(PrivateKey key) {
        return agree(key, publicKey(BASE_POINT));
    }

    private static byte[] agree(PrivateKey own, PublicKey peer) {
        try {
            KeyAgreement agreement = KeyAgreement.getInstance("XDH");
            agreement.init(own);
            agreement.doPhase(peer, true);
            return agreement.generateSecret();
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("XDH (X25519) key agreement", e);
        }
    }

    private static KeyPair generateKeyPair() {
        try {
            // No initialize(NamedParameterSpec): Conscrypt's XDH generator is X25519-only and rejects any spec;
            // the JDK's defaults to X25519.
            return KeyPairGenerator.getInstance("XDH").generateKeyPair();
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("XDH (X25519) key generation", e);
        }
    }

    static byte[] rawPublicKey(PublicKey key) {
        byte[] encoded = key.getEncoded(); // X.509 SubjectPublicKeyInfo; the key is the last 32 bytes
        return Arrays.copyOfRange(encoded, encoded.length - KEY_BYTES, encoded.length);
    }

    private static PublicKey publicKey(byte[] raw) {
        try {
            return KeyFactory.getInstance("XDH").generatePublic(new X509EncodedKeySpec(Bytes.concat(X509_PREFIX, raw)));
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("not a usable X25519 public key: " + e.getMessage(), e);
        }
    }

    private static PrivateKey privateKey(byte[] raw) {
        if (raw.length != KEY_BYTES) {
            throw new IllegalArgumentException("an X25519 private key is 32 bytes, got " + raw.length);
        }
        try {
            return KeyFactory.getInstance("XDH").generatePrivate(new PKCS8EncodedKeySpec(Bytes.concat(PKCS8_PREFIX, raw)));
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("not a usable X25519 private key: " + e.getMessage(), e);
        }
    }

    private static byte[] basePoint() {
        byte[] u = new byte[KEY_BYTES];
        u[0] = 9;
        return u;
    }
}
