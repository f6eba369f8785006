package org.harmonymobile.core.manifest;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Hex;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ManifestVerifierTest {
    private final JsonObject vectors = Vectors.load("manifest_signature.json");
    private final byte[] manifestBytes = vectors.getString("manifest_text").getBytes(StandardCharsets.UTF_8);
    private final byte[] signatureFile = vectors.getString("signature_file").getBytes(StandardCharsets.US_ASCII);
    private final ManifestVerifier verifier = new ManifestVerifier(vectors.getHex("public_key"));

    @Test
    void acceptsThePythonSignedManifestAndParsesIt() throws Exception {
        Manifest manifest = verifier.verify(manifestBytes, signatureFile);
        assertEquals("golden-v1", manifest.modelVersion());
        assertEquals(10, manifest.numClasses());
        assertEquals(2, manifest.tiers().size());
        TierEntry entry = manifest.tier("entry-android");
        assertEquals("cnn", entry.family());
        assertEquals(1, entry.splitDepth());
        assertEquals(0.9, entry.threshold());
        assertEquals("exit_logits", entry.outputs().get(0).name());
        assertEquals(64 * 8 * 8, entry.outputs().get(1).elementsPerSample());
        assertEquals(784, entry.input().elementsPerSample());
        assertEquals("entry-android/front_int8.pte", entry.artifact("xnnpack", "int8").orElseThrow().path());
        assertEquals("golden-v1", manifest.backendModelVersion());
    }

    @Test
    void signingKeyPubFormatIsAccepted() throws Exception {
        ManifestVerifier fromFile = ManifestVerifier.forPublicKeyFile(vectors.getString("signing_key_pub") + "\n");
        fromFile.verify(manifestBytes, (vectors.getString("signature_file") + "\n").getBytes(StandardCharsets.US_ASCII));
    }

    @Test
    void anyChangedManifestByteIsRejected() {
        for (int i = 0; i < manifestBytes.length; i += 97) {
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
    void tamperedSignatureOrOtherKeyIsRejected() {
        byte[] signature = Base64.getDecoder().decode(vectors.getString("signature_file"));
        signature[10] ^= 0x40;
        byte[] tamperedFile = Base64.getEncoder().encode(signature);
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, tamperedFile));
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, "not base64!".getBytes()));
        assertThrows(ManifestException.class, () -> verifier.verify(manifestBytes, Base64.getEncoder().encode(new byte[63])));
        byte[] otherKey = vectors.getHex("public_key");
        otherKey[0] ^= 0x01;
        assertThrows(ManifestException.class, () -> new ManifestVerifier(otherKey).verify(manifestBytes, signatureFile));
    }

    @Test
    void artifactDigestsAreChecked() throws Exception {
        Manifest manifest = verifier.verify(manifestBytes, signatureFile);
        int checked = 0;
        for (JsonObject artifact : vectors.getObjectList("artifacts")) {
            byte[] content = artifact.getBase64("content_base64");
            FileEntry entry = manifest.file(artifact.getString("path"));
            ManifestVerifier.verifyFile(entry.sha256(), entry.size(), new ByteArrayInputStream(content), entry.path());
            byte[] changed = content.clone();
            changed[0] ^= 1;
            assertThrows(ManifestException.class, () -> ManifestVerifier.verifyFile(
                    entry.sha256(), entry.size(), new ByteArrayInputStream(changed), entry.path()));
            byte[] longer = java.util.Arrays.copyOf(content, content.length + 1);
            assertThrows(ManifestException.class, () -> ManifestVerifier.verifyFile(
                    entry.sha256(), entry.size(), new ByteArrayInputStream(longer), entry.path()));
            checked++;
        }
        assertEquals(5, checked);
    }

    @Test
    void exportDirectoryOnDisk(@TempDir Path dir) throws Exception {
        Files.write(dir.resolve(ManifestVerifier.MANIFEST_FILE), manifestBytes);
        Files.write(dir.resolve(ManifestVerifier.SIGNATURE_FILE), signatureFile);
        Files.writeString(dir.resolve(ManifestVerifier.PUBLIC_KEY_FILE), vectors.getString("signing_key_pub"));
        Manifest manifest = verifier.verifyDirectory(dir);
        Path pte = dir.resolve("front.pte");
        JsonObject fp32 = vectors.getObjectList("artifacts").stream()
                .filter(a -> a.getString("path").equals("entry-android/front_fp32.pte")).findFirst().orElseThrow();
        Files.write(pte, fp32.getBase64("content_base64"));
        ManifestVerifier.verifyFile(manifest.tier("entry-android").artifact("xnnpack", "fp32").orElseThrow(), pte);

        // A replaced signing_key.pub is noticed even before the signature check.
        byte[] other = new byte[32];
        Files.writeString(dir.resolve(ManifestVerifier.PUBLIC_KEY_FILE), Base64.getEncoder().encodeToString(other));
        ManifestException e = assertThrows(ManifestException.class, () -> verifier.verifyDirectory(dir));
        assertTrue(e.getMessage().contains("pinned"));
    }

    @Test
    void fingerprintOfTheSigningKeyIsChecked() {
        assertEquals(64, Hex.encode(new byte[32]).length());
        assertThrows(IllegalArgumentException.class, () -> new ManifestVerifier(new byte[31]));
    }
}
