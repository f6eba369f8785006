package org.harmonymobile.core.tier;

/**
 * What the tier selector needs to know about a phone. On Android the app fills it from
 * {@code ActivityManager.MemoryInfo.totalMem}, {@code isLowRamDevice()}, the CPU max frequencies
 * under /sys/devices/system/cpu (cores above the median frequency count as big), the presence of
 * an NPU delegate, and {@code Build.VERSION.SDK_INT}.
 *
 * @param platform {@link #ANDROID} or {@link #IOS}
 * @param totalRamMb physical memory in MiB
 * @param bigCores number of performance cores
 * @param hasNpu an NPU / Apple Neural Engine the exported backends can use
 * @param osApiLevel Android API level (SDK_INT); for iOS the major OS version
 * @param lowRamDevice Android's {@code ActivityManager.isLowRamDevice()}
 */
public record DeviceCapabilities(
        String platform, long totalRamMb, int bigCores, boolean hasNpu, int osApiLevel, boolean lowRamDevice) {
    public static final String ANDROID = "android";
    public static final String IOS = "ios";

    public DeviceCapabilities {
        if (!ANDROID.equals(platform) && !IOS.equals(platform)) {
            throw new IllegalArgumentException("platform must be android or ios, got " + platform);
        }
        if (totalRamMb <= 0 || bigCores < 0) {
            throw new IllegalArgumentException("RAM must be positive and big cores non-negative");
        }
    }
}
