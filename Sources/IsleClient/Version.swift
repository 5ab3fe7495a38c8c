extension IsleClient {
    /// This release of IsleClient (CHANGELOG.md; the repository's tag of the same name).
    public static let version = "0.9.0"
}
