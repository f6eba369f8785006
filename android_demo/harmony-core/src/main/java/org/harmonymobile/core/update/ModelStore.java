package org.harmonymobile.core.update;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.function.Function;
import java.util.stream.Stream;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.exit.ExitGate;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.exit.SlotGatePolicy;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.manifest.Artifact;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.manifest.ManifestException;
import org.harmonymobile.core.manifest.ManifestVerifier;
import org.harmonymobile.core.manifest.SignedManifest;
import org.harmonymobile.core.manifest.SlotPrototypesEntry;
import org.harmonymobile.core.manifest.TierEntry;
import org.harmonymobile.core.manifest.VariantChooser;
import org.harmonymobile.core.server.SlotTable;
import org.harmonymobile.core.util.Immutable;

/**
 * The model a phone runs and its updates: a newer signed manifest only, switched to atomically.
 *
 * <pre>
 *   root/current.json          {"manifest_version", "manifest_sha256", "directory"}: the model in use,
 *                              replaced by one atomic rename (a reader sees the old model or the new)
 *   root/versions/&lt;version&gt;/   manifest.json, its signature file, &lt;sha256&gt;.pte: verified
 *   root/.staging-*            an update being written (deleted when it fails)
 * </pre>
 *
 * <p>{@link #install} verifies the signature under the pinned key, refuses a rollback
 * ({@link ManifestUpdate}), picks the tier ({@code tierOf}) and its variant ({@link VariantChooser}),
 * streams the artifact (and a slot_margin tier's slot prototypes) from the {@link ArtifactSource},
 * checks each file's sha256 and size against the signed manifest, and only then switches. The app's bundled export goes through the same path, so a
 * bundled model older than an installed update is refused too. Counterparts:
 * harmony_mobile/device/model_store.py, HarmonyKit ModelStore.
 */
public final class ModelStore {
    public static final String CURRENT_FILE = "current.json";
    public static final String VERSIONS_DIR = "versions";

    /**
     * The model in use: its verified manifest, tier, chosen artifact and that artifact's file, and for a
     * slot_margin tier the slot prototypes' file (null otherwise; {@code SlotGatePolicy.fromPrototypes}).
     */
    public record Installed(
            Manifest manifest, TierEntry tier, Artifact artifact, Path file, InstalledVersion version, Path slotPrototypes) {

        /**
         * The gate this phone answers locally by: max softmax at the tier's threshold, or the slot gate
         * from the installed prototypes, whose own slots are those the manifest's slot table decodes
         * (with {@code federation}) to one of {@code ownClasses}, the class names the phone holds. A
         * slot-gated tier without them is refused: its threshold means nothing on a max-softmax score.
         */
        public ExitGate exitGate(FederationKey federation, List<String> ownClasses) throws IOException {
            if (TierEntry.MAX_SOFTMAX.equals(tier.exitRule())) {
                return new ExitPolicy(tier.threshold());
            }
            if (ownClasses == null || ownClasses.isEmpty()) {
                throw new IllegalStateException("tier " + tier.name() + " exits by " + tier.exitRule()
                        + ", which needs the classes this phone holds: provision it with a payload that names"
                        + " them (harmony provision --export)");
            }
            for (String name : ownClasses) {
                if (!manifest.classNames().contains(name)) {
                    throw new IllegalArgumentException("own class \"" + name + "\" is none of the manifest's class names");
                }
            }
            SlotTable table = manifest.slotTable();
            List<String> slotClasses = federation.tokens(table.labelEpoch()).slotClasses(manifest.classNames(), table.tokens());
            boolean[] own = SlotGatePolicy.ownSlots(slotClasses, ownClasses);
            return SlotGatePolicy.fromPrototypes(Files.readAllBytes(slotPrototypes), own, tier.threshold());
        }
    }

    private final Path root;
    private final ManifestVerifier verifier;
    private final String backend;
    private final List<String> preference;

    public ModelStore(Path root, ManifestVerifier verifier, String backend, List<String> preference) {
        this.root = root;
        this.verifier = verifier;
        this.backend = backend;
        this.preference = Immutable.list(preference);
    }

    /** The installed version from current.json alone (the mark an update must pass), if any. */
    public Optional<InstalledVersion> installedVersion() throws IOException, ManifestException {
        JsonObject pointer = pointer();
        if (pointer == null) {
            return Optional.empty();
        }
        return Optional.of(new InstalledVersion(pointer.getLong("manifest_version"), pointer.getString("manifest_sha256")));
    }

    /** The model in use, re-verified (signature, pointer, artifact digest), if any. */
    public Optional<Installed> current(Function<Manifest, TierEntry> tierOf) throws IOException, ManifestException {
        JsonObject pointer = pointer();
        if (pointer == null) {
            return Optional.empty();
        }
        Path directory = root.resolve(pointer.getString("directory")).normalize();
        if (!directory.startsWith(root.normalize())) {
            throw new ManifestException(CURRENT_FILE + " points outside the model store");
        }
        byte[] bytes = Files.readAllBytes(directory.resolve(ManifestVerifier.MANIFEST_FILE));
        Manifest manifest = verifier.verify(bytes, Files.readAllBytes(directory.resolve(verifier.signatureFile())));
        InstalledVersion version = installedVersion().get();
        if (manifest.manifestVersion() != version.manifestVersion()
                || !ManifestUpdate.sha256(bytes).equals(version.manifestSha256())) {
            throw new ManifestException("the installed manifest is not the one " + CURRENT_FILE + " names");
        }
        TierEntry tier = tierOf.apply(manifest);
        Artifact artifact = choose(tier);
        Path file = directory.resolve(artifact.sha256() + "." + artifact.format());
        ManifestVerifier.verifyFile(artifact, file);
        Path prototypes = prototypesFile(manifest, tier, directory);
        if (prototypes != null) {
            verifyPrototypes(manifest.slotPrototypes(), prototypes);
        }
        return Optional.of(new Installed(manifest, tier, artifact, file, version, prototypes));
    }

    /** Where a slot_margin tier's prototypes live in an installed version's directory (null: none needed). */
    private static Path prototypesFile(Manifest manifest, TierEntry tier, Path directory) {
        return TierEntry.SLOT_MARGIN.equals(tier.exitRule())
                ? directory.resolve(manifest.slotPrototypes().sha256() + ".hmft")
                : null;
    }

    private static void verifyPrototypes(SlotPrototypesEntry entry, Path file) throws IOException, ManifestException {
        try (InputStream in = Files.newInputStream(file)) {
            ManifestVerifier.verifyFile(entry.sha256(), entry.size(), in, entry.path());
        }
    }

    /**
     * Installs a signed manifest and its artifact when it is an update; empty when it is the installed
     * manifest. Throws RollbackException for an older one and ManifestException for a bad signature or
     * artifact; the installed model is then untouched.
     */
    public Optional<Installed> install(SignedManifest update, ArtifactSource source, Function<Manifest, TierEntry> tierOf)
            throws IOException, ManifestException {
        Manifest manifest = verifier.verify(update.manifest(), update.signature());
        if (!ManifestUpdate.isUpdate(installedVersion().orElse(null), manifest, update.manifest())) {
            return Optional.empty();
        }
        TierEntry tier = tierOf.apply(manifest);
        Artifact artifact = choose(tier);
        Files.createDirectories(root.resolve(VERSIONS_DIR));
        Path staging = Files.createTempDirectory(root, ".staging-");
        Path target = root.resolve(VERSIONS_DIR).resolve(Long.toString(manifest.manifestVersion()));
        try {
            write(staging.resolve(ManifestVerifier.MANIFEST_FILE), update.manifest());
            write(staging.resolve(verifier.signatureFile()), update.signature());
            Path file = staging.resolve(artifact.sha256() + "." + artifact.format());
            try (InputStream in = source.open(artifact.path())) {
                write(file, in);
            }
            ManifestVerifier.verifyFile(artifact, file);
            Path prototypes = prototypesFile(manifest, tier, staging);
            if (prototypes != null) {
                try (InputStream in = source.open(manifest.slotPrototypes().path())) {
                    write(prototypes, in);
                }
                verifyPrototypes(manifest.slotPrototypes(), prototypes);
            }
            deleteTree(target); // a half-installed copy of this same version
            Files.move(staging, target, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException | ManifestException | RuntimeException e) {
            deleteTree(staging);
            throw e;
        }
        InstalledVersion version = new InstalledVersion(manifest.manifestVersion(), ManifestUpdate.sha256(update.manifest()));
        switchTo(version, target);
        removeOtherVersions(target);
        return Optional.of(new Installed(manifest, tier, artifact, target.resolve(artifact.sha256() + "." + artifact.format()),
                version, prototypesFile(manifest, tier, target)));
    }

    private Artifact choose(TierEntry tier) throws ManifestException {
        Optional<Artifact> artifact = VariantChooser.choose(tier, backend, preference);
        if (!artifact.isPresent()) {
            throw new ManifestException("tier " + tier.name() + " has no " + backend + " artifact");
        }
        return artifact.get();
    }

    private JsonObject pointer() throws IOException, ManifestException {
        try {
            return Json.parseObject(new String(Files.readAllBytes(root.resolve(CURRENT_FILE)), StandardCharsets.UTF_8));
        } catch (NoSuchFileException e) {
            return null;
        } catch (JsonException e) {
            throw new ManifestException("the installed model's pointer " + CURRENT_FILE + " is damaged: " + e.getMessage());
        }
    }

    /** Points current.json at {@code target} with one atomic rename, after the data is on disk. */
    private void switchTo(InstalledVersion version, Path target) throws IOException {
        Map<String, Object> pointer = new LinkedHashMap<>();
        pointer.put("manifest_version", version.manifestVersion());
        pointer.put("manifest_sha256", version.manifestSha256());
        pointer.put("directory", root.relativize(target).toString().replace('\\', '/'));
        Path temporary = root.resolve("." + CURRENT_FILE + ".tmp");
        write(temporary, Json.write(pointer).getBytes(StandardCharsets.UTF_8));
        Files.move(temporary, root.resolve(CURRENT_FILE), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    private void removeOtherVersions(Path keep) throws IOException {
        try (DirectoryStream<Path> versions = Files.newDirectoryStream(root.resolve(VERSIONS_DIR))) {
            for (Path directory : versions) {
                if (!directory.equals(keep)) {
                    deleteTree(directory);
                }
            }
        }
    }

    private static void write(Path file, byte[] bytes) throws IOException {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING)) {
            channel.write(java.nio.ByteBuffer.wrap(bytes));
            channel.force(true);
        }
    }

    private static void write(Path file, InputStream in) throws IOException {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING); OutputStream out = java.nio.channels.Channels.newOutputStream(channel)) {
            byte[] buffer = new byte[1 << 16];
            for (int n; (n = in.read(buffer)) > 0; ) {
                out.write(buffer, 0, n);
            }
            channel.force(true);
        }
    }

    private static void deleteTree(Path path) throws IOException {
        if (!Files.exists(path)) {
            return;
        }
        try (Stream<Path> walk = Files.walk(path)) {
            for (Path p : (Iterable<Path>) walk.sorted(Comparator.reverseOrder())::iterator) {
                Files.deleteIfExists(p);
            }
        }
    }
}
