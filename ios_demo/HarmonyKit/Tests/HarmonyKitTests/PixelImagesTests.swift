import XCTest
@testable import HarmonyKit

/// The same cases as harmony-core's PixelImagesTest: the bundled 28x28 gray digits feed any tier.
final class PixelImagesTests: XCTestCase {
    func testHalfPixelCentresAsPyTorch() {
        // torch.nn.functional.interpolate gives 0, 63.75, 191.25, 255 and 32, 223
        XCTAssertEqual(PixelImages.resize([0, 255], channels: 1, height: 1, width: 2, toHeight: 1, toWidth: 4), [0, 64, 191, 255])
        XCTAssertEqual(PixelImages.resize([0, 64, 191, 255], channels: 1, height: 1, width: 4, toHeight: 1, toWidth: 2), [32, 223])
    }

    func testAConstantDigitBecomesAConstant3x32x32Image() throws {
        let gray = [UInt8](repeating: 200, count: 28 * 28)
        let big = try PixelImages.fit(gray, channels: 1, height: 28, width: 28, toChannels: 3, toHeight: 32, toWidth: 32)
        XCTAssertEqual(big.count, 3 * 32 * 32)
        XCTAssertTrue(big.allSatisfy { $0 == 200 })
    }

    func testChannels() throws {
        XCTAssertEqual(try PixelImages.fit([10, 20], channels: 1, height: 1, width: 2, toChannels: 3, toHeight: 1, toWidth: 2),
                       [10, 20, 10, 20, 10, 20])
        XCTAssertEqual(try PixelImages.fit([255, 0, 0, 255, 0, 0], channels: 3, height: 1, width: 2, toChannels: 1, toHeight: 1, toWidth: 2),
                       [76, 150])
        XCTAssertThrowsError(try PixelImages.fit([0], channels: 1, height: 2, width: 2, toChannels: 1, toHeight: 2, toWidth: 2))
    }
}
