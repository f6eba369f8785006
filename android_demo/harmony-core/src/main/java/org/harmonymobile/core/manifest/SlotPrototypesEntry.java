package org.harmonymobile.core.manifest;

import org.harmonymobile.core.json.JsonObject;

/**
 * The manifest's {@code slot_prototypes}: the server's slot prototypes a slot_margin tier gates by
 * (docs/PROTOCOL.md 3.5), one HMFT float32 tensor of {@code shape} [slots, features].
 */
public record SlotPrototypesEntry(String path, String sha256, long size, long[] shape) {
    static SlotPrototypesEntry from(JsonObject json) {
        return new SlotPrototypesEntry(
                json.getString("path"), json.getString("sha256"), json.getLong("size"), json.getLongArray("shape"));
    }
}
