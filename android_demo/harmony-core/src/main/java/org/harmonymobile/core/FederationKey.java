package org.harmonymobile.core;

/**
 * The label-token key material a phone is provisioned with out of band (MDM / app configuration,
 * docs/PROTOCOL.md 2-3): the federation secret, which the server never holds, and the current
 * round (key epoch) id that uploads name as {@code round_id}.
 */
public record FederationKey(byte[] secret, long roundId) {
    public FederationKey {
        if (secret.length < 16) {
            throw new IllegalArgumentException("the federation secret must be at least 16 bytes");
        }
        if (roundId < 0) {
            throw new IllegalArgumentException("round ids are >= 0");
        }
        secret = secret.clone();
    }

    @Override
    public String toString() {
        return "FederationKey[round " + roundId + ", secret hidden]";
    }
}
