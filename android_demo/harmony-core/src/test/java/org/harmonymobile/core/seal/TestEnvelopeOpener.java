package org.harmonymobile.core.seal;

import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Arrays;
import javax.crypto.Cipher;
import javax.crypto.KeyAgreement;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.crypto.Hkdf;
import org.harmonymobile.core.util.Hex;

/** The server's half of sealing, for tests only: phones never open envelopes. */
public final class TestEnvelopeOpener {
    private TestEnvelopeOpener() {}

    public static byte[] open(byte[] serverPrivate, byte[] envelope, AssociatedData ad) throws Exception {
        if (!Arrays.equals(Arrays.copyOf(envelope, 5), new byte[] {'H', 'M', 'S', 'E', 1})) {
            throw new IllegalArgumentException("not an HMSE v1 envelope");
        }
        byte[] ephemeralPublic = Arrays.copyOfRange(envelope, 5, 37);
        byte[] nonce = Arrays.copyOfRange(envelope, 37, 49);
        KeyFactory factory = KeyFactory.getInstance("XDH");
        PrivateKey own = factory.generatePrivate(new PKCS8EncodedKeySpec(
                Hex.decode("302e020100300506032b656e04220420" + Hex.encode(serverPrivate))));
        KeyAgreement agreement = KeyAgreement.getInstance("XDH");
        agreement.init(own);
        agreement.doPhase(factory.generatePublic(new X509EncodedKeySpec(
                Hex.decode("302a300506032b656e032100" + Hex.encode(ephemeralPublic)))), true);
        byte[] salt = Bytes.concat(ephemeralPublic, UploadSealer.publicKeyOf(serverPrivate));
        byte[] key = Hkdf.derive(agreement.generateSecret(), salt, UploadSealer.HKDF_INFO, 32);
        Cipher cipher = Cipher.getInstance("AES/GCM/NoPadding");
        cipher.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(128, nonce));
        cipher.updateAAD(ad.encode());
        return cipher.doFinal(envelope, 49, envelope.length - 49);
    }
}
