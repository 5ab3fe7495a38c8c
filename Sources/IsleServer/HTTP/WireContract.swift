/// The fields each request body of the API takes: the one list the handlers enforce (an unknown
/// field is a 400 naming it) and `WireContractTests` checks, route by route, against the OpenAPI
/// document (`/openapi.json`). The server's answers are checked against the document by
/// schemathesis (scripts/schemathesis.sh, in CI), and every request IsleClient sends against the
/// document's request schemas in the client tests (`ConformingStorage`), so a drift anywhere fails.
public enum WireContract {
    static let installation = ["pushToStartTokens", "widgetToken", "liveActivitiesEnabled", "frequentPushesEnabled", "environment", "ticket"]
    static let activityRegistration = ["attributesType", "channelID", "token", "externalKey", "topics", "installationID", "attributes", "contentState", "relevanceScore",
                                       "environment", "ticket"]
    static let token = ["token"]
    static let userBinding = ["userID"]
    static let keyBinding = ["externalKey"]
    static let update = ["contentState", "alert", "staleDate", "relevanceScore", "priority", "sendAt"]
    static let end = update + ["dismissalDate"]
    static let start = ["attributesType", "attributes", "contentState", "alert", "staleDate", "relevanceScore", "externalKey", "topics"]
    static let channelCreation = ["storagePolicy", "environment"]
    static let webhookCreation = ["url", "eventTypes"]
    static let webhookChange = ["url", "eventTypes", "enabled"]
    static let webhookRotation = ["overlapSeconds"]
    static let webhookReplay = ["after"]
    static let webhookRedelivery = ["eventId"]

    /// Every route that takes a body, as the OpenAPI document names it, with its fields.
    public static let requests: [String: [String]] = [
        "PUT /v1/installations/{installation}": installation,
        "POST /v1/activities": activityRegistration,
        "PUT /v1/activities/{activity}/token": token,
        "POST /v1/activities/{activity}/update": update,
        "POST /v1/activities/{activity}/end": end,
        "POST /v1/activities/by-key/{key}/update": update,
        "POST /v1/activities/by-key/{key}/end": end,
        "POST /v1/topics/{topic}/update": update,
        "POST /v1/topics/{topic}/end": end,
        "POST /v1/installations/{installation}/start": start,
        "POST /v1/users/{user}/start": start,
        "POST /v1/channels": channelCreation,
        "POST /v1/channels/{channel}/update": update,
        "POST /v1/channels/{channel}/end": end,
        "PUT /v1/installations/{installation}/user": userBinding,
        "PUT /v1/activities/{activity}/key": keyBinding,
        "POST /v1/webhooks": webhookCreation,
        "PATCH /v1/webhooks/{webhook}": webhookChange,
        "POST /v1/webhooks/{webhook}/rotate-secret": webhookRotation,
        "POST /v1/webhooks/{webhook}/replay": webhookReplay,
        "POST /v1/webhooks/{webhook}/redeliver": webhookRedelivery,
    ]
}
