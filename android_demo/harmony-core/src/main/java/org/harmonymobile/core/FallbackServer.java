package org.harmonymobile.core;

import java.io.IOException;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.server.ServerPrediction;
import org.harmonymobile.core.wire.FeatureTensor;

/** Where a low-confidence sample's features go: the server back-end, or a fake in tests. */
@FunctionalInterface
public interface FallbackServer {
    ServerPrediction predict(FeatureTensor features) throws IOException, ServerException;
}
