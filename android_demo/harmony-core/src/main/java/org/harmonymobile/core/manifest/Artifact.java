package org.harmonymobile.core.manifest;

import java.util.List;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/**
 * One exported file of a tier: a .pte (ExecuTorch) or .mlpackage (Core ML) with its digest.
 *
 * @param verdict whether the variant met the export's quality checks: "pass", "fail" or
 *     "not_checked" (also for exports made before verdicts); see {@link VariantChooser}
 * @param failedChecks the checks it missed (verification.json names them)
 */
public record Artifact(
        String backend, String quantization, String format, String path, String sha256, long size, int minBatch,
        int maxBatch, String verdict, List<String> failedChecks) {
    public static final String NOT_CHECKED = "not_checked";

    public Artifact {
        failedChecks = Immutable.list(failedChecks);
    }

    /** An artifact nothing checked (tests, and exports made before verdicts). */
    public Artifact(String backend, String quantization, String format, String path, String sha256, long size,
            int minBatch, int maxBatch) {
        this(backend, quantization, format, path, sha256, size, minBatch, maxBatch, NOT_CHECKED, List.of());
    }

    static Artifact from(JsonObject json) {
        long[] batch = json.getLongArray("batch");
        if (batch.length != 2) {
            throw new JsonException("artifact \"batch\" must be [min, max]");
        }
        return new Artifact(
                json.getString("backend"),
                json.getString("quantization"),
                json.getString("format"),
                json.getString("path"),
                json.getString("sha256"),
                json.getLong("size"),
                (int) batch[0],
                (int) batch[1],
                json.optString("verdict", NOT_CHECKED),
                json.has("failed_checks") ? json.getStringList("failed_checks") : List.of());
    }
}
