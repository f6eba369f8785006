import Foundation
import HarmonyKit
import Security

/// One generic-password Keychain item of the demo app, readable after the first unlock so queued
/// uploads can be sent from the background and never copied to another device.
struct KeychainItem {
    static let service = "org.harmonymobile.demo"
    let account: String

    func read() -> Data? {
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: KeychainItem.service,
            kSecAttrAccount as String: account,
            kSecReturnData as String: true,
            kSecMatchLimit as String: kSecMatchLimitOne,
        ]
        var item: CFTypeRef?
        guard SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess else { return nil }
        return item as? Data
    }

    /// Replaces the item's value.
    func write(_ value: Data) throws {
        delete()
        let attributes: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: KeychainItem.service,
            kSecAttrAccount as String: account,
            kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly,
            kSecValueData as String: value,
        ]
        let status = SecItemAdd(attributes as CFDictionary, nil)
        guard status == errSecSuccess else { throw NSError(domain: NSOSStatusErrorDomain, code: Int(status)) }
    }

    func delete() {
        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: KeychainItem.service,
            kSecAttrAccount as String: account,
        ]
        SecItemDelete(query as CFDictionary)
    }
}

/// Keeps the enrolment credentials (device id, bearer token, pinned server key) in the Keychain.
enum CredentialStore {
    private static let item = KeychainItem(account: "device-credentials")

    static func load() -> DeviceCredentials? {
        item.read().flatMap { try? JSONDecoder().decode(DeviceCredentials.self, from: $0) }
    }

    static func save(_ credentials: DeviceCredentials) throws {
        try item.write(try JSONEncoder().encode(credentials))
    }

    static func delete() {
        item.delete()
    }
}

/// Keeps the provisioning payload's own classes (tier name -> the classes this phone holds) in the
/// Keychain beside the secret: a slot_margin tier gates by them, and the payload is not kept whole.
enum OwnClassesStore {
    private static let item = KeychainItem(account: "own-classes")

    static func load() -> [String: [String]]? {
        item.read().flatMap { try? JSONDecoder().decode([String: [String]].self, from: $0) }
    }

    /// A payload without own classes clears the stored ones: they described the phone as the last
    /// provisioning saw it, and gating by stale classes would answer wrongly without saying so.
    static func save(_ ownClasses: [String: [String]]?) throws {
        guard let ownClasses else {
            item.delete()
            return
        }
        try item.write(try JSONEncoder().encode(ownClasses))
    }

    static func delete() {
        item.delete()
    }
}
