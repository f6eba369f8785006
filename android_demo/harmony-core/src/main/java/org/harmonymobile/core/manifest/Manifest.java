package org.harmonymobile.core.manifest;

import java.util.List;
import java.util.NoSuchElementException;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.server.SlotTable;
import org.harmonymobile.core.util.Immutable;

/**
 * The export manifest (export/manifest.py, format 1). Obtain one only through {@link ManifestVerifier},
 * which checks a signature over the exact bytes before anything is parsed.
 *
 * @param manifestVersion monotonic; a phone refuses a manifest older than the one it runs (0 in
 *     manifests written before the field existed)
 * @param p256PublicKeySha256 sha256 of the P-256 key's SPKI DER, or null for an Ed25519-only export
 * @param labelEpoch the label epoch of the shipped back-end (null in exports made before slot tables)
 * @param slotTable the shipped back-end's slot table (null likewise)
 * @param slotPrototypes what slot_margin tiers gate by (null when no tier does)
 */
public record Manifest(
        int format,
        String modelVersion,
        long manifestVersion,
        int numClasses,
        List<String> classNames,
        long[] interfaceShape,
        String backendModelVersion,
        String publicKeySha256,
        String p256PublicKeySha256,
        String labelEpoch,
        SlotTable slotTable,
        List<TierEntry> tiers,
        List<FileEntry> files,
        SlotPrototypesEntry slotPrototypes) {
    public static final int FORMAT = 1;
    public static final String KIND = "harmony-mobile/export";

    static Manifest parse(String text) {
        JsonObject json = Json.parseObject(text);
        int format = json.getInt("format");
        if (format != FORMAT) {
            throw new JsonException(
                    "manifest format " + format + " is not supported (this library reads format " + FORMAT + ")");
        }
        if (!KIND.equals(json.getString("kind"))) {
            throw new JsonException("not a harmony-mobile export manifest");
        }
        JsonObject signature = json.getObject("signature");
        if (!"Ed25519".equals(signature.getString("algorithm"))) {
            throw new JsonException("unsupported signature algorithm");
        }
        long manifestVersion = json.has("manifest_version") ? json.getLong("manifest_version") : 0;
        if (manifestVersion < 0) {
            throw new JsonException("manifest_version must be >= 0, got " + manifestVersion);
        }
        List<TierEntry> tiers = Immutable.list(json.getObjectList("tiers").stream().map(TierEntry::from));
        SlotPrototypesEntry prototypes =
                json.has("slot_prototypes") ? SlotPrototypesEntry.from(json.getObject("slot_prototypes")) : null;
        for (TierEntry tier : tiers) {
            if (TierEntry.SLOT_MARGIN.equals(tier.exitRule()) && prototypes == null) {
                throw new JsonException("tier " + tier.name() + " exits by slot_margin: the manifest has no slot_prototypes");
            }
        }
        return new Manifest(
                format,
                json.getString("model_version"),
                manifestVersion,
                json.getInt("num_classes"),
                Immutable.list(json.getStringList("class_names")),
                json.getLongArray("interface_shape"),
                json.getObject("backend").getString("model_version"),
                signature.getString("public_key_sha256"),
                signature.has("p256") ? signature.getObject("p256").getString("public_key_sha256") : null,
                json.optString("label_epoch", null),
                SlotTable.fromJson(json),
                tiers,
                Immutable.list(json.getObjectList("files").stream().map(FileEntry::from)),
                prototypes);
    }

    public TierEntry tier(String name) {
        return tiers.stream()
                .filter(t -> t.name().equals(name))
                .findFirst()
                .orElseThrow(() -> new NoSuchElementException("manifest has no tier \"" + name + "\""));
    }

    public FileEntry file(String path) {
        return files.stream()
                .filter(f -> f.path().equals(path))
                .findFirst()
                .orElseThrow(() -> new NoSuchElementException("manifest lists no file \"" + path + "\""));
    }
}
