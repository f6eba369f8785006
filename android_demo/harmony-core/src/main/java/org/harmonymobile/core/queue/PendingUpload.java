package org.harmonymobile.core.queue;

/**
 * An upload waiting in the queue. The message id was assigned when it was enqueued and is sent on
 * every retry, so the server (idempotent on message ids) stores it once however often it arrives.
 *
 * @param sequence position in the queue (monotonic, survives restarts)
 * @param messageId the id bound into the sealed envelope
 * @param body the exact request body to send (already sealed: no plaintext features or tokens on disk)
 * @param enqueuedAtMillis wall-clock time of enqueueing
 */
public record PendingUpload(long sequence, String messageId, byte[] body, long enqueuedAtMillis) {}
