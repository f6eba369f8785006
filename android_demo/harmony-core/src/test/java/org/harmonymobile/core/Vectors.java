package org.harmonymobile.core;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import org.harmonymobile.core.json.Json;
import org.harmonymobile.core.json.JsonObject;

/** Loads the golden vectors written by tests/vectors/generate.py (path set by the pom's surefire config). */
public final class Vectors {
    private Vectors() {}

    public static Path directory() {
        String configured = System.getProperty("harmony.vectors.dir");
        Path dir = configured != null ? Path.of(configured) : Path.of("../../tests/vectors");
        if (!Files.isDirectory(dir)) {
            throw new IllegalStateException("golden vectors not found at " + dir.toAbsolutePath());
        }
        return dir;
    }

    public static JsonObject load(String name) {
        try {
            return Json.parseObject(Files.readString(directory().resolve(name), StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static float[] floats(JsonObject json, String key) {
        double[] values = json.getDoubleArray(key);
        float[] out = new float[values.length];
        for (int i = 0; i < values.length; i++) {
            out[i] = (float) values[i];
        }
        return out;
    }

    public static int[] ints(JsonObject json, String key) {
        long[] values = json.getLongArray(key);
        int[] out = new int[values.length];
        for (int i = 0; i < values.length; i++) {
            out[i] = Math.toIntExact(values[i]);
        }
        return out;
    }
}
