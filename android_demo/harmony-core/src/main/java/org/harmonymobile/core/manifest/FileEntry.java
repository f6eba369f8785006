package org.harmonymobile.core.manifest;

import org.harmonymobile.core.json.JsonObject;

/** A file of the export directory with its lowercase-hex sha256 and size in bytes. */
public record FileEntry(String path, String sha256, long size) {
    static FileEntry from(JsonObject json) {
        return new FileEntry(json.getString("path"), json.getString("sha256"), json.getLong("size"));
    }
}
