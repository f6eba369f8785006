import CryptoKit
import Foundation

/// An upload waiting in the queue. The message id was assigned when it was enqueued and is sent on
/// every retry, so the server (idempotent on message ids) stores it once however often it arrives.
public struct PendingUpload: Sendable, Equatable {
    /// Position in the queue (monotonic, survives restarts).
    public let sequence: UInt64
    /// The id bound into the sealed envelope's associated data.
    public let messageID: UUID
    /// The exact request body (already sealed: no plaintext features or tokens on disk).
    public let body: Data
    public let enqueuedAt: Date
}

/// The queue is at its entry or byte limit and its overflow policy is to refuse new uploads.
public struct QueueFullError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// What a sender did with one queued upload.
public enum SendOutcome: Sendable {
    /// The server acknowledged (2xx, including "already stored" for a replayed message id).
    case delivered
    /// Try again later (network down, 429, 503, 401 before re-enrolment): the upload stays, draining stops.
    case retryLater
    /// Refused for good (400, 409, 413, 422): moved aside to `rejected/`, never resent.
    case rejected
}

/// A bounded, file-backed FIFO of uploads that survives process death (the Swift twin of
/// harmony-core's `UploadQueue`).
///
/// * **Durability.** Each entry is one file, written to a temporary name, `fsync`ed, then renamed
///   atomically to `<sequence, 19 digits>-<message id>.upload`; the directory is `fsync`ed too. Once
///   `enqueue` returns the upload survives a crash, and no reader sees half a file (temporary
///   leftovers are deleted on open). Each file ends with a checksum (8 bytes of SHA-256); a corrupted
///   file is moved to `rejected/` instead of being sent.
/// * **No duplicates, nothing lost.** The message id is assigned here, once, and handed to the
///   caller's body builder (it is bound into the envelope's associated data). An entry is deleted
///   only after the server acknowledged it; a crash between acknowledgement and deletion resends the
///   same message id, which the server stores once: delivery at least once, storage exactly once.
/// * **Bounds.** At most `maxEntries` entries and `maxBytes` bytes of entry files. When full,
///   `.rejectNew` (default) throws `QueueFullError`, so nothing accepted is ever dropped;
///   `.dropOldest` evicts the oldest entries and reports their ids.
///
/// One queue directory must be used by one `UploadQueue` instance (the actor serializes its users).
public actor UploadQueue {
    public enum OverflowPolicy: Sendable {
        case rejectNew
        case dropOldest
    }

    /// What enqueue did: the new entry and the ids of entries evicted to make room.
    public struct EnqueueResult: Sendable {
        public let upload: PendingUpload
        public let evictedMessageIDs: [UUID]
    }

    public static let fileSuffix = ".upload"
    public static let temporaryPrefix = ".tmp-"
    public static let rejectedDirectoryName = "rejected"
    static let fileMagic: [UInt8] = Array("HMQ1".utf8)
    static let checksumBytes = 8
    /// magic + sequence + enqueued-at + message id + body length + checksum.
    static let fileOverheadBytes = 4 + 8 + 8 + 16 + 4 + checksumBytes

    public nonisolated let directory: URL
    public nonisolated let maxEntries: Int
    public nonisolated let maxBytes: Int64
    public nonisolated let overflowPolicy: OverflowPolicy
    private var nextSequence: UInt64
    private var draining = false

    public init(directory: URL, maxEntries: Int, maxBytes: Int64, overflowPolicy: OverflowPolicy = .rejectNew) throws {
        precondition(maxEntries >= 1 && maxBytes >= 1, "queue bounds must be positive")
        let fileManager = FileManager.default
        try fileManager.createDirectory(
            at: directory.appendingPathComponent(Self.rejectedDirectoryName, isDirectory: true),
            withIntermediateDirectories: true)
        for name in try fileManager.contentsOfDirectory(atPath: directory.path) where name.hasPrefix(Self.temporaryPrefix) {
            try? fileManager.removeItem(at: directory.appendingPathComponent(name))
        }
        self.directory = directory
        self.maxEntries = maxEntries
        self.maxBytes = maxBytes
        self.overflowPolicy = overflowPolicy
        self.nextSequence = (try Self.entryFiles(in: directory).last?.sequence ?? 0) + 1
    }

    /// Assigns a fresh random (v4) message id, builds the body with it and stores the entry durably.
    ///
    /// - Parameter makeBody: seals the upload for the given message id and returns the request body.
    @discardableResult
    public func enqueue(_ makeBody: @Sendable (UUID) throws -> Data) throws -> EnqueueResult {
        try enqueue(messageID: UUID(), makeBody)
    }

    @discardableResult
    func enqueue(messageID: UUID, _ makeBody: @Sendable (UUID) throws -> Data) throws -> EnqueueResult {
        let body = try makeBody(messageID)
        let size = Int64(Self.fileOverheadBytes + body.count)
        guard size <= maxBytes else {
            throw QueueFullError(description: "an upload of \(body.count) bytes exceeds the queue's \(maxBytes) bytes")
        }
        var files = try Self.entryFiles(in: directory)
        var bytes = files.reduce(Int64(0)) { $0 + $1.size }
        var evicted = [UUID]()
        while files.count + 1 > maxEntries || bytes + size > maxBytes {
            guard overflowPolicy == .dropOldest, !files.isEmpty else {
                throw QueueFullError(description:
                    "upload queue full: \(files.count) entries, \(bytes) bytes (limits \(maxEntries) entries, \(maxBytes) bytes)")
            }
            let oldest = files.removeFirst()
            bytes -= oldest.size
            evicted.append(oldest.messageID)
            try FileManager.default.removeItem(at: oldest.url)
        }
        let upload = PendingUpload(sequence: nextSequence, messageID: messageID, body: body, enqueuedAt: Date())
        try writeDurably(upload)
        nextSequence += 1
        return EnqueueResult(upload: upload, evictedMessageIDs: evicted)
    }

    /// Entries in queue order (corrupted files are moved to `rejected/` and skipped).
    public func pending() throws -> [PendingUpload] {
        try Self.entryFiles(in: directory).compactMap { try read($0) }
    }

    public func count() throws -> Int {
        try Self.entryFiles(in: directory).count
    }

    /// Removes an entry after the server acknowledged it; unknown ids are ignored (already removed).
    public func acknowledge(_ messageID: UUID) throws {
        for file in try Self.entryFiles(in: directory) where file.messageID == messageID {
            try FileManager.default.removeItem(at: file.url)
            Self.syncDirectory(directory)
        }
    }

    /// Sends entries oldest first until the queue is empty or the sender says to retry later.
    /// A second drain while one is running returns 0 at once.
    ///
    /// - Returns: the number of entries delivered.
    public func drain(_ send: @Sendable (PendingUpload) async throws -> SendOutcome) async throws -> Int {
        guard !draining else { return 0 }
        draining = true
        defer { draining = false }
        var delivered = 0
        for upload in try pending() {
            let outcome: SendOutcome
            do {
                outcome = try await send(upload)
            } catch {
                return delivered // network down: keep everything for the next drain
            }
            switch outcome {
            case .delivered:
                try acknowledge(upload.messageID)
                delivered += 1
            case .rejected:
                try moveToRejected(fileURL(for: upload))
            case .retryLater:
                return delivered
            }
        }
        return delivered
    }

    /// Uploads the server refused for good, kept for diagnosis, never resent.
    public func rejectedCount() throws -> Int {
        try FileManager.default.contentsOfDirectory(
            atPath: directory.appendingPathComponent(Self.rejectedDirectoryName).path
        ).count
    }

    // MARK: - Files

    struct EntryFile {
        let url: URL
        let sequence: UInt64
        let messageID: UUID
        let size: Int64
    }

    static func fileName(sequence: UInt64, messageID: UUID) -> String {
        let digits = String(sequence)
        return String(repeating: "0", count: max(0, 19 - digits.count)) + digits + "-" + messageID.lowercaseString
            + fileSuffix
    }

    /// Entry files sorted by sequence; names that are not `<19 digits>-<uuid>.upload` are ignored.
    static func entryFiles(in directory: URL) throws -> [EntryFile] {
        let fileManager = FileManager.default
        var files = [EntryFile]()
        for name in try fileManager.contentsOfDirectory(atPath: directory.path) where name.hasSuffix(fileSuffix) {
            let stem = name.dropLast(fileSuffix.count)
            guard stem.count == 19 + 1 + 36,
                  stem.prefix(19).allSatisfy(\.isASCII), stem.prefix(19).allSatisfy(\.isNumber),
                  let sequence = UInt64(stem.prefix(19)),
                  stem.dropFirst(19).first == "-",
                  let messageID = UUID(uuidString: String(stem.suffix(36)))
            else { continue }
            let url = directory.appendingPathComponent(name)
            let size = (try? fileManager.attributesOfItem(atPath: url.path)[.size] as? NSNumber)?.int64Value ?? 0
            files.append(EntryFile(url: url, sequence: sequence, messageID: messageID, size: size))
        }
        return files.sorted { $0.sequence < $1.sequence }
    }

    private func fileURL(for upload: PendingUpload) -> URL {
        directory.appendingPathComponent(Self.fileName(sequence: upload.sequence, messageID: upload.messageID))
    }

    static func encode(_ upload: PendingUpload) -> Data {
        var out = Data(fileMagic)
        out.appendBigEndian(upload.sequence)
        out.appendBigEndian(Int64((upload.enqueuedAt.timeIntervalSince1970 * 1000).rounded()))
        out.append(upload.messageID.rfc4122Bytes)
        out.appendBigEndian(UInt32(upload.body.count))
        out.append(upload.body)
        out.append(checksum(out))
        return out
    }

    static func checksum(_ data: Data) -> Data {
        Data(SHA256.hash(data: data)).prefix(checksumBytes)
    }

    private func writeDurably(_ upload: PendingUpload) throws {
        let fileManager = FileManager.default
        let temporary = directory.appendingPathComponent(Self.temporaryPrefix + upload.messageID.lowercaseString)
        guard fileManager.createFile(atPath: temporary.path, contents: nil, attributes: Self.fileAttributes) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary.path])
        }
        do {
            let handle = try FileHandle(forWritingTo: temporary)
            defer { try? handle.close() }
            try handle.write(contentsOf: Self.encode(upload))
            try handle.synchronize()
        } catch {
            try? fileManager.removeItem(at: temporary)
            throw error
        }
        let target = fileURL(for: upload)
        guard rename(temporary.path, target.path) == 0 else {
            let code = errno
            try? fileManager.removeItem(at: temporary)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        Self.syncDirectory(directory)
    }

    /// Reads and checks an entry file; a corrupted one is moved to rejected/ and skipped (nil).
    private func read(_ file: EntryFile) throws -> PendingUpload? {
        let data = try Data(contentsOf: file.url)
        var reader = ByteReader(data)
        do {
            guard data.count >= Self.fileOverheadBytes, try reader.read(4) == Self.fileMagic else {
                throw HarmonyFormatError("bad header")
            }
            let sequence = try reader.readBigEndian(UInt64.self)
            let enqueuedMillis = try reader.readBigEndian(Int64.self)
            let id = try reader.read(16)
            let bodyLength = try Int(reader.readBigEndian(UInt32.self))
            let body = try Data(reader.read(bodyLength))
            let stored = try Data(reader.read(Self.checksumBytes))
            let messageID = UUID(uuid: (id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7],
                                        id[8], id[9], id[10], id[11], id[12], id[13], id[14], id[15]))
            guard reader.remaining == 0, stored == Self.checksum(data.prefix(data.count - Self.checksumBytes)),
                  sequence == file.sequence, messageID == file.messageID
            else {
                throw HarmonyFormatError("checksum or name mismatch")
            }
            return PendingUpload(
                sequence: sequence, messageID: messageID, body: body,
                enqueuedAt: Date(timeIntervalSince1970: TimeInterval(enqueuedMillis) / 1000))
        } catch is HarmonyFormatError {
            try moveToRejected(file.url)
            return nil
        }
    }

    private func moveToRejected(_ url: URL) throws {
        let target = directory.appendingPathComponent(Self.rejectedDirectoryName)
            .appendingPathComponent(url.lastPathComponent)
        try? FileManager.default.removeItem(at: target)
        try FileManager.default.moveItem(at: url, to: target)
        Self.syncDirectory(directory)
    }

    /// Makes a rename durable (fsync of the directory).
    static func syncDirectory(_ directory: URL) {
        let descriptor = open(directory.path, O_RDONLY)
        guard descriptor >= 0 else { return }
        _ = fsync(descriptor)
        _ = close(descriptor)
    }

    /// Queue files stay readable after the first unlock, so a background flush can send them.
    private static var fileAttributes: [FileAttributeKey: Any]? {
        #if os(iOS)
        return [.protectionKey: FileProtectionType.completeUntilFirstUserAuthentication]
        #else
        return nil
        #endif
    }
}
