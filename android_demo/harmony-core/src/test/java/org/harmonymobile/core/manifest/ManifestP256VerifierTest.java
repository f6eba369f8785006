package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPairGenerator;
import java.security.spec.ECGenParameterSpec;
import java.util.Base64;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The ECDSA P-256 path Android apps pin: SHA256withECDSA exists in every Android's JCA. */
class ManifestP256VerifierTest {
    private final JsonObject vectors = Vectors.load("manifest_signature.json");
    private final byte[] manifestBytes = vectors.getString("manifest_text").getBytes(StandardCharsets.UTF_8);
    private final byte[] signatureFile = vectors.getString("p256_signature_file").getBytes(StandardCharsets.US_ASCII);
    private final ManifestVerifier verifier = ManifestVerifier.p256(vectors.getHex("p256_public_key"));

    @Test
    void acceptsThePythonSignedManifest() throws Exception {
        Manifest manifest = verifier.verify(manifestBytes, signatureFile);
        assertEquals("golden-v1", manifest.modelVersion());
        assertEquals(2, manifest.tiers().size());
        ManifestVerifier fromFile = ManifestVerifier.forP256PublicKeyFile(vectors.getString("signing_key_p256_pub") + "\n");
        fromFile.verify(manifestBytes, (vectors.getString("p256_signature_file") + "\n").getBytes(StandardCharsets.US_ASCII));
        assertEquals("manifest.p256.sig", verifier.signatureFile());
    }

    @Test
    void anyChangedManifestByteIsRejected() {
        for (int i = 0; i < manifestBytes.length; i += 89) {
            byte[] tampered = manifestBytes.clone();
            tampered[i] ^= 0x01;
            assertThrows(ManifestException.class, () -> verifier.verify(tampered, signatureFile), "byte " + i);
        }
        String text = vectors.getString("manifest_text").replace("\"threshold\": 0.9", "\"threshold\": 0.1");
        ManifestException e = assertThrows(ManifestException.class,
                () -> verifier.verify(text.getBytes(StandardCharsets.UTF_8), signatureFile));
        assertTrue(e.getMessage().contains("signature does not match"));
    }

    @Test
    void tamperedSignatureOrTheEd25519SignatureOrOtherKeyIsRejected() throws Exception {
        byte[] signature = Base64.getDecoder().decode(vectors.getString("p256_signature_file"));
        signature[12] ^= 0x40;
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, Base64.getEncoder().encode(signature)));
        byte[] ed25519File = vectors.getString("signature_file").getBytes(StandardCharsets.US_ASCII);
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, ed25519File));
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, "not base64!".getBytes()));

        KeyPairGenerator generator = KeyPairGenerator.getInstance("EC");
        generator.initialize(new ECGenParameterSpec("secp256r1"));
        byte[] otherKey = generator.generateKeyPair().getPublic().getEncoded();
        ManifestException e = assertThrows(ManifestException.class,
                () -> ManifestVerifier.p256(otherKey).verify(manifestBytes, signatureFile));
        assertTrue(e.getMessage().contains("signature does not match"));
    }

    @Test
    void keysOnOtherCurvesOrMalformedAreRefused() throws Exception {
        KeyPairGenerator generator = KeyPairGenerator.getInstance("EC");
        generator.initialize(new ECGenParameterSpec("secp384r1"));
        byte[] p384 = generator.generateKeyPair().getPublic().getEncoded();
        assertThrows(IllegalArgumentException.class, () -> ManifestVerifier.p256(p384));
        assertThrows(IllegalArgumentException.class, () -> ManifestVerifier.p256(new byte[91]));
        assertThrows(IllegalArgumentException.class, () -> ManifestVerifier.p256(vectors.getHex("public_key")));
    }

    @Test
    void exportDirectoryOnDisk(@TempDir Path dir) throws Exception {
        Files.write(dir.resolve(ManifestVerifier.MANIFEST_FILE), manifestBytes);
        Files.write(dir.resolve(ManifestVerifier.P256_SIGNATURE_FILE), signatureFile);
        Files.write(dir.resolve(ManifestVerifier.P256_PUBLIC_KEY_FILE),
                vectors.getString("signing_key_p256_pub").getBytes(StandardCharsets.US_ASCII));
        assertEquals("golden-v1", verifier.verifyDirectory(dir).modelVersion());

        KeyPairGenerator generator = KeyPairGenerator.getInstance("EC");
        generator.initialize(new ECGenParameterSpec("secp256r1"));
        byte[] other = generator.generateKeyPair().getPublic().getEncoded();
        Files.write(dir.resolve(ManifestVerifier.P256_PUBLIC_KEY_FILE), Base64.getEncoder().encode(other));
        ManifestException e = assertThrows(ManifestException.class, () -> verifier.verifyDirectory(dir));
        assertTrue(e.getMessage().contains("pinned"));

        Files.delete(dir.resolve(ManifestVerifier.P256_PUBLIC_KEY_FILE));
        Files.delete(dir.resolve(ManifestVerifier.P256_SIGNATURE_FILE));
        e = assertThrows(ManifestException.class, () -> verifier.verifyDirectory(dir));
        assertTrue(e.getMessage().contains("missing"));
    }

    @Test
    void theManifestCarriesItsBackEndsLabelEpochAndSlotTable() throws Exception {
        Manifest manifest = verifier.verify(manifestBytes, signatureFile);
        assertEquals("mnist5k-2026-11", manifest.labelEpoch());
        byte[] secret = Vectors.load("label_tokens.json").getHex("federation_secret");
        java.util.List<String> classes = org.harmonymobile.core.crypto.LabelTokens.forEpoch(secret, manifest.labelEpoch())
                .slotClasses(manifest.classNames(), manifest.slotTable().tokens());
        assertEquals(java.util.List.of("3", "1", "7", "0", "9", "5", "2", "8", "4", "6"), classes);
    }

    @Test
    void theManifestMustNameThePinnedP256Key() throws Exception {
        Manifest manifest = verifier.verify(manifestBytes, signatureFile);
        assertEquals(64, manifest.p256PublicKeySha256().length());
        assertTrue(!manifest.p256PublicKeySha256().equals(manifest.publicKeySha256()));
    }
}
