package org.harmonymobile.core.update;

import java.io.IOException;
import java.io.InputStream;

/**
 * Where an update's artifacts come from: the app's assets, the server ({@code HarmonyServerClient.artifacts},
 * {@code GET /v1/artifacts/{path}}), or another host the export directory is published on.
 */
public interface ArtifactSource {
    /** The bytes of a manifest path (e.g. {@code tiers/mid-android/front_int8.pte}); closed by the caller. */
    InputStream open(String path) throws IOException;
}
