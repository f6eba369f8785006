package org.harmonymobile.core.queue;

/** The queue is at its entry or byte limit and its overflow policy is to refuse new uploads. */
public final class QueueFullException extends Exception {
    public QueueFullException(String message) {
        super(message);
    }
}
