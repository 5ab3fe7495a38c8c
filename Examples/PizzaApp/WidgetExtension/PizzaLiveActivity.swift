// The widget extension: how the Live Activity looks on the Lock Screen and in the Dynamic Island.
import ActivityKit
import SwiftUI
import WidgetKit

struct PizzaLiveActivity: Widget {
    var body: some WidgetConfiguration {
        ActivityConfiguration(for: PizzaDeliveryAttributes.self) { context in
            // Lock Screen (and the banner on an iPhone without a Dynamic Island).
            VStack(alignment: .leading, spacing: 4) {
                Text("Order #\(context.attributes.orderNumber) · \(context.attributes.numberOfPizzas) pizzas").font(.headline)
                Text(context.state.driverName)
                Text(timerInterval: context.state.deliveryTimer, countsDown: true).monospacedDigit().foregroundStyle(.orange)
            }
            .padding()
            .activityBackgroundTint(Color.black.opacity(0.25))
        } dynamicIsland: { context in
            DynamicIsland {
                DynamicIslandExpandedRegion(.leading) { Text("🍕") }
                DynamicIslandExpandedRegion(.trailing) {
                    Text(timerInterval: context.state.deliveryTimer, countsDown: true).monospacedDigit()
                }
                DynamicIslandExpandedRegion(.bottom) { Text("\(context.state.driverName) is on the way") }
            } compactLeading: {
                Text("🍕")
            } compactTrailing: {
                Text(timerInterval: context.state.deliveryTimer, countsDown: true).monospacedDigit().frame(width: 44)
            } minimal: {
                Text("🍕")
            }
        }
    }
}
