import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// What a backend asks of the API beyond pushing: listing its activities, and refusing its own
/// mistakes (docs/server.md, "Listing activities" and "Strict requests").
@Suite("The backend's contract: listing activities, strict requests")
struct BackendContractTests {
    @Test("GET /v1/activities: filters by state, topic, installation, user and key prefix, pages by cursor without a gap or a repeat; bad parameters are a 400 naming them")
    func listActivities() async throws {
        try await ServerFixture.with { f in
            // 5 activities on two installations (the simulated phone holds 5 at once), one ended,
            // some on a topic; a user bound to the second installation.
            var ids: [String: String] = [:]
            var shown: [SimulatedActivity] = []
            for i in 0..<5 {
                let (a, id) = try await f.appStartsActivity(key: i == 4 ? "match-\(i)" : "order-\(i)", topics: i % 2 == 0 ? ["goals"] : [],
                                                            installation: i < 3 ? "fixture-phone" : "phone-b")
                ids["\(i)"] = id
                shown.append(a)
                f.clock.advance(by: 1)
            }
            #expect(try await f.call("PUT", "/v1/installations/phone-b/user", key: f.backendKey, body: ["userID": "user-9"]).status == 200)
            #expect(try await f.call("POST", "/v1/activities/\(ids["1"]!)/ended", key: f.deviceKey, headers: f.secretHeader()).status == 200)

            func list(_ query: String) async throws -> [String] {
                let answer = try await f.call("GET", "/v1/activities?\(query)", key: f.backendKey)
                #expect(answer.status == 200, "\(query): \(answer.json)")
                return answer.json["activities"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
            }
            func named(_ ns: [Int]) -> [String] { ns.map { ids["\($0)"]! } }
            // Newest first.
            #expect(try await list("") == named([4, 3, 2, 1, 0]))
            #expect(try await list("state=ended") == named([1]))
            #expect(try await list("state=active,ended") == named([4, 3, 2, 1, 0]))
            #expect(try await list("state=active") == named([4, 3, 2, 0]))
            #expect(try await list("topic=goals") == named([4, 2, 0]))
            #expect(try await list("installationID=phone-b") == named([4, 3]))
            #expect(try await list("userID=user-9") == named([4, 3]))
            #expect(try await list("keyPrefix=order-") == named([3, 2, 1, 0]))
            #expect(try await list("keyPrefix=order-&userID=user-9") == named([3]))
            #expect(try await list("topic=goals&userID=user-9&state=active") == named([4]))
            #expect(try await list("userID=nobody").isEmpty)
            // Each answer is an activity as GET /v1/activities/{id} shows it (without deliveries).
            let one = try await f.call("GET", "/v1/activities?keyPrefix=match-", key: f.backendKey).json["activities"]?.arrayValue?.first
            #expect(one?["externalKey"] == "match-4" && one?["topics"] == ["goals"] && one?["state"] == "active")

            // Paged by 2: every activity once, in order; the last page has no next.
            var paged: [String] = []
            var cursor: String?
            var pages = 0
            repeat {
                let answer = try await f.call("GET", "/v1/activities?limit=2" + (cursor.map { "&after=\($0)" } ?? ""), key: f.backendKey)
                #expect(answer.status == 200)
                paged += answer.json["activities"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
                cursor = answer.json["next"]?.stringValue
                pages += 1
            } while cursor != nil && pages < 10
            #expect(paged == named([4, 3, 2, 1, 0]))
            #expect(pages == 3)
            // An activity registered after the first page does not shift the pages behind it.
            let first = try await f.call("GET", "/v1/activities?limit=3", key: f.backendKey)
            try f.sim.world.userDismiss(activityID: shown[0].id, on: f.device)
            _ = try await f.appStartsActivity(key: "order-late")
            let rest = try await f.call("GET", "/v1/activities?limit=10&after=\(first.json["next"]?.stringValue ?? "")", key: f.backendKey)
            #expect(rest.json["activities"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == named([1, 0]))
            #expect(try await list("limit=1").count == 1)

            // Refusals name the parameter.
            for (query, field) in [("user=user-9", "user"), ("state=gone", "state"), ("state=active,", "state"), ("limit=0", "limit"), ("limit=1001", "limit"),
                                   ("after=!!!", "after"), ("keyPrefix=", "keyPrefix"), ("userID=a%00b", "userID"),
                                   ("topic=" + String(repeating: "t", count: 129), "topic")] {
                let answer = try await f.call("GET", "/v1/activities?\(query)", key: f.backendKey)
                #expect(answer.status == 400, "\(query)")
                #expect(answer.json["error"]?["field"]?.stringValue == field, "\(query): \(answer.json)")
            }
            // Well formed but not Isle's cursor: 422 naming it.
            let forged = try await f.call("GET", "/v1/activities?after=Zm9v", key: f.backendKey)
            #expect(forged.status == 422 && forged.json["error"]?["code"] == "invalidCursor" && forged.json["error"]?["field"] == "after")
            // A made-up cursor naming an id with NUL, or one too long: refused the same way.
            for id in ["\0", String(repeating: "x", count: 129)] {
                let cursor = Data("1.0|\(id)".utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
                #expect(try await f.call("GET", "/v1/activities?after=\(cursor)", key: f.backendKey).status == 422)
            }
            // A device key cannot list.
            #expect(try await f.call("GET", "/v1/activities", key: f.deviceKey).status == 403)
        }
    }

    @Test("Isle-Strict: true turns the validator's warnings into a 422 naming each finding and its fix, and nothing is queued; without it the same push is a 202 with the warnings")
    func strictRequests() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-strict", topics: ["goals"])
            // Unix time in a Date field (the phone would show it 31 years late).
            let unix: JSONValue = ["contentState": ["driverName": "Late", "deliveryTimer": [1_767_225_600, 1_767_227_400]]]
            let strict = [("Isle-Strict", "true")]
            for path in ["/v1/activities/\(id)/update", "/v1/activities/by-key/order-strict/update", "/v1/topics/goals/update"] {
                let refused = try await f.call("POST", path, key: f.backendKey, body: unix, headers: strict)
                #expect(refused.status == 422, "\(path): \(refused.json)")
                #expect(refused.json["error"]?["code"] == "validationWarnings")
                let findings = refused.json["error"]?["findings"]?.arrayValue ?? []
                #expect(findings.count >= 1)
                #expect(findings.allSatisfy { $0["code"]?.stringValue != nil && $0["fix"]?.stringValue?.isEmpty == false })
                #expect(findings.contains { $0["code"] == "unixTimeInDateField" && $0["field"]?.stringValue?.hasPrefix("contentState.deliveryTimer") == true })
                #expect(refused.json["error"]?["message"]?.stringValue?.contains("nothing was queued") == true)
            }
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.openJobs(bundleID: Pizza.bundleID, activityID: id, limit: 10).isEmpty)

            // A clean push passes strict; false and 0 are not strict; a bad value is a 400 naming the header.
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Fine")], headers: strict).status == 202)
            let lenient = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: unix, headers: [("Isle-Strict", "false")])
            #expect(lenient.status == 202)
            #expect(lenient.json["warnings"]?.arrayValue?.contains { $0["code"] == "unixTimeInDateField" } == true)
            let bad = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: unix, headers: [("Isle-Strict", "yes")])
            #expect(bad.status == 400 && bad.json["error"]?["field"] == "Isle-Strict")
        }
    }
}
