package org.harmonymobile.core.manifest;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.Base64;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.crypto.Ed25519;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.util.Hex;

/**
 * Verifies an export the way export/manifest.py specifies: (1) manifest.sig over the exact bytes of
 * manifest.json under the <em>pinned</em> public key, (2) parse, (3) sha256 and size of every file
 * the app loads. The key shipped beside the manifest (signing_key.pub) proves nothing by itself,
 * because whoever can replace the manifest can replace it too; it must equal the pinned key.
 */
public final class ManifestVerifier {
    public static final String MANIFEST_FILE = "manifest.json";
    public static final String SIGNATURE_FILE = "manifest.sig";
    public static final String PUBLIC_KEY_FILE = "signing_key.pub";

    private final byte[] pinnedPublicKey;

    /** @param pinnedPublicKey the raw 32-byte Ed25519 key the app ships */
    public ManifestVerifier(byte[] pinnedPublicKey) {
        if (pinnedPublicKey.length != Ed25519.PUBLIC_KEY_BYTES) {
            throw new IllegalArgumentException("the pinned Ed25519 key must have 32 bytes");
        }
        this.pinnedPublicKey = pinnedPublicKey.clone();
    }

    /** Reads a pinned key in the signing_key.pub format: base64 of the raw 32 bytes. */
    public static ManifestVerifier forPublicKeyFile(String base64Key) {
        return new ManifestVerifier(decodeBase64(base64Key.trim(), "public key"));
    }

    /**
     * Checks the signature, then parses.
     *
     * @param manifestBytes the exact bytes of manifest.json
     * @param signatureFile the exact bytes of manifest.sig (base64 of 64 bytes; surrounding whitespace tolerated)
     */
    public Manifest verify(byte[] manifestBytes, byte[] signatureFile) throws ManifestException {
        byte[] signature;
        try {
            signature = decodeBase64(new String(signatureFile, StandardCharsets.US_ASCII).trim(), SIGNATURE_FILE);
        } catch (IllegalArgumentException e) {
            throw new ManifestException(e.getMessage());
        }
        if (signature.length != Ed25519.SIGNATURE_BYTES) {
            throw new ManifestException(SIGNATURE_FILE + ": must hold a 64-byte Ed25519 signature, holds "
                    + signature.length + " bytes");
        }
        if (!Ed25519.verify(pinnedPublicKey, manifestBytes, signature)) {
            throw new ManifestException(
                    SIGNATURE_FILE + ": signature does not match " + MANIFEST_FILE + " under the pinned key");
        }
        Manifest manifest;
        try {
            manifest = Manifest.parse(new String(manifestBytes, StandardCharsets.UTF_8));
        } catch (JsonException e) {
            throw new ManifestException(MANIFEST_FILE + ": " + e.getMessage(), e);
        }
        if (!manifest.publicKeySha256().equals(Hex.encode(Bytes.sha256(pinnedPublicKey)))) {
            throw new ManifestException(MANIFEST_FILE + ": signature.public_key_sha256 names another key");
        }
        return manifest;
    }

    /** Verifies an export directory on disk (manifest, signature and, if present, the shipped key). */
    public Manifest verifyDirectory(Path directory) throws ManifestException, IOException {
        Path shippedKey = directory.resolve(PUBLIC_KEY_FILE);
        if (Files.isRegularFile(shippedKey)) {
            byte[] shipped;
            try {
                shipped = decodeBase64(new String(Files.readAllBytes(shippedKey), StandardCharsets.US_ASCII).trim(), PUBLIC_KEY_FILE);
            } catch (IllegalArgumentException e) {
                throw new ManifestException(e.getMessage());
            }
            if (!Arrays.equals(shipped, pinnedPublicKey)) {
                throw new ManifestException(PUBLIC_KEY_FILE + ": is not the pinned public key");
            }
        }
        return verify(Files.readAllBytes(directory.resolve(MANIFEST_FILE)),
                Files.readAllBytes(directory.resolve(SIGNATURE_FILE)));
    }

    /** Checks a file the app is about to load (a .pte) against its manifest entry; streams, so large files are fine. */
    public static void verifyFile(String expectedSha256, long expectedSize, InputStream content, String name)
            throws ManifestException, IOException {
        MessageDigest digest = Bytes.newSha256();
        byte[] buffer = new byte[1 << 16];
        long size = 0;
        for (int n; (n = content.read(buffer)) > 0; ) {
            digest.update(buffer, 0, n);
            size += n;
        }
        if (size != expectedSize) {
            throw new ManifestException(name + ": size " + size + " bytes, manifest says " + expectedSize);
        }
        String actual = Hex.encode(digest.digest());
        if (!actual.equals(expectedSha256)) {
            throw new ManifestException(name + ": sha256 " + actual + " does not match manifest " + expectedSha256);
        }
    }

    public static void verifyFile(Artifact artifact, Path file) throws ManifestException, IOException {
        try (InputStream in = Files.newInputStream(file)) {
            verifyFile(artifact.sha256(), artifact.size(), in, artifact.path());
        }
    }

    private static byte[] decodeBase64(String text, String what) {
        try {
            return Base64.getDecoder().decode(text);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(what + ": not base64: " + e.getMessage());
        }
    }
}
