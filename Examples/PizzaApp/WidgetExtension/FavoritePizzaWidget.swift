// The widget extension: the "favorite pizza" widget, reloaded by the backend's widgets push (iOS 26),
// and the push handler that hands WidgetKit's widget push token to the app (docs/client.md, "Widget
// push token"). Compiled only with the iOS 26 SDK, whose WidgetKit has push handlers.
#if canImport(WidgetKit, _version: 600)
import IsleClient
import SwiftUI
import WidgetKit

/// WidgetKit gives the widget push token to this extension. It never sends it (the app owns
/// IsleClient's outbox): IsleWidgetPushHandler leaves it in the App Group, and the app's
/// `WidgetKitPushTokens(appGroup:)` reads it and sends it with the installation.
@available(iOS 26.0, *)
struct PizzaWidgetPushHandler: IsleWidgetPushHandler {
    static let appGroup = PizzaAppGroup.identifier
}

@available(iOS 26.0, *)
struct FavoritePizzaEntry: TimelineEntry {
    let date: Date
    let pizza: String
}

@available(iOS 26.0, *)
struct FavoritePizzaProvider: TimelineProvider {
    func placeholder(in context: Context) -> FavoritePizzaEntry {
        FavoritePizzaEntry(date: Date(), pizza: "Margherita")
    }

    func getSnapshot(in context: Context, completion: @escaping (FavoritePizzaEntry) -> Void) {
        completion(entry())
    }

    /// One entry, read from the App Group: the backend's widgets push makes WidgetKit ask again.
    func getTimeline(in context: Context, completion: @escaping (Timeline<FavoritePizzaEntry>) -> Void) {
        completion(Timeline(entries: [entry()], policy: .never))
    }

    func entry() -> FavoritePizzaEntry {
        let pizza = UserDefaults(suiteName: PizzaAppGroup.identifier)?.string(forKey: PizzaAppGroup.favoritePizzaKey)
        return FavoritePizzaEntry(date: Date(), pizza: pizza ?? "Margherita")
    }
}

@available(iOS 26.0, *)
struct FavoritePizzaWidget: Widget {
    var body: some WidgetConfiguration {
        StaticConfiguration(kind: "FavoritePizza", provider: FavoritePizzaProvider()) { entry in
            VStack(alignment: .leading) {
                Text("Your favorite").font(.caption)
                Text("🍕 \(entry.pizza)").font(.headline)
            }
            .containerBackground(.fill.tertiary, for: .widget)
        }
        .configurationDisplayName("Favorite pizza")
        .pushHandler(PizzaWidgetPushHandler.self)
    }
}
#endif
