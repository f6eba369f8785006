import Foundation

public struct HTTPRequest: Sendable, Equatable {
    public var method: String
    /// Path and query, starting with "/", appended to the transport's base URL.
    public var path: String
    public var headers: [String: String]
    public var body: Data?

    public init(method: String, path: String, headers: [String: String] = [:], body: Data? = nil) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
    }
}

public struct HTTPResponse: Sendable, Equatable {
    public let status: Int
    /// Header names lowercased.
    public let headers: [String: String]
    public let body: Data

    public init(status: Int, headers: [String: String] = [:], body: Data = Data()) {
        self.status = status
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { _, last in last })
        self.body = body
    }

    public var isSuccess: Bool { (200..<300).contains(status) }

    public func header(_ name: String) -> String? {
        headers[name.lowercased()]
    }
}

/// Sends one request. `URLSessionTransport` is the real one; `RetryingTransport` wraps any
/// transport with retries; tests script a fake.
public protocol HTTPTransport: Sendable {
    func send(_ request: HTTPRequest) async throws -> HTTPResponse
}

/// `HTTPTransport` on an ephemeral `URLSession` (no cookies, no cache, no credential storage).
///
/// `requestTimeout` bounds the wait for the next bytes (`timeoutIntervalForRequest`),
/// `resourceTimeout` the whole exchange (`timeoutIntervalForResource`). It does not wait for
/// connectivity: an offline phone fails at once and keeps its local answer / queued uploads.
public final class URLSessionTransport: HTTPTransport, @unchecked Sendable {
    public let baseURL: URL
    private let session: URLSession

    public init(baseURL: URL, requestTimeout: TimeInterval = 10, resourceTimeout: TimeInterval = 30) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = requestTimeout
        configuration.timeoutIntervalForResource = resourceTimeout
        configuration.waitsForConnectivity = false
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpShouldSetCookies = false
        configuration.httpCookieAcceptPolicy = .never
        self.baseURL = baseURL
        self.session = URLSession(configuration: configuration)
    }

    deinit {
        session.finishTasksAndInvalidate()
    }

    public func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        var base = baseURL.absoluteString
        while base.hasSuffix("/") {
            base.removeLast()
        }
        guard let url = URL(string: base + request.path) else {
            throw URLError(.badURL)
        }
        var urlRequest = URLRequest(url: url)
        urlRequest.httpMethod = request.method
        urlRequest.httpBody = request.body
        for (name, value) in request.headers {
            urlRequest.setValue(value, forHTTPHeaderField: name)
        }
        let (data, response) = try await session.data(for: urlRequest)
        guard let http = response as? HTTPURLResponse else {
            throw URLError(.badServerResponse)
        }
        var headers = [String: String]()
        for (key, value) in http.allHeaderFields {
            if let name = key as? String {
                headers[name.lowercased()] = "\(value)"
            }
        }
        return HTTPResponse(status: http.statusCode, headers: headers, body: data)
    }
}
