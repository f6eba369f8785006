import XCTest
@testable import HarmonyKit

final class UploadQueueTests: XCTestCase {
    private var directory: URL!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("harmony-queue-\(UUID().uuidString)", isDirectory: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(at: directory)
    }

    private func body(_ text: String) -> @Sendable (UUID) throws -> Data {
        { id in Data("\(text)|\(id.lowercaseString)".utf8) }
    }

    func testEntriesSurviveARestartInOrderWithTheirMessageIDs() async throws {
        let queue = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        var ids = [UUID]()
        for index in 0..<3 {
            ids.append(try await queue.enqueue(body("upload \(index)")).upload.messageID)
        }
        // A new instance on the same directory: what the app sees after being killed.
        let restarted = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        let pending = try await restarted.pending()
        XCTAssertEqual(pending.map(\.messageID), ids)
        XCTAssertEqual(pending.map { String(decoding: $0.body, as: UTF8.self) },
                       ids.enumerated().map { "upload \($0.offset)|\($0.element.lowercaseString)" })
        XCTAssertEqual(pending.map(\.sequence), [1, 2, 3])
        // New entries continue the sequence.
        let next = try await restarted.enqueue(body("upload 3"))
        XCTAssertEqual(next.upload.sequence, 4)
    }

    func testTheMessageIDIsFixedAtEnqueueAndAResendStoresOnce() async throws {
        let server = IdempotentServer()
        let queue = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        let enqueued = try await queue.enqueue(body("features")).upload
        // The server stores the upload but the acknowledgement is lost (connection reset).
        let first = try await queue.drain { upload in
            await server.receive(upload)
            throw URLError(.networkConnectionLost)
        }
        XCTAssertEqual(first, 0)
        let afterLostAck = try await queue.count()
        XCTAssertEqual(afterLostAck, 1, "not acknowledged: kept")
        // After a restart the same id and the same bytes are sent again; the server stores nothing new.
        let restarted = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        let second = try await restarted.drain { upload in
            await server.receive(upload)
            return .delivered
        }
        XCTAssertEqual(second, 1)
        let afterResend = try await restarted.count()
        XCTAssertEqual(afterResend, 0)
        let received = await server.received
        XCTAssertEqual(received.map(\.messageID), [enqueued.messageID, enqueued.messageID])
        XCTAssertEqual(Set(received.map(\.body)).count, 1, "the resend is byte-identical")
        let stored = await server.stored
        XCTAssertEqual(stored.count, 1)
    }

    func testDrainStopsAtRetryLaterAndSetsRejectedAside() async throws {
        let queue = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        let a = try await queue.enqueue(body("a")).upload.messageID
        let b = try await queue.enqueue(body("b")).upload.messageID
        let c = try await queue.enqueue(body("c")).upload.messageID
        let outcomes: [UUID: SendOutcome] = [a: .delivered, b: .rejected, c: .retryLater]
        let delivered = try await queue.drain { outcomes[$0.messageID]! }
        XCTAssertEqual(delivered, 1)
        let remaining = try await queue.pending().map(\.messageID)
        XCTAssertEqual(remaining, [c])
        let rejected = try await queue.rejectedCount()
        XCTAssertEqual(rejected, 1)
    }

    func testTheQueueIsBoundedByEntries() async throws {
        let queue = try UploadQueue(directory: directory, maxEntries: 2, maxBytes: 1 << 20)
        try await queue.enqueue(body("1"))
        try await queue.enqueue(body("2"))
        do {
            try await queue.enqueue(body("3"))
            XCTFail("a full queue must refuse")
        } catch is QueueFullError {}
        let count = try await queue.count()
        XCTAssertEqual(count, 2)
    }

    func testTheQueueIsBoundedByBytesAndCanDropTheOldest() async throws {
        let entry = UploadQueue.fileOverheadBytes + 100
        let queue = try UploadQueue(
            directory: directory, maxEntries: 100, maxBytes: Int64(2 * entry), overflowPolicy: .dropOldest)
        let payload: @Sendable (UUID) throws -> Data = { _ in Data(repeating: 7, count: 100) }
        let first = try await queue.enqueue(payload).upload.messageID
        let second = try await queue.enqueue(payload).upload.messageID
        let third = try await queue.enqueue(payload)
        XCTAssertEqual(third.evictedMessageIDs, [first])
        let remaining = try await queue.pending().map(\.messageID)
        XCTAssertEqual(remaining, [second, third.upload.messageID])
        do {
            try await queue.enqueue { _ in Data(count: 3 * entry) }
            XCTFail("an upload larger than the whole queue must be refused")
        } catch is QueueFullError {}
    }

    func testCrashLeftoversAndCorruptedEntries() async throws {
        let queue = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        let good = try await queue.enqueue(body("good")).upload
        let bad = try await queue.enqueue(body("bad")).upload
        // A temporary file from a crash mid-write, and a flipped byte in a stored entry.
        try Data("half".utf8).write(to: directory.appendingPathComponent(UploadQueue.temporaryPrefix + "x"))
        let badFile = directory.appendingPathComponent(UploadQueue.fileName(sequence: bad.sequence, messageID: bad.messageID))
        var bytes = try Data(contentsOf: badFile)
        bytes[bytes.count / 2] ^= 0xff
        try bytes.write(to: badFile)

        let restarted = try UploadQueue(directory: directory, maxEntries: 10, maxBytes: 1 << 20)
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory.appendingPathComponent(UploadQueue.temporaryPrefix + "x").path))
        let remaining = try await restarted.pending().map(\.messageID)
        XCTAssertEqual(remaining, [good.messageID])
        let rejected = try await restarted.rejectedCount()
        XCTAssertEqual(rejected, 1)
    }
}

/// A server that is idempotent on message ids, as docs/PROTOCOL.md 4.6 specifies.
actor IdempotentServer {
    private(set) var received = [PendingUpload]()
    private(set) var stored = [UUID: Data]()

    func receive(_ upload: PendingUpload) {
        received.append(upload)
        if stored[upload.messageID] == nil {
            stored[upload.messageID] = upload.body
        }
    }
}
