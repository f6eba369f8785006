// swift-tools-version:5.9
//
// HarmonyKitExecuTorch: `ExecuTorchEngine`, HarmonyKit's `InferenceEngine` on an ExecuTorch `.pte`.
// A package of its own so that HarmonyKit (iOS 16, no dependencies) builds and tests without the
// ExecuTorch binaries, and because the ExecuTorch package requires iOS 17.
//
// Link the app with `-all_load` (OTHER_LDFLAGS): ExecuTorch backends and kernels register
// themselves from static initializers that the linker otherwise drops (docs/source/using-executorch-ios.md).
import PackageDescription

/// The ExecuTorch release whose runtime matches the `executorch` wheel that writes the .pte files
/// (1.5.1 in this repository's .venv; Android uses org.pytorch:executorch-android:1.5.1). Branch
/// names follow the ExecuTorch convention "swiftpm-<version>" (nightlies: "swiftpm-<version>.<yyyymmdd>").
let executorchBranch = "swiftpm-1.5.1"

let package = Package(
    name: "HarmonyKitExecuTorch",
    platforms: [
        .iOS(.v17),
        .macOS(.v13),
    ],
    products: [
        .library(name: "HarmonyKitExecuTorch", targets: ["HarmonyKitExecuTorch"]),
    ],
    dependencies: [
        .package(path: "../HarmonyKit"),
        .package(url: "https://github.com/pytorch/executorch.git", branch: executorchBranch),
    ],
    targets: [
        .target(
            name: "HarmonyKitExecuTorch",
            dependencies: [
                .product(name: "HarmonyKit", package: "HarmonyKit"),
                .product(name: "executorch", package: "executorch"),
                .product(name: "backend_xnnpack", package: "executorch"),
                .product(name: "kernels_optimized", package: "executorch"),
                .product(name: "kernels_quantized", package: "executorch"),
            ],
            path: "Sources/HarmonyKitExecuTorch"
        ),
    ]
)
