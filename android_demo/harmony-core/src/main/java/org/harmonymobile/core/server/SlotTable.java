package org.harmonymobile.core.server;

import java.util.List;
import java.util.regex.Pattern;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.json.JsonException;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/**
 * A back-end version's slot table: slot i's label token (16 lowercase hex characters) at index i, and
 * the label epoch whose key made the tokens. Served in the enrolment response, the manifest and the
 * V2 model metadata's {@code parameters}.
 */
public record SlotTable(String labelEpoch, List<String> tokens) {
    private static final Pattern HEX_TOKEN = Pattern.compile("[0-9a-f]{16}");

    public SlotTable {
        LabelTokens.checkLabelEpoch(labelEpoch);
        tokens = Immutable.list(tokens);
        for (int i = 0; i < tokens.size(); i++) {
            if (!HEX_TOKEN.matcher(tokens.get(i)).matches()) {
                throw new IllegalArgumentException("slot " + i + ": a token is 16 lowercase hex characters, got " + tokens.get(i));
            }
        }
    }

    /** Reads {@code {"label_epoch": e, "slot_table": [hex...]}}; null when either is absent or null. */
    public static SlotTable fromJson(JsonObject json) {
        if (json == null || !json.has("label_epoch") || !json.has("slot_table")) {
            return null;
        }
        try {
            return new SlotTable(json.getString("label_epoch"), Immutable.list(json.getStringList("slot_table")));
        } catch (IllegalArgumentException e) {
            throw new JsonException("invalid slot table: " + e.getMessage());
        }
    }
}
