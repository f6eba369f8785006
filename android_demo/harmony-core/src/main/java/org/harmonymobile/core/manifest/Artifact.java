package org.harmonymobile.core.manifest;

import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;

/** One exported file of a tier: a .pte (ExecuTorch) or .mlpackage (Core ML) with its digest. */
public record Artifact(
        String backend, String quantization, String format, String path, String sha256, long size, int minBatch,
        int maxBatch) {
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
                (int) batch[1]);
    }
}
