package org.harmonymobile.core.provisioning;

/** A provisioning payload is malformed, of another format, or carries no usable secret; says which. */
public final class ProvisioningException extends Exception {
    public ProvisioningException(String message) {
        super(message);
    }
}
