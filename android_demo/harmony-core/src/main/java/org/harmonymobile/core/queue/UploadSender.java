package org.harmonymobile.core.queue;

import java.io.IOException;

/** Delivers one queued upload; the queue removes it only after {@link Outcome#DELIVERED}. */
@FunctionalInterface
public interface UploadSender {
    enum Outcome {
        /** The server acknowledged (2xx, including "already stored" for a replayed message id). */
        DELIVERED,
        /** Try again later (network down, 429, 503): the upload stays, and draining stops. */
        RETRY_LATER,
        /** The server refused it for good (e.g. 400): moved aside to rejected/, never resent. */
        REJECTED
    }

    Outcome send(PendingUpload upload) throws IOException;
}
