package org.harmonymobile.core.provisioning;

import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.harmonymobile.core.FederationKey;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.manifest.Manifest;
import org.harmonymobile.core.util.Hex;

/**
 * Is a provisioned secret the one this model was trained under? The verified manifest's slot table
 * holds the tokens of its class names under its label epoch, so the right secret reproduces them
 * and any other (a typo, another federation's, a placeholder) does not: an app checks this before
 * it tokenizes or decodes anything, instead of silently decoding nothing.
 */
public final class SecretCheck {
    private SecretCheck() {}

    public static void requireMatches(FederationKey key, Manifest manifest) throws ProvisioningException {
        if (manifest.labelEpoch() == null || manifest.slotTable() == null) {
            throw new ProvisioningException("this export names no label epoch or slot table: re-export it");
        }
        LabelTokens tokens = key.tokens(manifest.labelEpoch());
        Set<String> expected = new HashSet<>();
        for (String className : manifest.classNames()) {
            expected.add(Hex.encode(tokens.token(className)));
        }
        List<String> table = manifest.slotTable().tokens();
        if (!expected.equals(new HashSet<>(table))) {
            throw new ProvisioningException("the provisioned federation secret is not this model's: its class tokens "
                    + "are not the manifest's slot table (provision the phone with the run's payload)");
        }
    }
}
