package org.harmonymobile.demo

import org.harmonymobile.core.engine.FrontEndOutput
import org.harmonymobile.core.engine.InferenceEngine
import org.harmonymobile.core.engine.InferenceException
import org.harmonymobile.core.manifest.TierEntry
import org.harmonymobile.core.wire.FeatureTensor
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor

/**
 * [InferenceEngine] on ExecuTorch (`org.pytorch:executorch-android`): one tier's exported front-end,
 * whose `forward` takes the normalized image (1, C, H, W) and returns `(exit_logits, features)` in the
 * order the manifest's `outputs` lists them.
 */
class ExecuTorchEngine(modelPath: String, tier: TierEntry) : InferenceEngine {
    private val inputShape: LongArray = tier.input().shape()
    private val inputSize: Int = tier.input().elementsPerSample()
    private val logitsIndex: Int = outputIndex(tier, "exit_logits")
    private val featuresIndex: Int = outputIndex(tier, "features")

    // Memory-mapped: the .pte stays in the page cache instead of the Java heap.
    private val module: Module = Module.load(modelPath, Module.LOAD_MODE_MMAP)

    init {
        module.loadMethod("forward") // pay the method-loading cost now, not on the first image
    }

    override fun run(input: FloatArray): FrontEndOutput {
        if (input.size != inputSize) {
            throw InferenceException("input has ${input.size} values; the tier expects $inputSize")
        }
        val outputs: Array<EValue> = try {
            module.forward(EValue.from(Tensor.fromBlob(input, inputShape)))
        } catch (e: RuntimeException) {
            throw InferenceException("ExecuTorch forward failed: ${e.message}", e)
        }
        if (outputs.size <= maxOf(logitsIndex, featuresIndex)) {
            throw InferenceException("the .pte returned ${outputs.size} outputs; the manifest lists exit_logits and features")
        }
        val logits = outputs[logitsIndex].toTensor().dataAsFloatArray
        val features = outputs[featuresIndex].toTensor()
        val shape = features.shape().map { it.toInt() }.toIntArray()
        return FrontEndOutput(logits, FeatureTensor(features.dataAsFloatArray, shape))
    }

    override fun close() {
        module.destroy()
    }

    private companion object {
        fun outputIndex(tier: TierEntry, name: String): Int {
            val index = tier.outputs().indexOfFirst { it.name() == name }
            require(index >= 0) { "tier ${tier.name()} has no output named $name" }
            return index
        }
    }
}
