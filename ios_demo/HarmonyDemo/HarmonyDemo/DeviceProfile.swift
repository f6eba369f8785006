import Foundation
import HarmonyKit

/// What this iPhone offers the tier selector.
enum DeviceProfile {
    static func current() -> DeviceCapabilities {
        let ramMB = Int64(ProcessInfo.processInfo.physicalMemory / (1024 * 1024))
        return DeviceCapabilities(
            platform: .ios,
            totalRAMMB: max(1, ramMB),
            bigCores: performanceCores(),
            hasNPU: hasNeuralEngine,
            osVersion: ProcessInfo.processInfo.operatingSystemVersion.majorVersion)
    }

    /// Performance cores (`hw.perflevel0.physicalcpu` on Apple silicon), else a third of the cores.
    static func performanceCores() -> Int {
        var count: Int32 = 0
        var size = MemoryLayout<Int32>.size
        if sysctlbyname("hw.perflevel0.physicalcpu", &count, &size, nil, 0) == 0, count > 0 {
            return Int(count)
        }
        return max(1, ProcessInfo.processInfo.activeProcessorCount / 3)
    }

    /// Every device that runs iOS 17 has an A12 or later, whose Neural Engine Core ML uses; the
    /// Simulator has none.
    static var hasNeuralEngine: Bool {
        #if targetEnvironment(simulator)
        return false
        #else
        return true
        #endif
    }
}
