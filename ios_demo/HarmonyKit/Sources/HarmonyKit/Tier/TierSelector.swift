import Foundation

public enum Platform: String, Sendable, Codable {
    case android
    case ios
}

/// What the tier selector needs to know about a phone. On iOS `DeviceProfile.current()` (in the
/// demo app) fills it from `ProcessInfo.physicalMemory`, the performance-core count
/// (`hw.perflevel0.physicalcpu`) and the OS version; every iPhone that runs iOS 17 has a Neural
/// Engine that Core ML uses (A12 or later).
public struct DeviceCapabilities: Sendable, Equatable {
    public let platform: Platform
    public let totalRAMMB: Int64
    public let bigCores: Int
    public let hasNPU: Bool
    /// Android API level (SDK_INT), or the iOS major version.
    public let osVersion: Int
    /// Android's `ActivityManager.isLowRamDevice()`; false on iOS.
    public let lowRAMDevice: Bool

    public init(platform: Platform, totalRAMMB: Int64, bigCores: Int, hasNPU: Bool, osVersion: Int, lowRAMDevice: Bool = false) {
        precondition(totalRAMMB > 0 && bigCores >= 0, "RAM must be positive and big cores non-negative")
        self.platform = platform
        self.totalRAMMB = totalRAMMB
        self.bigCores = bigCores
        self.hasNPU = hasNPU
        self.osVersion = osVersion
        self.lowRAMDevice = lowRAMDevice
    }
}

/// Coarse device classes (the same thresholds as harmony-core's `DeviceClass`):
///
/// * entry: a low-RAM device, at most 3 GiB - 1 MiB of RAM, no big core, or Android API <= 28;
/// * flagship: at least 6 GiB - 512 MiB of RAM ("6 GB" phones report a little less), at least two
///   big cores, and an NPU;
/// * mid: everything in between.
public enum DeviceClass: String, Sendable, CaseIterable {
    case entry
    case mid
    case flagship

    static let entryMaxRAMMB: Int64 = 3 * 1024 - 1
    static let flagshipMinRAMMB: Int64 = 6 * 1024 - 512
    static let entryMaxAndroidAPI = 28

    /// The largest `TierEntry.relativeCost` a class of phone runs.
    public var maxRelativeCost: Double {
        switch self {
        case .entry: return 1.5
        case .mid: return 4.0
        case .flagship: return .infinity
        }
    }

    public static func of(_ device: DeviceCapabilities) -> DeviceClass {
        let oldAndroid = device.platform == .android && device.osVersion <= entryMaxAndroidAPI
        if device.lowRAMDevice || device.totalRAMMB <= entryMaxRAMMB || device.bigCores == 0 || oldAndroid {
            return .entry
        }
        if device.totalRAMMB >= flagshipMinRAMMB && device.bigCores >= 2 && device.hasNPU {
            return .flagship
        }
        return .mid
    }
}

public struct TierSelectionError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// Picks the tier a phone runs: the most expensive tier (by `relativeCost`) that its `DeviceClass`
/// affords and that has an artifact for a backend of its platform; if none is affordable, the
/// cheapest runnable one.
///
/// Ties in cost prefer (1) tiers whose backends all run on this platform, (2) on iOS with a Neural
/// Engine, tiers with a Core ML artifact, (3) the smaller name, so the answer is deterministic.
public enum TierSelector {
    public static let androidBackends: Set<String> = [Artifact.backendXNNPACK]
    public static let iosBackends: Set<String> = [Artifact.backendXNNPACK, Artifact.backendCoreML]

    public static func backends(of device: DeviceCapabilities) -> Set<String> {
        device.platform == .android ? androidBackends : iosBackends
    }

    /// The tiers this device can run at all (an artifact for one of its backends), in manifest order.
    public static func runnableTiers(_ tiers: [TierEntry], on device: DeviceCapabilities) -> [TierEntry] {
        let runnable = backends(of: device)
        return tiers.filter { tier in tier.artifacts.contains { runnable.contains($0.backend) } }
    }

    public static func select(from tiers: [TierEntry], for device: DeviceCapabilities) throws -> TierEntry {
        let runnable = backends(of: device)
        let candidates = runnableTiers(tiers, on: device)
        guard !candidates.isEmpty else {
            throw TierSelectionError(
                description: "no tier has an artifact for backends \(runnable.sorted()) of \(device.platform.rawValue)")
        }
        let budget = DeviceClass.of(device).maxRelativeCost
        let preferCoreML = device.platform == .ios && device.hasNPU

        /// true when `a` is less preferred than `b`.
        func lessPreferred(_ a: TierEntry, _ b: TierEntry) -> Bool {
            if a.relativeCost != b.relativeCost {
                return a.relativeCost < b.relativeCost
            }
            let aNative = Set(a.backends).isSubset(of: runnable)
            let bNative = Set(b.backends).isSubset(of: runnable)
            if aNative != bNative {
                return !aNative
            }
            let aCoreML = preferCoreML && a.backends.contains(Artifact.backendCoreML)
            let bCoreML = preferCoreML && b.backends.contains(Artifact.backendCoreML)
            if aCoreML != bCoreML {
                return !aCoreML
            }
            return a.name > b.name
        }

        let affordable = candidates.filter { $0.relativeCost <= budget }
        if let best = affordable.max(by: lessPreferred) {
            return best
        }
        let cheapest = candidates.map(\.relativeCost).min()!
        return candidates.filter { $0.relativeCost == cheapest }.max(by: lessPreferred)!
    }
}
