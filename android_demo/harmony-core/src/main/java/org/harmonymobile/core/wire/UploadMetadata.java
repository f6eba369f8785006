package org.harmonymobile.core.wire;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.util.Hex;
import org.harmonymobile.core.util.Immutable;

/**
 * The JSON part of an upload plaintext (docs/PROTOCOL.md 4.4). There is no field that can hold a
 * class id: label tokens only. Serialized compactly with keys in the order of the Python model
 * (pydantic {@code model_dump_json(exclude_none=True)}), so Java and Python produce the same bytes.
 *
 * @param clipNorm C_z when rows were L2-clipped, else null
 * @param noiseMultiplier sigma when Gaussian noise was added, else null
 * @param labelDpEpsilon epsilon when the tokens went through randomized response, else null
 */
public record UploadMetadata(
        List<byte[]> labelTokens,
        List<Integer> splitDepths,
        String family,
        String tier,
        String modelVersion,
        Double clipNorm,
        Double noiseMultiplier,
        Double labelDpEpsilon) {
    private static final Pattern TIER = Pattern.compile("^[a-z0-9][a-z0-9_-]{0,63}$");

    public UploadMetadata {
        if (labelTokens.isEmpty() || labelTokens.size() != splitDepths.size()) {
            throw new IllegalArgumentException(
                    labelTokens.size() + " label tokens and " + splitDepths.size() + " split depths; need equal, >= 1");
        }
        for (byte[] token : labelTokens) {
            if (token.length != LabelTokens.TOKEN_BYTES) {
                throw new IllegalArgumentException("label tokens are " + LabelTokens.TOKEN_BYTES + " bytes");
            }
        }
        for (int depth : splitDepths) {
            if (depth < 1) {
                throw new IllegalArgumentException("split depths are >= 1");
            }
        }
        if (family.isEmpty() || family.length() > 64) {
            throw new IllegalArgumentException("family must be 1..64 characters");
        }
        if (!TIER.matcher(tier).matches()) {
            throw new IllegalArgumentException("tier must match " + TIER.pattern() + ": " + tier);
        }
        if (modelVersion.isEmpty() || modelVersion.length() > 128) {
            throw new IllegalArgumentException("model version must be 1..128 characters");
        }
        if (clipNorm != null && !(clipNorm > 0)) {
            throw new IllegalArgumentException("clip norm must be > 0");
        }
        if (noiseMultiplier != null && !(noiseMultiplier >= 0)) {
            throw new IllegalArgumentException("noise multiplier must be >= 0");
        }
        if (labelDpEpsilon != null && !(labelDpEpsilon > 0 && !labelDpEpsilon.isInfinite())) {
            throw new IllegalArgumentException("label DP epsilon must be finite and > 0");
        }
        labelTokens = Immutable.list(labelTokens.stream().map(byte[]::clone));
        splitDepths = Immutable.list(splitDepths);
    }

    public static UploadMetadata of(
            List<byte[]> labelTokens, List<Integer> splitDepths, String family, String tier, String modelVersion) {
        return new UploadMetadata(labelTokens, splitDepths, family, tier, modelVersion, null, null, null);
    }

    public String toJson() {
        Map<String, Object> json = new LinkedHashMap<>();
        List<String> tokens = new ArrayList<>();
        for (byte[] token : labelTokens) {
            tokens.add(Hex.encode(token));
        }
        json.put("label_tokens", tokens);
        json.put("split_depths", splitDepths);
        json.put("family", family);
        json.put("tier", tier);
        json.put("model_version", modelVersion);
        if (clipNorm != null) {
            json.put("clip_norm", clipNorm);
        }
        if (noiseMultiplier != null) {
            json.put("noise_multiplier", noiseMultiplier);
        }
        if (labelDpEpsilon != null) {
            json.put("label_dp_epsilon", labelDpEpsilon);
        }
        return Json.write(json);
    }
}
