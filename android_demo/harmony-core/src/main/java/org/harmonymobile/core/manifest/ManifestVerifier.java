package org.harmonymobile.core.manifest;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.util.Arrays;
import java.util.Base64;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.crypto.EcdsaP256;
import org.harmonymobile.core.crypto.Ed25519;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.util.Hex;

/**
 * Verifies an export the way export/manifest.py specifies: (1) a signature over the exact bytes of
 * manifest.json under the <em>pinned</em> public key, (2) parse, (3) sha256 and size of every file
 * the app loads. The key shipped beside the manifest proves nothing by itself, because whoever can
 * replace the manifest can replace it too; it must equal the pinned key.
 *
 * <p>An export carries two signatures over the same bytes: Ed25519 (manifest.sig, signing_key.pub)
 * and ECDSA P-256 (manifest.p256.sig, signing_key_p256.pub). Android apps pin the P-256 key
 * ({@link #p256}), since {@code SHA256withECDSA} is in the JCA of every Android release while
 * Ed25519 is missing from the Conscrypt of many Android 13-15 phones; {@link #ed25519} is for JVMs
 * and Androids that have it.
 */
public final class ManifestVerifier {
    public static final String MANIFEST_FILE = "manifest.json";
    public static final String SIGNATURE_FILE = "manifest.sig";
    public static final String PUBLIC_KEY_FILE = "signing_key.pub";
    public static final String P256_SIGNATURE_FILE = "manifest.p256.sig";
    public static final String P256_PUBLIC_KEY_FILE = "signing_key_p256.pub";

    private enum Algorithm { ED25519, P256 }

    private final Algorithm algorithm;
    private final byte[] pinnedPublicKey;
    private final PublicKey p256Key;

    private ManifestVerifier(Algorithm algorithm, byte[] pinnedPublicKey) {
        this.algorithm = algorithm;
        this.pinnedPublicKey = pinnedPublicKey.clone();
        if (algorithm == Algorithm.ED25519) {
            if (pinnedPublicKey.length != Ed25519.PUBLIC_KEY_BYTES) {
                throw new IllegalArgumentException("the pinned Ed25519 key must have 32 bytes");
            }
            this.p256Key = null;
        } else {
            this.p256Key = EcdsaP256.publicKey(pinnedPublicKey);
        }
    }

    /** @param pinnedPublicKey the raw 32-byte Ed25519 key the app ships */
    public ManifestVerifier(byte[] pinnedPublicKey) {
        this(Algorithm.ED25519, pinnedPublicKey);
    }

    public static ManifestVerifier ed25519(byte[] rawPublicKey) {
        return new ManifestVerifier(Algorithm.ED25519, rawPublicKey);
    }

    /** @param spkiDer the X.509 SubjectPublicKeyInfo DER of the P-256 key the app ships */
    public static ManifestVerifier p256(byte[] spkiDer) {
        return new ManifestVerifier(Algorithm.P256, spkiDer);
    }

    /** Reads a pinned key in the signing_key.pub format: base64 of the raw 32 bytes. */
    public static ManifestVerifier forPublicKeyFile(String base64Key) {
        return ed25519(decodeBase64(base64Key.trim(), "public key"));
    }

    /** Reads a pinned key in the signing_key_p256.pub format: base64 of the SPKI DER. */
    public static ManifestVerifier forP256PublicKeyFile(String base64Key) {
        return p256(decodeBase64(base64Key.trim(), "P-256 public key"));
    }

    /** The signature file this verifier reads (manifest.sig or manifest.p256.sig). */
    public String signatureFile() {
        return algorithm == Algorithm.ED25519 ? SIGNATURE_FILE : P256_SIGNATURE_FILE;
    }

    /** The shipped public key file that must equal the pinned key. */
    public String publicKeyFile() {
        return algorithm == Algorithm.ED25519 ? PUBLIC_KEY_FILE : P256_PUBLIC_KEY_FILE;
    }

    /**
     * Checks the signature, then parses.
     *
     * @param manifestBytes the exact bytes of manifest.json
     * @param signatureFile the exact bytes of {@link #signatureFile()} (base64; surrounding whitespace tolerated)
     */
    public Manifest verify(byte[] manifestBytes, byte[] signatureFile) throws ManifestException {
        String name = signatureFile();
        byte[] signature;
        try {
            signature = decodeBase64(new String(signatureFile, StandardCharsets.US_ASCII).trim(), name);
        } catch (IllegalArgumentException e) {
            throw new ManifestException(e.getMessage());
        }
        if (!signatureMatches(manifestBytes, signature)) {
            throw new ManifestException(name + ": signature does not match " + MANIFEST_FILE + " under the pinned key");
        }
        Manifest manifest;
        try {
            manifest = Manifest.parse(new String(manifestBytes, StandardCharsets.UTF_8));
        } catch (JsonException e) {
            throw new ManifestException(MANIFEST_FILE + ": " + e.getMessage(), e);
        }
        String named = algorithm == Algorithm.ED25519 ? manifest.publicKeySha256() : manifest.p256PublicKeySha256();
        if (!Hex.encode(Bytes.sha256(pinnedPublicKey)).equals(named)) {
            throw new ManifestException(MANIFEST_FILE + ": the signature section names another "
                    + (algorithm == Algorithm.ED25519 ? "Ed25519" : "P-256") + " key");
        }
        return manifest;
    }

    private boolean signatureMatches(byte[] manifestBytes, byte[] signature) throws ManifestException {
        if (algorithm == Algorithm.P256) {
            return EcdsaP256.verify(p256Key, manifestBytes, signature);
        }
        if (signature.length != Ed25519.SIGNATURE_BYTES) {
            throw new ManifestException(SIGNATURE_FILE + ": must hold a 64-byte Ed25519 signature, holds "
                    + signature.length + " bytes");
        }
        return Ed25519.verify(pinnedPublicKey, manifestBytes, signature);
    }

    /** Verifies an export directory on disk (manifest, signature and, if present, the shipped key). */
    public Manifest verifyDirectory(Path directory) throws ManifestException, IOException {
        Path shippedKey = directory.resolve(publicKeyFile());
        if (Files.isRegularFile(shippedKey)) {
            byte[] shipped;
            try {
                String text = new String(Files.readAllBytes(shippedKey), StandardCharsets.US_ASCII).trim();
                shipped = decodeBase64(text, publicKeyFile());
            } catch (IllegalArgumentException e) {
                throw new ManifestException(e.getMessage());
            }
            if (!Arrays.equals(shipped, pinnedPublicKey)) {
                throw new ManifestException(publicKeyFile() + ": is not the pinned public key");
            }
        }
        Path signature = directory.resolve(signatureFile());
        if (!Files.isRegularFile(signature)) {
            throw new ManifestException(signatureFile() + ": missing");
        }
        return verify(Files.readAllBytes(directory.resolve(MANIFEST_FILE)), Files.readAllBytes(signature));
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
