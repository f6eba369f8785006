package org.harmonymobile.core.update;

/** What an update must pass: the installed manifest's version and the sha256 (hex) of its bytes. */
public record InstalledVersion(long manifestVersion, String manifestSha256) {}
