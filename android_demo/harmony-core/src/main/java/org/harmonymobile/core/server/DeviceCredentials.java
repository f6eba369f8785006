package org.harmonymobile.core.server;

/** What a device keeps after enrolment: its id, bearer token and the pinned server X25519 key. */
public record DeviceCredentials(String deviceId, String token, byte[] serverPublicKey) {
    public DeviceCredentials {
        serverPublicKey = serverPublicKey.clone();
    }

    @Override
    public String toString() {
        return "DeviceCredentials[" + deviceId + ", token hidden]";
    }
}
