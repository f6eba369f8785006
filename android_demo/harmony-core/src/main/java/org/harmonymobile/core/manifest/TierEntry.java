package org.harmonymobile.core.manifest;

import java.util.List;
import java.util.Optional;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/**
 * A device tier as the manifest describes it: the front-end a class of phones runs, and the exit rule
 * its threshold is on ({@code max_softmax}: exit.ExitPolicy; {@code slot_margin}: exit.SlotGatePolicy
 * with the manifest's slot prototypes, docs/PROTOCOL.md 3.5).
 */
public record TierEntry(
        String name,
        String family,
        int splitDepth,
        double width,
        TensorSpec input,
        Normalization normalization,
        List<TensorSpec> outputs,
        List<String> classNames,
        long[] interfaceShape,
        double threshold,
        List<String> quantization,
        List<String> backends,
        double latencyBudgetMs,
        List<Artifact> artifacts,
        String exitRule) {

    public static final String MAX_SOFTMAX = "max_softmax";
    public static final String SLOT_MARGIN = "slot_margin";

    static TierEntry from(JsonObject json) {
        String exitRule = json.optString("exit_rule", MAX_SOFTMAX);
        if (!MAX_SOFTMAX.equals(exitRule) && !SLOT_MARGIN.equals(exitRule)) {
            // a threshold on a score this build does not compute: refused, never misread
            throw new JsonException("tier " + json.getString("name") + " exits by " + exitRule
                    + "; this build answers locally by " + MAX_SOFTMAX + " or " + SLOT_MARGIN);
        }
        return new TierEntry(
                json.getString("name"),
                json.getString("family"),
                json.getInt("split_depth"),
                json.getDouble("width"),
                TensorSpec.from(json.getObject("input")),
                Normalization.from(json.getObject("normalization")),
                TensorSpec.listFrom(json.getObjectList("outputs")),
                Immutable.list(json.getStringList("class_names")),
                json.getLongArray("interface_shape"),
                json.getDouble("threshold"),
                Immutable.list(json.getStringList("quantization")),
                Immutable.list(json.getStringList("backends")),
                json.getDouble("latency_budget_ms"),
                Immutable.list(json.getObjectList("artifacts").stream().map(Artifact::from)),
                exitRule);
    }

    /** The artifact for a backend and quantization, e.g. ("xnnpack", "int8"). */
    public Optional<Artifact> artifact(String backend, String quantization) {
        return artifacts.stream()
                .filter(a -> a.backend().equals(backend) && a.quantization().equals(quantization))
                .findFirst();
    }

    /** A rough relative compute cost: stages run times width squared (channels scale both convolution sides). */
    public double relativeCost() {
        return splitDepth * width * width;
    }
}
