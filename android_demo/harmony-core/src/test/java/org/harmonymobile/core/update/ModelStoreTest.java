package org.harmonymobile.core.update;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.Signature;
import java.security.spec.ECGenParameterSpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.stream.Stream;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.Vectors;
import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.exit.ExitGate;
import org.harmonymobile.core.exit.ExitPolicy;
import org.harmonymobile.core.exit.SlotGatePolicy;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.manifest.ManifestException;
import org.harmonymobile.core.manifest.ManifestVerifier;
import org.harmonymobile.core.manifest.SignedManifest;
import org.harmonymobile.core.manifest.TierEntry;
import org.harmonymobile.core.manifest.VariantChooser;
import org.harmonymobile.core.util.Hex;
import org.harmonymobile.core.wire.FeatureTensor;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Updates through the model store: a newer manifest signed by the pinned P-256 key installs and
 * switches; an older one (rollback), a reused version with other content, another key's signature
 * and a tampered artifact are refused, leaving the installed model as it was.
 */
class ModelStoreTest {
    private static final String TIER = "entry-android";

    @TempDir Path root;
    private final JsonObject vectors = Vectors.load("manifest_signature.json");
    private final Map<String, byte[]> published = new HashMap<>();
    private KeyPair pinned;
    private ModelStore store;

    @BeforeEach
    void setUp() throws Exception {
        for (JsonObject artifact : vectors.getObjectList("artifacts")) {
            published.put(artifact.getString("path"), artifact.getBase64("content_base64"));
        }
        pinned = newP256KeyPair();
        store = new ModelStore(root, ManifestVerifier.p256(pinned.getPublic().getEncoded()), "xnnpack",
                VariantChooser.PTE_PREFERENCE);
    }

    static KeyPair newP256KeyPair() throws Exception {
        KeyPairGenerator generator = KeyPairGenerator.getInstance("EC");
        generator.initialize(new ECGenParameterSpec("secp256r1"));
        return generator.generateKeyPair();
    }

    /**
     * The vector's manifest at {@code version} (null: without the field, as manifests written before
     * it), with {@code modelVersion}, signed by {@code key}.
     */
    private SignedManifest signed(Long version, String modelVersion, KeyPair key) throws Exception {
        return signed(version, modelVersion, key, manifest -> {});
    }

    private SignedManifest signed(Long version, String modelVersion, KeyPair key, Consumer<Map<String, Object>> edit)
            throws Exception {
        Map<String, Object> manifest = new LinkedHashMap<>(Json.parseObject(vectors.getString("manifest_text")).asMap());
        edit.accept(manifest);
        manifest.remove("manifest_version");
        if (version != null) {
            manifest.put("manifest_version", version);
        }
        manifest.put("model_version", modelVersion);
        Map<String, Object> signature = new LinkedHashMap<>(Json.parseObject(Json.write(manifest.get("signature"))).asMap());
        Map<String, Object> p256 = new LinkedHashMap<>(Json.parseObject(Json.write(signature.get("p256"))).asMap());
        p256.put("public_key_sha256", Hex.encode(Bytes.sha256(pinned.getPublic().getEncoded())));
        signature.put("p256", p256);
        manifest.put("signature", signature);
        byte[] bytes = Json.write(manifest).getBytes(StandardCharsets.UTF_8);
        Signature signer = Signature.getInstance("SHA256withECDSA");
        signer.initSign(key.getPrivate());
        signer.update(bytes);
        return new SignedManifest(bytes, Base64.getEncoder().encode(signer.sign()));
    }

    private SignedManifest signed(long version) throws Exception {
        return signed((Long) version, "golden-v1", pinned);
    }

    private ArtifactSource source() {
        return path -> new ByteArrayInputStream(published.get(path));
    }

    private static TierEntry tier(Manifest manifest) {
        return manifest.tier(TIER);
    }

    private List<String> leftovers() throws IOException {
        try (Stream<Path> files = Files.list(root)) {
            return files.map(p -> p.getFileName().toString()).filter(n -> n.startsWith(".")).toList();
        }
    }

    /** The vector's manifest with entry-android gated by the slot margin and the prototypes published. */
    private SignedManifest slotGated(long version, byte[] prototypes) throws Exception {
        published.put("slot_prototypes.hmft", prototypes);
        return signed(version, "golden-v1", pinned, manifest -> {
            List<Object> tiers = new ArrayList<>();
            for (Object entry : (List<?>) manifest.get("tiers")) {
                Map<String, Object> tier = new LinkedHashMap<>(Json.parseObject(Json.write(entry)).asMap());
                if (TIER.equals(tier.get("name"))) {
                    tier.put("exit_rule", "slot_margin");
                    tier.put("threshold", 0.25);
                }
                tiers.add(tier);
            }
            manifest.put("tiers", tiers);
            Map<String, Object> entry = new LinkedHashMap<>();
            entry.put("path", "slot_prototypes.hmft");
            entry.put("sha256", Hex.encode(Bytes.sha256(prototypes)));
            entry.put("size", (long) prototypes.length);
            entry.put("shape", List.of(10L, 4096L));
            manifest.put("slot_prototypes", entry);
        });
    }

    @Test
    void aSlotGatedTierInstallsItsPrototypesAndGatesByThem() throws Exception {
        float[] values = new float[10 * 4096];
        for (int s = 0; s < 10; s++) {
            values[s * 4096 + s] = 1f; // slot s points along feature s
        }
        byte[] prototypes = new FeatureTensor(values, new int[] {10, 4096}).encode();
        ModelStore.Installed installed = store.install(slotGated(4, prototypes), source(), ModelStoreTest::tier).get();
        assertEquals(TierEntry.SLOT_MARGIN, installed.tier().exitRule());
        assertArrayEquals(prototypes, Files.readAllBytes(installed.slotPrototypes()));
        boolean[] own = new boolean[10];
        own[3] = true;
        SlotGatePolicy gate = SlotGatePolicy.fromPrototypes(
                Files.readAllBytes(store.current(ModelStoreTest::tier).get().slotPrototypes()), own,
                installed.tier().threshold());
        float[] along = new float[4096];
        along[3] = 1f;
        assertTrue(gate.decide(new float[] {0f, 1f}, along).exitLocally());
        along[3] = 0f;
        along[4] = 1f;
        assertFalse(gate.decide(new float[] {0f, 1f}, along).exitLocally());

        Files.write(installed.slotPrototypes(), "bit rot".getBytes(StandardCharsets.UTF_8));
        assertThrows(ManifestException.class, () -> store.current(ModelStoreTest::tier));
        SignedManifest update = slotGated(5, prototypes);
        published.put("slot_prototypes.hmft", "evil".getBytes(StandardCharsets.UTF_8));
        ManifestException tampered = assertThrows(ManifestException.class,
                () -> store.install(update, source(), ModelStoreTest::tier));
        assertTrue(tampered.getMessage().contains("slot_prototypes.hmft"), tampered.getMessage());
    }

    @Test
    void theInstalledTierGivesTheGateItsPhoneAnswersBy() throws Exception {
        float[] values = new float[10 * 4096];
        for (int s = 0; s < 10; s++) {
            values[s * 4096 + s] = 1f; // slot s points along feature s
        }
        ModelStore.Installed installed = store.install(
                slotGated(4, new FeatureTensor(values, new int[] {10, 4096}).encode()), source(), ModelStoreTest::tier).get();
        FederationKey key = new FederationKey(Vectors.load("label_tokens.json").getHex("federation_secret"));
        Manifest manifest = installed.manifest();
        List<String> slotClasses =
                key.tokens(manifest.slotTable().labelEpoch()).slotClasses(manifest.classNames(), manifest.slotTable().tokens());
        ExitGate gate = installed.exitGate(key, List.of(slotClasses.get(3))); // the phone holds slot 3's class
        float[] along = new float[4096];
        along[3] = 1f;
        assertTrue(gate.decide(new float[] {0f, 1f}, along).exitLocally());
        along[3] = 0f;
        along[4] = 1f; // nearest another class's slot
        assertFalse(gate.decide(new float[] {0f, 1f}, along).exitLocally());

        IllegalStateException unprovisioned = assertThrows(IllegalStateException.class, () -> installed.exitGate(key, List.of()));
        assertTrue(unprovisioned.getMessage().contains("harmony provision --export"), unprovisioned.getMessage());
        assertThrows(IllegalArgumentException.class, () -> installed.exitGate(key, List.of("no such class")));
        ModelStore.Installed maxSoftmax = new ModelStore.Installed(manifest, manifest.tiers().stream()
                .filter(t -> TierEntry.MAX_SOFTMAX.equals(t.exitRule())).findFirst().orElseThrow(),
                installed.artifact(), installed.file(), installed.version(), null);
        assertTrue(maxSoftmax.exitGate(key, null) instanceof ExitPolicy);
    }

    @Test
    void aNewerManifestInstallsAndSwitchesTheSameOneIsANoOp() throws Exception {
        ModelStore.Installed first = store.install(signed(7), source(), ModelStoreTest::tier).get();
        assertEquals(7, first.version().manifestVersion());
        assertEquals("int8", first.artifact().quantization());
        assertEquals(7, store.current(ModelStoreTest::tier).get().version().manifestVersion());
        assertFalse(store.install(signed(7), source(), ModelStoreTest::tier).isPresent());
        ModelStore.Installed second = store.install(signed(8), source(), ModelStoreTest::tier).get();
        assertEquals(second.file(), store.current(ModelStoreTest::tier).get().file());
        try (Stream<Path> versions = Files.list(root.resolve(ModelStore.VERSIONS_DIR))) {
            assertEquals(List.of("8"), versions.map(p -> p.getFileName().toString()).toList());
        }
        assertEquals(List.of(), leftovers());
    }

    @Test
    void anOlderManifestSignedByThePinnedKeyIsARollback() throws Exception {
        store.install(signed(9), source(), ModelStoreTest::tier);
        RollbackException older = assertThrows(RollbackException.class,
                () -> store.install(signed(8), source(), ModelStoreTest::tier));
        assertTrue(older.getMessage().contains("manifest_version 8 (golden-v1): it is older than the installed manifest_version 9"));
        RollbackException reused = assertThrows(RollbackException.class,
                () -> store.install(signed(9L, "golden-v0", pinned), source(), ModelStoreTest::tier));
        assertTrue(reused.getMessage().contains("as old as, but different from"));
        assertEquals(9, store.current(ModelStoreTest::tier).get().version().manifestVersion());
    }

    @Test
    void anotherKeysSignatureAndATamperedArtifactAreRefused() throws Exception {
        store.install(signed(3), source(), ModelStoreTest::tier);
        KeyPair attacker = newP256KeyPair();
        ManifestException swapped = assertThrows(ManifestException.class,
                () -> store.install(signed(4L, "evil", attacker), source(), ModelStoreTest::tier));
        assertTrue(swapped.getMessage().contains("under the pinned key"));
        ManifestException tampered = assertThrows(ManifestException.class,
                () -> store.install(signed(4), path -> new ByteArrayInputStream("evil".getBytes(StandardCharsets.UTF_8)),
                        ModelStoreTest::tier));
        assertTrue(tampered.getMessage().contains("size"));
        assertEquals(3, store.current(ModelStoreTest::tier).get().version().manifestVersion());
        assertEquals(List.of(), leftovers());
    }

    @Test
    void aManifestWithoutAVersionIsOlderThanAnyInstalledOne() throws Exception {
        store.install(signed(1), source(), ModelStoreTest::tier);
        SignedManifest unversioned = signed(null, "golden-v1", pinned);
        Manifest parsed = ManifestVerifier.p256(pinned.getPublic().getEncoded())
                .verify(unversioned.manifest(), unversioned.signature());
        assertEquals(0, parsed.manifestVersion());
        assertThrows(RollbackException.class,
                () -> store.install(unversioned, source(), ModelStoreTest::tier));
        assertTrue(ManifestUpdate.isUpdate(null, parsed, unversioned.manifest()));
    }

    @Test
    void aDamagedInstalledArtifactIsNoticedAndStillBarsOlderVersions() throws Exception {
        ModelStore.Installed installed = store.install(signed(5), source(), ModelStoreTest::tier).get();
        Files.write(installed.file(), "bit rot".getBytes(StandardCharsets.UTF_8));
        assertThrows(ManifestException.class, () -> store.current(ModelStoreTest::tier));
        assertThrows(RollbackException.class, () -> store.install(signed(4), source(), ModelStoreTest::tier));
        store.install(signed(6), source(), ModelStoreTest::tier);
        assertEquals(6, store.current(ModelStoreTest::tier).get().version().manifestVersion());
    }
}
