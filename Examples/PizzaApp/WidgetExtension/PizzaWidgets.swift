// The widget extension's entry point: the Live Activity, and (iOS 26) the push-reloaded widget.
import SwiftUI
import WidgetKit

@main
struct PizzaWidgets: WidgetBundle {
    var body: some Widget {
        PizzaLiveActivity()
        #if canImport(WidgetKit, _version: 600)
        if #available(iOS 26.0, *) {
            FavoritePizzaWidget()
        }
        #endif
    }
}
