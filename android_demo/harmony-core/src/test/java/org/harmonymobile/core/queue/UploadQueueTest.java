package org.harmonymobile.core.queue;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class UploadQueueTest {
    @TempDir
    Path dir;

    private UploadQueue open(int maxEntries, UploadQueue.OverflowPolicy policy) throws IOException {
        return new UploadQueue(dir, maxEntries, 1 << 20, policy);
    }

    private static byte[] body(String messageId) {
        return ("sealed for " + messageId).getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void entriesSurviveARestartInOrderWithTheirMessageIds() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        List<String> ids = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            ids.add(queue.enqueue(UploadQueueTest::body).upload().messageId());
        }
        UploadQueue reopened = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        List<PendingUpload> pending = reopened.pending();
        assertEquals(ids, pending.stream().map(PendingUpload::messageId).toList());
        for (PendingUpload upload : pending) {
            UUID.fromString(upload.messageId()); // canonical UUID text, as the protocol asks
            assertArrayEquals(body(upload.messageId()), upload.body());
        }
        String next = reopened.enqueue(UploadQueueTest::body).upload().messageId();
        assertTrue(reopened.pending().get(3).sequence() > pending.get(2).sequence());
        assertEquals(next, reopened.pending().get(3).messageId());
    }

    @Test
    void retriesResendTheSameMessageIdAndTheServerStoresOnce() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        String id = queue.enqueue(UploadQueueTest::body).upload().messageId();
        Map<String, byte[]> serverStore = new HashMap<>();
        List<String> attempts = new ArrayList<>();

        // 1st drain: the network fails. 2nd: the server stores it but the answer is lost (crash / timeout),
        // so the entry stays. 3rd, after a "restart": same id again; the idempotent server acknowledges.
        assertEquals(0, queue.drain(u -> {
            attempts.add(u.messageId());
            throw new IOException("network down");
        }));
        assertEquals(0, queue.drain(u -> {
            attempts.add(u.messageId());
            serverStore.putIfAbsent(u.messageId(), u.body());
            return UploadSender.Outcome.RETRY_LATER;
        }));
        UploadQueue restarted = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        assertEquals(1, restarted.drain(u -> {
            attempts.add(u.messageId());
            serverStore.putIfAbsent(u.messageId(), u.body());
            return UploadSender.Outcome.DELIVERED;
        }));
        assertEquals(List.of(id, id, id), attempts);
        assertEquals(1, serverStore.size());
        assertEquals(0, restarted.size());
        assertEquals(0, open(10, UploadQueue.OverflowPolicy.REJECT_NEW).size());
    }

    @Test
    void drainStopsAtTheFirstTransientFailureAndKeepsOrder() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        for (int i = 0; i < 4; i++) {
            queue.enqueue(UploadQueueTest::body);
        }
        List<String> ids = queue.pending().stream().map(PendingUpload::messageId).toList();
        int[] calls = {0};
        int delivered = queue.drain(u -> ++calls[0] <= 2 ? UploadSender.Outcome.DELIVERED : UploadSender.Outcome.RETRY_LATER);
        assertEquals(2, delivered);
        assertEquals(3, calls[0]);
        assertEquals(ids.subList(2, 4), queue.pending().stream().map(PendingUpload::messageId).toList());
    }

    @Test
    void permanentlyRejectedUploadsAreSetAsideNotResent() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        queue.enqueue(UploadQueueTest::body);
        queue.enqueue(UploadQueueTest::body);
        int[] calls = {0};
        assertEquals(1, queue.drain(u -> ++calls[0] == 1 ? UploadSender.Outcome.REJECTED : UploadSender.Outcome.DELIVERED));
        assertEquals(0, queue.size());
        assertEquals(1, queue.rejectedCount());
    }

    @Test
    void fullQueueRefusesNewUploadsAndKeepsAcceptedOnes() throws Exception {
        UploadQueue queue = open(2, UploadQueue.OverflowPolicy.REJECT_NEW);
        String first = queue.enqueue(UploadQueueTest::body).upload().messageId();
        queue.enqueue(UploadQueueTest::body);
        assertThrows(QueueFullException.class, () -> queue.enqueue(UploadQueueTest::body));
        assertEquals(2, queue.size());
        assertEquals(first, queue.pending().get(0).messageId());
        queue.acknowledge(first);
        queue.enqueue(UploadQueueTest::body);
        assertEquals(2, queue.size());
    }

    @Test
    void dropOldestEvictsAndReportsWhatWasDropped() throws Exception {
        UploadQueue queue = open(2, UploadQueue.OverflowPolicy.DROP_OLDEST);
        String first = queue.enqueue(UploadQueueTest::body).upload().messageId();
        String second = queue.enqueue(UploadQueueTest::body).upload().messageId();
        UploadQueue.EnqueueResult third = queue.enqueue(UploadQueueTest::body);
        assertEquals(List.of(first), third.evictedMessageIds());
        assertEquals(List.of(second, third.upload().messageId()),
                queue.pending().stream().map(PendingUpload::messageId).toList());
    }

    @Test
    void byteBoundCountsTheEntryFiles() throws Exception {
        long oneEntry = UploadQueue.FILE_OVERHEAD_BYTES + 36 + 100;
        UploadQueue queue = new UploadQueue(dir, 100, oneEntry * 2, UploadQueue.OverflowPolicy.REJECT_NEW);
        queue.enqueue(id -> new byte[100]);
        queue.enqueue(id -> new byte[100]);
        assertThrows(QueueFullException.class, () -> queue.enqueue(id -> new byte[1]));
        assertThrows(QueueFullException.class,
                () -> new UploadQueue(dir.resolve("other"), 100, 10, UploadQueue.OverflowPolicy.DROP_OLDEST)
                        .enqueue(id -> new byte[100]));
    }

    @Test
    void leftoverTemporaryFilesFromACrashAreIgnoredAndRemoved() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        queue.enqueue(UploadQueueTest::body);
        Files.write(dir.resolve(UploadQueue.TEMP_PREFIX + "half-written"), new byte[] {1, 2, 3});
        UploadQueue reopened = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        assertEquals(1, reopened.size());
        try (Stream<Path> files = Files.list(dir)) {
            assertTrue(files.noneMatch(p -> p.getFileName().toString().startsWith(UploadQueue.TEMP_PREFIX)));
        }
    }

    @Test
    void corruptedEntriesAreSetAsideInsteadOfSent() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        queue.enqueue(UploadQueueTest::body);
        String good = queue.enqueue(UploadQueueTest::body).upload().messageId();
        Path firstFile;
        try (Stream<Path> files = Files.list(dir)) {
            firstFile = files.filter(p -> p.toString().endsWith(UploadQueue.SUFFIX)).sorted().findFirst().orElseThrow();
        }
        byte[] bytes = Files.readAllBytes(firstFile);
        bytes[bytes.length / 2] ^= 0x55;
        Files.write(firstFile, bytes);
        List<PendingUpload> pending = open(10, UploadQueue.OverflowPolicy.REJECT_NEW).pending();
        assertEquals(List.of(good), pending.stream().map(PendingUpload::messageId).toList());
        assertEquals(1, queue.rejectedCount());
    }

    @Test
    void messageIdsAreAssignedOnceAndBoundIntoTheBody() throws Exception {
        UploadQueue queue = open(10, UploadQueue.OverflowPolicy.REJECT_NEW);
        List<String> seen = new ArrayList<>();
        PendingUpload upload = queue.enqueue(id -> {
            seen.add(id);
            return body(id);
        }).upload();
        assertEquals(List.of(upload.messageId()), seen);
        assertThrows(IllegalArgumentException.class, () -> queue.enqueue("../escape", UploadQueueTest::body));
        queue.acknowledge("not-there"); // unknown ids are ignored
        assertEquals(1, queue.size());
    }
}
