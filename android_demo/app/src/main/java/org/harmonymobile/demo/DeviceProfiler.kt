package org.harmonymobile.demo

import android.app.ActivityManager
import android.content.Context
import android.os.Build
import java.io.File
import org.harmonymobile.core.tier.DeviceCapabilities

/** Reads what [org.harmonymobile.core.tier.TierSelector] needs from the running phone. */
object DeviceProfiler {

    fun capabilities(context: Context): DeviceCapabilities {
        val activityManager = context.getSystemService(ActivityManager::class.java)
        val memory = ActivityManager.MemoryInfo().also { activityManager.getMemoryInfo(it) }
        return DeviceCapabilities(
            DeviceCapabilities.ANDROID,
            memory.totalMem / (1024 * 1024),
            bigCores(),
            hasNpu(),
            Build.VERSION.SDK_INT,
            activityManager.isLowRamDevice,
        )
    }

    /**
     * Cores faster than the slowest cluster, from cpufreq's maximum frequencies; on a homogeneous CPU
     * (or when /sys is unreadable) every core counts as big.
     */
    private fun bigCores(): Int {
        val frequencies = File("/sys/devices/system/cpu").listFiles { f -> f.name.matches(Regex("cpu\\d+")) }
            .orEmpty()
            .mapNotNull { File(it, "cpufreq/cpuinfo_max_freq").takeIf(File::canRead)?.readText()?.trim()?.toLongOrNull() }
        if (frequencies.isEmpty()) {
            return Runtime.getRuntime().availableProcessors()
        }
        val slowest = frequencies.min()
        val big = frequencies.count { it > slowest }
        return if (big == 0) frequencies.size else big
    }

    /**
     * A coarse hint only (it moves a phone between the mid and flagship classes): SoCs whose vendors ship
     * an NPU in their flagship lines. The exported `.pte` runs on XNNPACK (CPU) either way.
     */
    private fun hasNpu(): Boolean {
        val soc = (Build.SOC_MANUFACTURER + " " + Build.SOC_MODEL).lowercase()
        return listOf("google", "tensor", "sm8", "qualcomm", "mt69", "s5e9").any { soc.contains(it) }
    }
}
