public import Foundation

extension IsleClient {
    /// The APNs environment of the tokens this build receives, sent with the installation and
    /// every activity so the server pushes each token to its own APNs host: debug builds hold
    /// `sandbox` tokens, TestFlight and App Store builds `production` ones, and one team often
    /// runs both at once.
    public enum Environment: String, Sendable, Hashable, Codable, CaseIterable {
        case sandbox, production

        /// The running build's environment: its provisioning profile's `aps-environment` on a
        /// device (`development` is the sandbox); `production` when the app carries no profile
        /// (App Store and TestFlight builds); `sandbox` in Xcode's Simulator. Nil where there is
        /// no app bundle to read (Linux, command-line tools): the server's default applies.
        public static func ofRunningBuild(bundle: Bundle = .main) -> Environment? {
            #if targetEnvironment(simulator)
            return .sandbox
            #elseif os(macOS) || targetEnvironment(macCatalyst)
            // A Mac app's profile sits in Contents/; without one the app cannot say.
            let url = bundle.bundleURL.appendingPathComponent("Contents/embedded.provisionprofile")
            guard let data = try? Data(contentsOf: url) else { return nil }
            return fromProvisioningProfile(data)
            #elseif os(iOS) || os(watchOS) || os(tvOS) || os(visionOS)
            guard let url = bundle.url(forResource: "embedded", withExtension: "mobileprovision") else { return .production }
            guard let data = try? Data(contentsOf: url) else { return nil }
            return fromProvisioningProfile(data)
            #else
            return nil
            #endif
        }

        /// Reads `aps-environment` (`com.apple.developer.aps-environment` on macOS) from a
        /// provisioning profile: a signed envelope around an XML property list. Nil when the
        /// profile holds no such entitlement (the app has no push capability) or cannot be read.
        public static func fromProvisioningProfile(_ data: Data) -> Environment? {
            let bytes = [UInt8](data)
            guard let start = find(Array("<?xml".utf8), in: bytes, from: 0),
                  let end = find(Array("</plist>".utf8), in: bytes, from: start) else { return nil }
            let plist = Data(bytes[start..<(end + "</plist>".utf8.count)])
            guard let root = try? PropertyListSerialization.propertyList(from: plist, format: nil) as? [String: Any],
                  let entitlements = root["Entitlements"] as? [String: Any],
                  let value = (entitlements["aps-environment"] ?? entitlements["com.apple.developer.aps-environment"]) as? String else { return nil }
            switch value {
            case "development": return .sandbox
            case "production": return .production
            default: return nil
            }
        }

        static func find(_ needle: [UInt8], in haystack: [UInt8], from: Int) -> Int? {
            guard needle.count <= haystack.count else { return nil }
            var i = from
            while i + needle.count <= haystack.count {
                if haystack[i] == needle[0], Array(haystack[i..<(i + needle.count)]) == needle { return i }
                i += 1
            }
            return nil
        }
    }
}
