public import IsleCore

/// The API's OpenAPI 3.1 document, made from ``APIDocument/operations`` and the types they name:
/// the server serves it at `/openapi.json`, and `docs/openapi.json` is a copy a test keeps equal
/// (`isle openapi` writes it).
public enum APIDocument {
    public enum Method: String, Sendable { case get, put, post, delete, patch }
    public enum Tag: String, Sendable { case device, backend }

    /// A parameter: a path segment (its type's rules, and no U+0000), a query parameter, or one of
    /// the shared headers (``parameters``).
    public enum Parameter {
        case path(String, any WireScalar.Type)
        case pathSchema(String, JSONValue)
        case query(String, JSONValue, String)
        case idempotencyKey, idempotencyKeyChecked, installationSecret, installationSecretAtRegistration, strict

        var json: JSONValue {
            switch self {
            case .path(let name, let type):
                var s = type.wireSchema.objectValue ?? [:]
                if s["pattern"] == nil { s["pattern"] = "^[^\\u0000]*$" }
                return ["name": .string(name), "in": "path", "required": true, "schema": .object(s)]
            case .pathSchema(let name, let schema): return ["name": .string(name), "in": "path", "required": true, "schema": schema]
            case .query(let name, let schema, let words):
                var o: JSONObject = ["name": .string(name), "in": "query", "required": false]
                if !words.isEmpty { o["description"] = .string(words) }
                o["schema"] = schema
                return .object(o)
            case .idempotencyKey: return ["$ref": "#/components/parameters/IdempotencyKey"]
            case .idempotencyKeyChecked: return ["$ref": "#/components/parameters/IdempotencyKeyChecked"]
            case .installationSecret: return ["$ref": "#/components/parameters/InstallationSecret"]
            case .installationSecretAtRegistration: return ["$ref": "#/components/parameters/InstallationSecretAtRegistration"]
            case .strict: return ["$ref": "#/components/parameters/Strict"]
            }
        }
    }

    /// A success answer: JSON of a type, text, or nothing.
    public enum Answer {
        case json(Int, String, any Decodable.Type)
        case text(Int, String)
        case empty(Int, String)
    }

    public struct Operation {
        public var method: Method
        public var path: String
        public var summary: String
        public var description: String?
        public var tag: Tag?
        public var parameters: [Parameter]
        public var body: (any Decodable.Type)?
        public var bodyOptional: Bool
        public var answers: [Answer]
        public var refusals: [Int]

        init(_ method: Method, _ path: String, summary: String, description: String? = nil, tag: Tag? = nil, parameters: [Parameter] = [],
             body: (any Decodable.Type)? = nil, bodyOptional: Bool = false, answers: [Answer], refusals: [Int] = []) {
            self.method = method
            self.path = path
            self.summary = summary
            self.description = description
            self.tag = tag
            self.parameters = parameters
            self.body = body
            self.bodyOptional = bodyOptional
            self.answers = answers
            self.refusals = refusals
        }

        /// `POST /v1/activities`, as routes and the document name it.
        public var route: String { "\(method.rawValue.uppercased()) \(path)" }
    }

    /// Each route's operationId: what a generated client names its function.
    static let operationIDs: [String: String] = [
        "GET /health": "health",
        "GET /ready": "ready",
        "GET /metrics": "metrics",
        "GET /openapi.json": "openAPIDocument",
        "PUT /v1/installations/{installation}": "registerInstallation",
        "DELETE /v1/installations/{installation}": "deleteInstallation",
        "POST /v1/activities": "registerActivity",
        "GET /v1/activities": "listActivities",
        "PUT /v1/activities/{activity}/token": "rotateActivityToken",
        "POST /v1/activities/{activity}/dismissed": "reportActivityDismissed",
        "POST /v1/activities/{activity}/ended": "reportActivityEnded",
        "POST /v1/activities/{activity}/update": "updateActivity",
        "POST /v1/activities/{activity}/end": "endActivity",
        "POST /v1/activities/by-key/{key}/update": "updateActivityByKey",
        "POST /v1/activities/by-key/{key}/end": "endActivityByKey",
        "POST /v1/topics/{topic}/update": "updateTopic",
        "POST /v1/topics/{topic}/end": "endTopic",
        "PUT /v1/topics/{topic}": "openTopic",
        "POST /v1/topics/{topic}/start": "startTopic",
        "PUT /v1/activities/{activity}/renewal": "renewActivity",
        "DELETE /v1/activities/{activity}/renewal": "stopRenewingActivity",
        "PUT /v1/activities/by-key/{key}/renewal": "renewActivityByKey",
        "GET /v1/topics/{topic}": "getTopic",
        "DELETE /v1/topics/{topic}": "closeTopic",
        "POST /v1/topics/{topic}/channel": "getTopicChannel",
        "POST /v1/installations/{installation}/start": "startOnInstallation",
        "POST /v1/users/{user}/start": "startForUser",
        "POST /v1/installations/{installation}/widgets/reload": "reloadWidgets",
        "POST /v1/installations/{installation}/controls/reload": "reloadControls",
        "GET /v1/activities/{activity}": "getActivity",
        "GET /v1/activities/by-key/{key}": "getActivityByKey",
        "GET /v1/deliveries/{apnsID}": "getDelivery",
        "POST /v1/channels": "createChannel",
        "GET /v1/channels": "listChannels",
        "DELETE /v1/channels/{channel}": "deleteChannel",
        "POST /v1/channels/{channel}/update": "updateChannel",
        "POST /v1/channels/{channel}/end": "endChannel",
        "GET /v1/app": "getApp",
        "POST /v1/app/resume": "resumeApp",
        "PUT /v1/installations/{installation}/user": "bindUser",
        "PUT /v1/activities/{activity}/key": "bindActivityKey",
        "GET /v1/events": "listEvents",
        "POST /v1/webhooks": "createWebhook",
        "GET /v1/webhooks": "listWebhooks",
        "GET /v1/webhooks/{webhook}": "getWebhook",
        "DELETE /v1/webhooks/{webhook}": "deleteWebhook",
        "PATCH /v1/webhooks/{webhook}": "changeWebhook",
        "GET /v1/jobs": "listJobs",
        "DELETE /v1/jobs/{job}": "cancelJob",
        "POST /v1/jobs/{job}/retry": "retryJob",
        "POST /v1/webhooks/{webhook}/rotate-secret": "rotateWebhookSecret",
        "POST /v1/webhooks/{webhook}/replay": "replayWebhook",
        "POST /v1/webhooks/{webhook}/redeliver": "redeliverEvent",
        "GET /v1/webhooks/{webhook}/attempts": "listWebhookAttempts",
    ]

    /// The request body type of each route that takes one.
    public static var requestTypes: [String: any Decodable.Type] {
        var out: [String: any Decodable.Type] = [:]
        for op in operations { if let body = op.body { out[op.route] = body } }
        return out
    }

    /// The type of each route's JSON success answers.
    public static var answerTypes: [String: [Int: any Decodable.Type]] {
        var out: [String: [Int: any Decodable.Type]] = [:]
        for op in operations {
            for case .json(let status, _, let type) in op.answers { out[op.route, default: [:]][status] = type }
        }
        return out
    }

    /// The document.
    public static let json: JSONValue = build()

    static func build() -> JSONValue {
        var schemas = WireSchemas()
        var paths = JSONObject()
        for op in operations {
            guard let id = operationIDs[op.route] else { preconditionFailure("\(op.route) has no operationId") }
            var o: JSONObject = ["operationId": .string(id), "summary": .string(op.summary)]
            if let d = op.description { o["description"] = .string(d) }
            if let tag = op.tag { o["tags"] = [.string(tag.rawValue)] }
            if op.path.hasPrefix("/v1/") { o["security"] = [["bearer": .array([])]] }
            if !op.parameters.isEmpty { o["parameters"] = .array(op.parameters.map(\.json)) }
            if let body = op.body {
                o["requestBody"] = ["required": .bool(!op.bodyOptional), "content": ["application/json": ["schema": schemas.schema(body, .request)]]]
            }
            var responses = JSONObject()
            for answer in op.answers {
                switch answer {
                case .json(let status, let words, let type):
                    responses[String(status)] = ["description": .string(words), "content": ["application/json": ["schema": schemas.schema(type, .answer)]]]
                case .text(let status, let words):
                    responses[String(status)] = ["description": .string(words), "content": ["text/plain": ["schema": ["type": "string"]]]]
                case .empty(let status, let words):
                    responses[String(status)] = ["description": .string(words)]
                }
            }
            for status in op.refusals {
                let name = switch status {
                case 413: "TooLarge"
                case 429: "TooManyRequests"
                case 503: "Unavailable"
                default: "Error"
                }
                responses[String(status)] = ["$ref": .string("#/components/responses/\(name)")]
            }
            o["responses"] = .object(responses)
            var item = paths[op.path]?.objectValue ?? [:]
            item[op.method.rawValue] = .object(o)
            paths[op.path] = .object(item)
        }
        // The error envelope is the shared refusals' schema, under the name the refusals use.
        _ = schemas.schema(API.ErrorEnvelope.self, .answer)
        // What Isle POSTs to a webhook endpoint (OpenAPI 3.1 `webhooks`).
        let batch = schemas.schema(API.WebhookBatch.self, .answer)
        let webhooks: JSONValue = ["events": ["post": [
            "operationId": "receiveEvents", "summary": "Events, signed: what Isle POSTs to each webhook endpoint (docs/events.md). Answer 2xx within 10 s once they are stored.",
            "parameters": [["name": "Isle-Signature", "in": "header", "required": true, "schema": ["type": "string"],
                            "description": "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"t.body\"> (two v1 during a secret rotation's overlap)"]],
            "requestBody": ["required": true, "content": ["application/json": ["schema": batch]]],
            "responses": ["200": ["description": "Stored; the next events follow"]],
        ]]]
        var components = schemas.components
        if let envelope = components["ErrorEnvelope"] {
            components["ErrorEnvelope"] = nil
            components["Error"] = envelope
        }
        components["InstallationSecret"] = installationSecret
        let sortedComponents = JSONObject(components.keys.sorted().map { ($0, components[$0]!) })
        return ["openapi": "3.1.0", "info": info, "paths": .object(paths), "webhooks": webhooks,
                "components": ["securitySchemes": securitySchemes, "responses": responses, "headers": headers, "parameters": parameters, "schemas": .object(sortedComponents)]]
    }
}

extension API {
    /// `GET /openapi.json`: an OpenAPI 3.1 document (this one).
    public struct DocumentSummary: Codable, Sendable, WireDocumented {
        public var openapi: String
        public var info: DocumentInfo
        public var paths: [String: JSONObject]
        public var components: [String: JSONObject]
        public static var wireDescription: String? { "An OpenAPI 3.1 document: this one." }
    }

    public struct DocumentInfo: Codable, Sendable {
        public var title: String
        public var version: String
        public var description: String
    }
}
