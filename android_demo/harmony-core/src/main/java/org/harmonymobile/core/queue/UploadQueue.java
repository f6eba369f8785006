package org.harmonymobile.core.queue;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.UUID;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;

/**
 * A bounded, file-backed FIFO of uploads that survives process death.
 *
 * <p><b>Durability.</b> Each entry is one file, written to a temporary name, forced to disk, then
 * atomically renamed to {@code <sequence>-<messageId>.upload}; the directory is forced too. So once
 * {@link #enqueue} returns, the upload survives a crash, and no reader ever sees half a file
 * (leftover temporary files are deleted on open). Files end with a CRC32; a corrupted file is moved
 * to {@code rejected/} rather than sent.
 *
 * <p><b>No duplicates, nothing lost.</b> The message id is assigned here, once, and handed to the
 * caller's body builder (it is bound into the sealed envelope's associated data). An entry is
 * deleted only after the server acknowledged it. A crash between the acknowledgement and the
 * deletion resends the same message id, which the server stores once: delivery is at least once,
 * storage exactly once.
 *
 * <p><b>Bounds.</b> At most {@code maxEntries} entries and {@code maxBytes} bytes of entry files
 * (body plus {@value #FILE_OVERHEAD_BYTES} bytes and the message id). When full,
 * {@link OverflowPolicy#REJECT_NEW} (the default) refuses the new upload with
 * {@link QueueFullException}, so nothing already accepted is ever dropped;
 * {@link OverflowPolicy#DROP_OLDEST} evicts the oldest entries instead (for apps that prefer fresh
 * data); evicted entries are gone, which the return value of enqueue reports.
 *
 * <p>Thread-safe within one process; one queue directory must be used by one process.
 */
public final class UploadQueue {
    public enum OverflowPolicy {
        REJECT_NEW,
        DROP_OLDEST
    }

    /** What enqueue did: the new entry and any entries evicted to make room. */
    public record EnqueueResult(PendingUpload upload, List<String> evictedMessageIds) {}

    static final String SUFFIX = ".upload";
    static final String TEMP_PREFIX = ".tmp-";
    static final String REJECTED_DIR = "rejected";
    private static final int MAGIC = 0x484d5131; // "HMQ1"
    private static final Pattern NAME = Pattern.compile("(\\d{19})-([A-Za-z0-9_-]{1,128})\\.upload");
    private static final Pattern MESSAGE_ID = Pattern.compile("[A-Za-z0-9_-]{1,128}");
    /** Header and checksum bytes of an entry file besides the message id and the body. */
    static final int FILE_OVERHEAD_BYTES = 4 + 8 + 8 + 4 + 4 + 8;

    private final Path directory;
    private final int maxEntries;
    private final long maxBytes;
    private final OverflowPolicy overflowPolicy;
    private long nextSequence;

    public UploadQueue(Path directory, int maxEntries, long maxBytes, OverflowPolicy overflowPolicy) throws IOException {
        if (maxEntries < 1 || maxBytes < 1) {
            throw new IllegalArgumentException("queue bounds must be positive");
        }
        this.directory = directory;
        this.maxEntries = maxEntries;
        this.maxBytes = maxBytes;
        this.overflowPolicy = overflowPolicy;
        Files.createDirectories(directory.resolve(REJECTED_DIR));
        deleteLeftoverTemporaryFiles();
        nextSequence = entryFiles().stream().mapToLong(UploadQueue::sequenceOf).max().orElse(0) + 1;
    }

    /** A random message id: a UUIDv4 in its canonical text form, as docs/PROTOCOL.md 4.1 asks. */
    public static String newMessageId() {
        return UUID.randomUUID().toString();
    }

    /**
     * Assigns a message id, builds the body with it and stores the entry durably.
     *
     * @param bodyForMessageId seals the upload for the given message id
     */
    public synchronized EnqueueResult enqueue(Function<String, byte[]> bodyForMessageId)
            throws IOException, QueueFullException {
        return enqueue(newMessageId(), bodyForMessageId);
    }

    synchronized EnqueueResult enqueue(String messageId, Function<String, byte[]> bodyForMessageId)
            throws IOException, QueueFullException {
        if (!MESSAGE_ID.matcher(messageId).matches()) {
            throw new IllegalArgumentException("message ids are 1-128 characters of [A-Za-z0-9_-]: " + messageId);
        }
        byte[] body = bodyForMessageId.apply(messageId);
        long size = FILE_OVERHEAD_BYTES + messageId.length() + body.length;
        if (size > maxBytes) {
            throw new QueueFullException("an upload of " + body.length + " bytes exceeds the queue's " + maxBytes + " bytes");
        }
        List<Path> files = entryFiles();
        long bytes = totalFileBytes(files);
        List<String> evicted = new ArrayList<>();
        while (files.size() + 1 > maxEntries || bytes + size > maxBytes) {
            if (overflowPolicy == OverflowPolicy.REJECT_NEW) {
                throw new QueueFullException("upload queue full: " + files.size() + " entries, " + bytes + " bytes (limits "
                        + maxEntries + " entries, " + maxBytes + " bytes)");
            }
            Path oldest = files.remove(0);
            bytes -= fileBytesOf(oldest);
            evicted.add(messageIdOf(oldest));
            Files.deleteIfExists(oldest);
        }
        PendingUpload upload = new PendingUpload(nextSequence++, messageId, body, System.currentTimeMillis());
        writeDurably(upload);
        return new EnqueueResult(upload, evicted);
    }

    /** Entries in queue order. */
    public synchronized List<PendingUpload> pending() throws IOException {
        List<PendingUpload> out = new ArrayList<>();
        for (Path file : entryFiles()) {
            PendingUpload upload = read(file);
            if (upload != null) {
                out.add(upload);
            }
        }
        return out;
    }

    public synchronized int size() throws IOException {
        return entryFiles().size();
    }

    /** Removes an entry after the server acknowledged it; unknown ids are ignored (already removed). */
    public synchronized void acknowledge(String messageId) throws IOException {
        for (Path file : entryFiles()) {
            if (messageIdOf(file).equals(messageId)) {
                Files.delete(file);
                forceDirectory();
            }
        }
    }

    /**
     * Sends entries in order until the queue is empty or the sender says to retry later.
     *
     * @return the number of entries delivered
     */
    public synchronized int drain(UploadSender sender) throws IOException {
        int delivered = 0;
        for (PendingUpload upload : pending()) {
            UploadSender.Outcome outcome;
            try {
                outcome = sender.send(upload);
            } catch (IOException networkDown) {
                return delivered;
            }
            switch (outcome) {
                case DELIVERED -> {
                    acknowledge(upload.messageId());
                    delivered++;
                }
                case REJECTED -> moveToRejected(fileFor(upload));
                case RETRY_LATER -> {
                    return delivered;
                }
            }
        }
        return delivered;
    }

    /** Uploads the server refused for good, kept for diagnosis, never resent. */
    public synchronized int rejectedCount() throws IOException {
        try (var stream = Files.list(directory.resolve(REJECTED_DIR))) {
            return (int) stream.count();
        }
    }

    // ------------------------------------------------------------------ files

    private Path fileFor(PendingUpload upload) {
        return directory.resolve(String.format("%019d-%s%s", upload.sequence(), upload.messageId(), SUFFIX));
    }

    private void writeDurably(PendingUpload upload) throws IOException {
        byte[] id = upload.messageId().getBytes(StandardCharsets.US_ASCII);
        ByteBuffer buffer = ByteBuffer.allocate(4 + 8 + 8 + 4 + id.length + 4 + upload.body().length + 8);
        buffer.putInt(MAGIC).putLong(upload.sequence()).putLong(upload.enqueuedAtMillis());
        buffer.putInt(id.length).put(id).putInt(upload.body().length).put(upload.body());
        CRC32 crc = new CRC32();
        crc.update(buffer.array(), 0, buffer.position());
        buffer.putLong(crc.getValue());
        buffer.flip();

        Path temp = directory.resolve(TEMP_PREFIX + upload.messageId());
        try (FileChannel channel = FileChannel.open(temp, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING)) {
            while (buffer.hasRemaining()) {
                channel.write(buffer);
            }
            channel.force(true);
        }
        try {
            Files.move(temp, fileFor(upload), StandardCopyOption.ATOMIC_MOVE);
        } catch (AtomicMoveNotSupportedException e) {
            Files.deleteIfExists(temp);
            throw new IOException("the queue directory's file system cannot rename atomically", e);
        }
        forceDirectory();
    }

    /** Reads and checks an entry file; a corrupted one is moved to rejected/ and skipped. */
    private PendingUpload read(Path file) throws IOException {
        byte[] bytes = Files.readAllBytes(file);
        try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes))) {
            if (bytes.length < 36 || in.readInt() != MAGIC) {
                throw new IOException("bad header");
            }
            long sequence = in.readLong();
            long enqueuedAt = in.readLong();
            byte[] id = new byte[in.readInt()];
            in.readFully(id);
            int bodyLength = in.readInt();
            if (bodyLength < 0 || bodyLength > bytes.length) {
                throw new IOException("bad body length");
            }
            byte[] body = new byte[bodyLength];
            in.readFully(body);
            long storedCrc = in.readLong();
            CRC32 crc = new CRC32();
            crc.update(bytes, 0, bytes.length - 8);
            String messageId = new String(id, StandardCharsets.US_ASCII);
            if (storedCrc != crc.getValue() || sequence != sequenceOf(file) || !messageId.equals(messageIdOf(file))) {
                throw new IOException("checksum or name mismatch");
            }
            return new PendingUpload(sequence, messageId, body, enqueuedAt);
        } catch (IOException corrupted) {
            moveToRejected(file);
            return null;
        }
    }

    private void moveToRejected(Path file) throws IOException {
        Files.move(file, directory.resolve(REJECTED_DIR).resolve(file.getFileName()), StandardCopyOption.ATOMIC_MOVE,
                StandardCopyOption.REPLACE_EXISTING);
        forceDirectory();
    }

    private List<Path> entryFiles() throws IOException {
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(directory, "*" + SUFFIX)) {
            for (Path file : stream) {
                if (NAME.matcher(file.getFileName().toString()).matches()) {
                    files.add(file);
                }
            }
        }
        files.sort(Comparator.comparingLong(UploadQueue::sequenceOf));
        return files;
    }

    private long totalFileBytes(List<Path> files) {
        return files.stream().mapToLong(this::fileBytesOf).sum();
    }

    private long fileBytesOf(Path file) {
        try {
            return Files.size(file);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private void deleteLeftoverTemporaryFiles() throws IOException {
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(directory, TEMP_PREFIX + "*")) {
            for (Path temp : stream) {
                Files.deleteIfExists(temp);
            }
        }
    }

    /** Makes a rename durable (fsync of the directory); a no-op where the platform cannot open directories. */
    private void forceDirectory() {
        try (FileChannel channel = FileChannel.open(directory, StandardOpenOption.READ)) {
            channel.force(true);
        } catch (IOException | UnsupportedOperationException notSupported) {
            // Windows cannot open a directory; Linux and Android can.
        }
    }

    private static long sequenceOf(Path file) {
        return Long.parseLong(match(file).group(1));
    }

    private static String messageIdOf(Path file) {
        return match(file).group(2);
    }

    private static Matcher match(Path file) {
        Matcher m = NAME.matcher(file.getFileName().toString());
        if (!m.matches()) {
            throw new IllegalStateException("not a queue entry: " + file);
        }
        return m;
    }
}
