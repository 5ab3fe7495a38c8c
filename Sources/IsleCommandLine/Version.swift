/// The version `isle --version` prints. A release build (scripts/release.sh, issue 27) writes the
/// commit it was built from; a build from a checkout says so.
public enum IsleVersion {
    public static let version = "0.10.0-dev"
    public static let commit = "a development build from a checkout"
    public static var text: String { "isle \(version) (\(commit))" }
}
