package org.harmonymobile.core.engine;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.harmonymobile.core.wire.FeatureTensor;
import org.junit.jupiter.api.Test;

class SerializedEngineTest {
    /** Behaves like ExecuTorch's Module: destroy() while forward() runs is an error. */
    private static final class DestroyWhileRunningFails implements InferenceEngine {
        final AtomicBoolean running = new AtomicBoolean();
        final AtomicBoolean destroyed = new AtomicBoolean();
        final AtomicInteger closes = new AtomicInteger();
        final CountDownLatch started = new CountDownLatch(1);

        @Override
        public FrontEndOutput run(float[] input) {
            if (destroyed.get()) {
                throw new IllegalStateException("forward on a destroyed module");
            }
            running.set(true);
            started.countDown();
            try {
                Thread.sleep(200);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            running.set(false);
            return new FrontEndOutput(new float[] {1f}, new FeatureTensor(new float[] {0f}, new int[] {1, 1}));
        }

        @Override
        public void close() {
            if (running.get()) {
                throw new IllegalStateException("Module.destroy() while a method is executing");
            }
            destroyed.set(true);
            closes.incrementAndGet();
        }
    }

    @Test
    void closeDuringARunWaitsForItAndLaterRunsFailCleanly() throws Exception {
        DestroyWhileRunningFails inner = new DestroyWhileRunningFails();
        SerializedEngine engine = new SerializedEngine(inner);
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
            Future<FrontEndOutput> inference = pool.submit(() -> engine.run(new float[] {0f}));
            assertTrue(inner.started.await(5, TimeUnit.SECONDS));
            engine.close(); // the unserialized engine would throw here
            assertEquals(1, inference.get(5, TimeUnit.SECONDS).exitLogits().length);
            assertTrue(inner.destroyed.get());
            InferenceException e = assertThrows(InferenceException.class, () -> engine.run(new float[] {0f}));
            assertTrue(e.getMessage().contains("closed"));
            engine.close();
            assertEquals(1, inner.closes.get());
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    void withoutSerializationCloseDuringARunThrows() throws Exception {
        DestroyWhileRunningFails inner = new DestroyWhileRunningFails();
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
            Future<FrontEndOutput> inference = pool.submit(() -> inner.run(new float[] {0f}));
            assertTrue(inner.started.await(5, TimeUnit.SECONDS));
            assertThrows(IllegalStateException.class, inner::close);
            inference.get(5, TimeUnit.SECONDS);
            assertFalse(inner.destroyed.get());
        } finally {
            pool.shutdownNow();
        }
    }
}
