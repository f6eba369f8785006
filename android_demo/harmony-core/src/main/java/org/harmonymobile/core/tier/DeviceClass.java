package org.harmonymobile.core.tier;

/**
 * Coarse device classes, from capabilities. Thresholds (documented in the README):
 *
 * <ul>
 *   <li>ENTRY: a low-RAM device, under 3 GiB of RAM, no big core, or Android below API 29;
 *   <li>FLAGSHIP: at least 6 GiB of RAM, at least 2 big cores and an NPU;
 *   <li>MID: everything in between.
 * </ul>
 */
public enum DeviceClass {
    ENTRY(1.5),
    MID(4.0),
    FLAGSHIP(Double.POSITIVE_INFINITY);

    static final long ENTRY_MAX_RAM_MB = 3 * 1024 - 1;
    static final long FLAGSHIP_MIN_RAM_MB = 6 * 1024 - 512; // "6 GB" phones report a little under 6 GiB
    static final int ENTRY_MAX_ANDROID_API = 28;

    /** The largest {@link org.harmonymobile.core.manifest.TierEntry#relativeCost()} a class of phone runs. */
    public final double maxRelativeCost;

    DeviceClass(double maxRelativeCost) {
        this.maxRelativeCost = maxRelativeCost;
    }

    public static DeviceClass of(DeviceCapabilities device) {
        boolean oldAndroid =
                DeviceCapabilities.ANDROID.equals(device.platform()) && device.osApiLevel() <= ENTRY_MAX_ANDROID_API;
        if (device.lowRamDevice() || device.totalRamMb() <= ENTRY_MAX_RAM_MB || device.bigCores() == 0 || oldAndroid) {
            return ENTRY;
        }
        if (device.totalRamMb() >= FLAGSHIP_MIN_RAM_MB && device.bigCores() >= 2 && device.hasNpu()) {
            return FLAGSHIP;
        }
        return MID;
    }
}
