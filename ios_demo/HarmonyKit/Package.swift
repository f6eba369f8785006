// swift-tools-version:5.9
//
// HarmonyKit: the phone side of harmony-mobile (docs/PROTOCOL.md) in Swift, with no dependency
// outside the Apple SDKs (Foundation, CryptoKit, Core ML). The ExecuTorch engine lives in the
// sibling package ../HarmonyKitExecuTorch, so this package and its tests build and run without
// downloading the ExecuTorch binaries:
//
//     cd ios_demo/HarmonyKit && swift test        # on a Mac (Xcode 15+ / Swift 5.9+)
import PackageDescription

let package = Package(
    name: "HarmonyKit",
    platforms: [
        .iOS(.v16),
        .macOS(.v13),
    ],
    products: [
        .library(name: "HarmonyKit", targets: ["HarmonyKit"]),
    ],
    targets: [
        .target(
            name: "HarmonyKit",
            path: "Sources/HarmonyKit"
        ),
        .testTarget(
            name: "HarmonyKitTests",
            dependencies: ["HarmonyKit"],
            path: "Tests/HarmonyKitTests",
            // Read through #filePath (like ../../../tests/vectors), never bundled as resources.
            exclude: ["Fixtures"]
        ),
    ]
)
