extension IsleClient.Capabilities {
    /// What the running system offers (each feature guarded by the iOS version that brought it;
    /// docs/client.md has the table). Off Apple's systems (Linux, the simulator) everything is on.
    public static var current: IsleClient.Capabilities {
        #if os(iOS) && !targetEnvironment(macCatalyst)
        var c = IsleClient.Capabilities(liveActivities: false, pushToStart: false, pushToStartUpdateToken: false, broadcastChannels: false, widgetPushToken: false)
        if #available(iOS 16.1, *) { c.liveActivities = true }
        if #available(iOS 17.2, *) { c.pushToStart = true }
        if #available(iOS 18.0, *) {
            c.pushToStartUpdateToken = true
            c.broadcastChannels = true
        }
        if #available(iOS 26.0, *) { c.widgetPushToken = true }
        return c
        #elseif os(iOS) || os(macOS) || os(watchOS) || os(tvOS) || os(visionOS)
        // No Live Activities on these systems' own apps (Mac Catalyst included: ActivityKit's types
        // are unavailable there).
        return IsleClient.Capabilities(liveActivities: false, pushToStart: false, pushToStartUpdateToken: false, broadcastChannels: false, widgetPushToken: false)
        #else
        return IsleClient.Capabilities(liveActivities: true, pushToStart: true, pushToStartUpdateToken: true, broadcastChannels: true, widgetPushToken: true)
        #endif
    }
}
