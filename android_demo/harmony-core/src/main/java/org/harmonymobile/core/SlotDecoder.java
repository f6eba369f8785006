package org.harmonymobile.core;

import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.harmonymobile.core.server.ServerException;
import org.harmonymobile.core.server.ServerPrediction;
import org.harmonymobile.core.server.SlotTable;
import org.harmonymobile.core.util.Immutable;

/**
 * Turns the server's top slot into one of this phone's classes (docs/ALGORITHM.md, "Inference"): the
 * token of every class name of the verified manifest under the slot table's label-epoch key is
 * looked up in the table. The decoded table of each back-end version is kept; an answer from a
 * version this phone has no table for makes it fetch that version's table first (V2 model metadata).
 */
public final class SlotDecoder {
    /** Where the slot table of a version comes from (the server's V2 model metadata, or a fake). */
    @FunctionalInterface
    public interface SlotTableSource {
        SlotTable slotTable(String modelVersion) throws IOException, ServerException;
    }

    private final FederationKey federationKey;
    private final List<String> classNames;
    private final SlotTableSource source;
    private final Map<String, List<String>> classesByVersion = new ConcurrentHashMap<>();

    public SlotDecoder(FederationKey federationKey, List<String> classNames, SlotTableSource source) {
        this.federationKey = federationKey;
        this.classNames = Immutable.list(classNames);
        this.source = source;
    }

    /** Records a table the phone already holds (enrolment response, manifest), so no fetch is needed. */
    public void remember(String modelVersion, SlotTable table) {
        if (modelVersion != null && table != null) {
            classesByVersion.put(modelVersion, decode(table));
        }
    }

    /** The class name of each slot of {@code table} (null for a slot no class of this phone has). */
    public List<String> decode(SlotTable table) {
        return federationKey.tokens(table.labelEpoch()).slotClasses(classNames, table.tokens());
    }

    /**
     * The index in the manifest's class names of the prediction's top slot, or -1 when that slot names
     * none of this phone's classes (the caller then keeps its local answer).
     */
    public int classIndex(ServerPrediction prediction) throws IOException, ServerException {
        List<String> classes = classesByVersion.get(prediction.modelVersion());
        if (classes == null) {
            SlotTable table = source.slotTable(prediction.modelVersion());
            if (table == null) {
                throw new IOException("the server has no slot table for version " + prediction.modelVersion());
            }
            classes = decode(table);
            classesByVersion.put(prediction.modelVersion(), classes);
        }
        int slot = prediction.topSlot();
        if (slot < 0 || slot >= classes.size() || classes.get(slot) == null) {
            return -1;
        }
        return classNames.indexOf(classes.get(slot));
    }
}
