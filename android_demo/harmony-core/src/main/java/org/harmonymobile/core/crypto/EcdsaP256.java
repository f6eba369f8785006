package org.harmonymobile.core.crypto;

import java.math.BigInteger;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PublicKey;
import java.security.Signature;
import java.security.interfaces.ECPublicKey;
import java.security.spec.X509EncodedKeySpec;

/**
 * ECDSA P-256 / SHA-256 signature verification through the platform's JCA ({@code Signature
 * "SHA256withECDSA"}, {@code KeyFactory "EC"}), which every Android API level provides. This is what
 * the app checks the export manifest with: Ed25519 is missing from Conscrypt on many Android 13-15
 * phones (export/keys.py).
 *
 * <p>Keys travel as X.509 SubjectPublicKeyInfo DER (signing_key_p256.pub holds its base64); signatures
 * as DER {@code SEQUENCE {r, s}}, the JCA's own format.
 */
public final class EcdsaP256 {
    /** The order n of the P-256 group (FIPS 186-4 D.1.2.3): identifies the curve of a parsed key. */
    private static final BigInteger P256_ORDER =
            new BigInteger("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551", 16);

    private EcdsaP256() {}

    /** Parses an SPKI DER public key; throws IllegalArgumentException unless it is a P-256 key. */
    public static PublicKey publicKey(byte[] spkiDer) {
        KeyFactory factory;
        try {
            factory = KeyFactory.getInstance("EC");
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("EC KeyFactory", e);
        }
        PublicKey key;
        try {
            key = factory.generatePublic(new X509EncodedKeySpec(spkiDer));
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("not an X.509 EC public key: " + e.getMessage(), e);
        }
        if (!(key instanceof ECPublicKey ec) || !P256_ORDER.equals(ec.getParams().getOrder())) {
            throw new IllegalArgumentException("the public key is not on the P-256 curve");
        }
        return key;
    }

    /** True when {@code derSignature} is a valid ECDSA-SHA256 signature of {@code message} under the key. */
    public static boolean verify(PublicKey key, byte[] message, byte[] derSignature) {
        Signature verifier;
        try {
            verifier = Signature.getInstance("SHA256withECDSA");
        } catch (GeneralSecurityException e) {
            throw new CryptoUnavailableException("SHA256withECDSA", e);
        }
        try {
            verifier.initVerify(key);
            verifier.update(message);
            return verifier.verify(derSignature);
        } catch (GeneralSecurityException | IllegalArgumentException malformed) {
            return false;
        }
    }
}
