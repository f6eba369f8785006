package org.harmonymobile.core.manifest;

import java.util.List;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/** A named tensor of a model: shape is batch first, the batch entry being the maximum batch. */
public record TensorSpec(String name, long[] shape, String dtype) {
    static TensorSpec from(JsonObject json) {
        return new TensorSpec(json.getString("name"), json.getLongArray("shape"), json.optString("dtype", "float32"));
    }

    /** Elements of one sample: the product of the shape without its batch entry. */
    public int elementsPerSample() {
        long n = 1;
        for (int i = 1; i < shape.length; i++) {
            n *= shape[i];
        }
        return Math.toIntExact(n);
    }

    static List<TensorSpec> listFrom(List<JsonObject> items) {
        return Immutable.list(items.stream().map(TensorSpec::from));
    }
}
