// Starting a Live Activity when the person places an order (in the foreground).
import ActivityKit
import Foundation

func startDelivery(orderNumber: String, pizzas: Int, total: String, driver: String, eta: TimeInterval) throws {
    let attributes = PizzaDeliveryAttributes(numberOfPizzas: pizzas, totalAmount: total, orderNumber: orderNumber)
    let state = PizzaDeliveryAttributes.ContentState(driverName: driver, deliveryTimer: Date()...Date().addingTimeInterval(eta))
    // pushType: .token — the activity's push token arrives later on pushTokenUpdates; IsleClient
    // (tracking this type since launch) hands it to the server. Nothing else to do here.
    if #available(iOS 16.2, *) {
        _ = try Activity.request(attributes: attributes, content: .init(state: state, staleDate: Date().addingTimeInterval(eta + 600)), pushType: .token)
    } else {
        // iOS 16.1: no ActivityContent, no stale date.
        _ = try Activity.request(attributes: attributes, contentState: state, pushType: .token)
    }
}
