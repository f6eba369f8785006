package org.harmonymobile.core;

import org.harmonymobile.core.crypto.LabelTokens;

/**
 * The label-token key material a phone is provisioned with out of band (MDM / app configuration,
 * docs/PROTOCOL.md 2-3): the federation secret, which the server never holds. The label epoch
 * that uploads name comes from the verified manifest or the enrolment response.
 */
public record FederationKey(byte[] secret) {
    public FederationKey {
        if (secret.length < LabelTokens.MIN_SECRET_BYTES) {
            throw new IllegalArgumentException("the federation secret must be at least 16 bytes");
        }
        secret = secret.clone();
    }

    /** The tokens of one label epoch. */
    public LabelTokens tokens(String labelEpoch) {
        return LabelTokens.forEpoch(secret, labelEpoch);
    }

    @Override
    public String toString() {
        return "FederationKey[secret hidden]";
    }
}
