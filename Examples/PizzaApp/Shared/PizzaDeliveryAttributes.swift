// Shared by the app and its widget extension (add the file to both targets).
import ActivityKit
import Foundation

/// Apple's pizza delivery sample: what never changes during the delivery (attributes), and what
/// the server updates (content state). The server knows this type by its Swift name,
/// "PizzaDeliveryAttributes", and validates content against Examples/PizzaDeliveryAttributes.schema.json.
struct PizzaDeliveryAttributes: ActivityAttributes {
    struct ContentState: Codable, Hashable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
    }

    var numberOfPizzas: Int
    var totalAmount: String
    var orderNumber: String
}
