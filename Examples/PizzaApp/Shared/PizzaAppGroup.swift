// Shared by the app and its widget extension (add the file to both targets).

/// The App Group both targets belong to: Signing & Capabilities › App Groups, the same identifier in
/// the app and in the widget extension. The widget extension leaves the widget push token there for
/// the app (IsleClient's `WidgetTokenMailbox`), and the app keeps the favorite pizza there for the
/// widget.
enum PizzaAppGroup {
    static let identifier = "group.com.example.pizza"
    /// The favorite pizza the widget shows (the app writes it; a widgets push makes WidgetKit read it again).
    static let favoritePizzaKey = "favoritePizza"
}
