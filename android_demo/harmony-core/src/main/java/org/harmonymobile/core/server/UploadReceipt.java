package org.harmonymobile.core.server;

/** The server's acknowledgement of a stored upload; duplicate = a replay of an already stored message id. */
public record UploadReceipt(long uploadId, String messageId, int rows, boolean duplicate) {}
