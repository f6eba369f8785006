package org.harmonymobile.core;

import java.io.IOException;
import java.util.List;
import java.util.UUID;
import org.harmonymobile.core.crypto.LabelTokens;
import org.harmonymobile.core.queue.QueueFullException;
import org.harmonymobile.core.queue.UploadQueue;
import org.harmonymobile.core.queue.UploadSender;
import org.harmonymobile.core.seal.AssociatedData;
import org.harmonymobile.core.seal.UploadSealer;
import org.harmonymobile.core.server.DeviceCredentials;
import org.harmonymobile.core.server.HarmonyServerClient;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.wire.FeatureTensor;
import org.harmonymobile.core.wire.UploadMetadata;
import org.harmonymobile.core.util.Immutable;
import org.harmonymobile.core.wire.UploadPlaintext;

/**
 * Uploads of samples whose label the user confirmed: class name -> token under the label epoch's key,
 * features + token -> plaintext, plaintext -> sealed envelope bound to (device, label epoch, message
 * id), stored in the durable queue, and sent when the network allows. Only sealed bytes ever touch
 * the disk.
 */
public final class ConfirmedUploads {
    private final UploadQueue queue;
    private final HarmonyServerClient server;
    private final DeviceCredentials device;
    private final String labelEpoch;
    private final List<String> classNames;
    private final LabelTokens tokens;
    private final UploadSealer sealer;
    private final String family;
    private final String tier;
    private final int splitDepth;
    private final String modelVersion;

    /**
     * @param labelEpoch the epoch uploads name (the enrolment response's or the manifest's)
     * @param classNames the verified manifest's class names; a confirmed class is an index into them
     */
    public ConfirmedUploads(UploadQueue queue, HarmonyServerClient server, DeviceCredentials device,
            FederationKey federationKey, String labelEpoch, List<String> classNames, String family, String tier,
            int splitDepth, String modelVersion) {
        this.queue = queue;
        this.server = server;
        this.device = device;
        this.labelEpoch = LabelTokens.checkLabelEpoch(labelEpoch);
        this.classNames = Immutable.list(classNames);
        this.tokens = federationKey.tokens(labelEpoch);
        this.sealer = new UploadSealer(device.serverPublicKey());
        this.family = family;
        this.tier = tier;
        this.splitDepth = splitDepth;
        this.modelVersion = modelVersion;
    }

    /** Seals and queues the features of one sample (shape (1, C, S, S)) with its confirmed class index. */
    public UploadQueue.EnqueueResult enqueue(FeatureTensor features, int confirmedClass)
            throws IOException, QueueFullException {
        if (confirmedClass < 0 || confirmedClass >= classNames.size()) {
            throw new IllegalArgumentException(
                    "class " + confirmedClass + " is not one of the manifest's " + classNames.size() + " classes");
        }
        UploadMetadata metadata = UploadMetadata.of(List.of(tokens.token(classNames.get(confirmedClass))),
                List.of(splitDepth), family, tier, modelVersion);
        byte[] plaintext = UploadPlaintext.encode(metadata, features);
        return queue.enqueue(messageId -> {
            AssociatedData ad = new AssociatedData(device.deviceId(), labelEpoch, UUID.fromString(messageId));
            return HarmonyServerClient.uploadBody(labelEpoch, messageId, sealer.seal(plaintext, ad));
        });
    }

    /** Sends what is queued, oldest first; stops at the first transient failure. Returns the number delivered. */
    public int flush() throws IOException {
        return queue.drain(upload -> {
            try {
                server.upload(device, upload);
                return UploadSender.Outcome.DELIVERED;
            } catch (ServerException e) {
                return isPermanent(e.status()) ? UploadSender.Outcome.REJECTED : UploadSender.Outcome.RETRY_LATER;
            }
        });
    }

    /**
     * Refusals that resending the same bytes cannot fix: malformed or failing authentication (400),
     * message id reused with other bytes (409), too large (413), invalid values (422). Everything
     * else (401/403 until re-enrolment, 404, 429, 5xx) keeps the upload for a later flush.
     */
    static boolean isPermanent(int status) {
        return status == 400 || status == 409 || status == 413 || status == 422;
    }

    public int pending() throws IOException {
        return queue.size();
    }
}
