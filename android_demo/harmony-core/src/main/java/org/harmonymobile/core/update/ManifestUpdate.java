package org.harmonymobile.core.update;

import org.harmonymobile.core.crypto.Bytes;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.util.Hex;

/**
 * The rollback rule (export/manifest.py, manifest_version): a verified manifest replaces the
 * installed one only when its version is higher. The same version with the same bytes is the
 * installed manifest (nothing to do); anything older, or as old with other bytes, is refused,
 * because a version is never reused and an attacker who kept an old signed manifest must not be
 * able to bring back the model it describes. Counterparts: device/manifest.py is_update,
 * HarmonyKit ManifestUpdate.
 */
public final class ManifestUpdate {
    private ManifestUpdate() {}

    /** @param installed null when nothing is installed yet */
    public static boolean isUpdate(InstalledVersion installed, Manifest candidate, byte[] candidateBytes)
            throws RollbackException {
        if (installed == null || candidate.manifestVersion() > installed.manifestVersion()) {
            return true;
        }
        if (candidate.manifestVersion() == installed.manifestVersion()
                && sha256(candidateBytes).equals(installed.manifestSha256())) {
            return false;
        }
        String what = candidate.manifestVersion() < installed.manifestVersion() ? "older than" : "as old as, but different from,";
        throw new RollbackException("refusing manifest_version " + candidate.manifestVersion() + " ("
                + candidate.modelVersion() + "): it is " + what + " the installed manifest_version "
                + installed.manifestVersion());
    }

    public static String sha256(byte[] bytes) {
        return Hex.encode(Bytes.sha256(bytes));
    }
}
