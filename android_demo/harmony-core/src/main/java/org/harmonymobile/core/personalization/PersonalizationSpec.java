package org.harmonymobile.core.personalization;

import java.util.List;
import org.harmonymobile.core.json.JsonObject;
import org.harmonymobile.core.util.Immutable;

/**
 * A tier's {@code personalization} object of the signed manifest (export/manifest.py
 * {@code Personalization}): which programs to load (each checked against its sha256 and size like
 * any artifact, after the manifest's signature verified), the rows of a training step, the width of
 * {@code exit_hidden}, the trained parameters in the head program's input order, the SGD learning
 * rate and the calibration target of tau. Only {@code exit_positions} labels are accepted.
 */
public record PersonalizationSpec(
        ProgramFile frozenProgram,
        ProgramFile trainingProgram,
        ProgramFile headProgram,
        String method,
        int batch,
        int hidden,
        List<String> parameterNames,
        double learningRate,
        Double calibrationTarget) {

    /** One program file of the export: path relative to it, sha256 (lowercase hex) and size. */
    public record ProgramFile(String path, String sha256, long size) {
        static ProgramFile of(JsonObject json) {
            return new ProgramFile(json.getString("path"), json.getString("sha256"), json.getLong("size"));
        }
    }

    public PersonalizationSpec {
        if (batch < 1 || hidden < 1) {
            throw new IllegalArgumentException("batch and hidden must be >= 1, got " + batch + " and " + hidden);
        }
        if (!(learningRate > 0) || Double.isInfinite(learningRate)) {
            throw new IllegalArgumentException("the learning rate must be a finite number > 0, got " + learningRate);
        }
        parameterNames = Immutable.list(parameterNames);
    }

    /** The tier's {@code personalization} object; refuses labels other than exit positions. */
    public static PersonalizationSpec fromJson(JsonObject json) {
        String labels = json.getString("labels");
        if (!labels.equals("exit_positions")) {
            throw new IllegalArgumentException("personalization labels must be exit_positions, the manifest says " + labels);
        }
        return new PersonalizationSpec(
                ProgramFile.of(json.getObject("frozen_program")),
                ProgramFile.of(json.getObject("training_program")),
                ProgramFile.of(json.getObject("head_program")),
                json.getString("method"),
                json.getInt("batch"),
                json.getInt("hidden"),
                json.getStringList("parameter_names"),
                json.getDouble("learning_rate"),
                json.get("calibration_target") == null ? null : json.getDouble("calibration_target"));
    }
}
