import Foundation
import IsleCore
import IsleHTTPAPI
import IsleStore
import IsleDelivery
import IsleWire

/// The console's HTML, server-rendered. Everything printed goes through `HTML.escape`.
enum ConsolePages {
    struct Query: Sendable {
        /// An external key or its beginning.
        var key = ""
        var state = ""
        var topic = ""
        var installation = ""
        var user = ""
    }

    struct Compose: Sendable {
        var event = "update"
        var body = ""
        var error: APIError?
        var result: String?
        /// The validator's warnings, shown for the operator to confirm (nothing queued yet).
        var warnings: [String] = []
        var confirmed = false
    }

    static func e(_ s: String) -> String { HTML.escape(s) }

    static func document(title: String, body: String) -> String {
        """
        <!doctype html>
        <html lang="en">
        <head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(e(title)) · Isle console</title><style>\(css)</style></head>
        <body><header class="top"><a href="/console">Isle console</a><nav><a href="/console/activities">Activities</a>
        <a href="/console/history">History</a><a href="/console/webhooks">Webhooks</a><a href="/console/audit">Audit log</a>
        <form method="post" action="/console/logout"><button type="submit" aria-label="Sign out">Sign out</button></form></nav></header>
        <main>\(body)</main></body></html>
        """
    }

    /// The only answer to a key that cannot sign in, whatever it is: unknown, revoked, or valid
    /// for another scope (the page never says which).
    static let refusedKey = "That key cannot sign in here: the console takes an admin key of this server that was not revoked."

    static func login(error: String?) -> String {
        var h = "<h1>Sign in</h1><p>The console takes an <b>admin</b> key: <code>isle key create --bundle-id … --scope admin</code>, or a read-only <b>viewer</b> key (<code>--scope viewer</code>).</p>"
        if let error { h += "<p class=\"error\" role=\"alert\">\(e(error))</p>" }
        h += """
        <form method="post" action="/console/login"><label for="key">Admin key</label>
        <input id="key" name="key" type="password" autocomplete="off" required>
        <button type="submit">Sign in</button></form>
        """
        return h
    }

    /// What a viewer's pages say instead of their actions.
    static let readOnlyNote = "<p class=\"muted\" id=\"read-only\">Read-only: this is a viewer key. Sending, ending, cancelling, pausing and webhooks need an admin key.</p>"

    /// What a console action says after its redirect: `?done=<code>`, with `&job=<id>` for a job.
    /// Only these texts can appear in the status box under the app's name — a link someone else
    /// made puts no words of its own there; an unknown code shows nothing.
    enum Notice: String, CaseIterable, Sendable {
        case jobCancelled, jobNotCancelled, jobRetried, jobNotRetried
        case appPaused, appPausedAlready, pauseNeedsReason, appResumed, appProbed
        case appSwitched, noSuchApp, switchNeedsSession
        case webhookDeleted, webhookNotFound, webhookDisabled, webhookEnabled

        /// Green for what was done, amber for a pause (nothing is sent), red for what was not done.
        var tone: ShownNotice.Tone {
            switch self {
            case .appPaused, .appPausedAlready: .warn
            case .jobNotCancelled, .jobNotRetried, .pauseNeedsReason, .noSuchApp, .switchNeedsSession, .webhookNotFound: .error
            default: .ok
            }
        }

        /// A notice about a job, whose id the link may carry.
        var aboutJob: Bool { self == .jobCancelled || self == .jobNotCancelled || self == .jobRetried || self == .jobNotRetried }

        /// The text. `job`: only a job the caller checked is the app's (else the text names none);
        /// `app`: the app the console looks at.
        func text(job: Int64?, app: String) -> String {
            let named = job.map { "Job \($0)" } ?? "The job"
            switch self {
            case .jobCancelled: return "\(named) cancelled."
            case .jobNotCancelled: return "\(named) was not cancelled: it is in flight, finished, or not this app's."
            case .jobRetried: return "\(named) goes now."
            case .jobNotRetried: return "\(named) was not retried: only a queued job can be sent now."
            case .appPaused: return "Paused: nothing is sent for the app until it is resumed."
            case .appPausedAlready: return "Was paused already; the reason is updated."
            case .pauseNeedsReason: return "Not paused: say why (up to 500 characters), for the audit log and the other operators."
            case .appResumed: return "Resumed: the app's pushes go again."
            case .appProbed: return "Not paused by an operator; a paused or backing-off app is probed now."
            case .appSwitched: return "Now looking at \(app)."
            case .noSuchApp: return "No such app on this server."
            case .switchNeedsSession: return "Switching needs a signed-in session."
            case .webhookDeleted: return "Webhook deleted."
            case .webhookNotFound: return "No such webhook of this app."
            case .webhookDisabled: return "Webhook disabled: nothing is sent to it until it is enabled."
            case .webhookEnabled: return "Webhook enabled: what waited is sent, in order."
            }
        }
    }

    static func dashboard(app: AppRecord, apps: [String], status: String, paused: Bool, environment: String, stats: JSONValue, queue: [PushJob], now: Date, notice: ShownNotice?, canAct: Bool,
                          keys: [String: String] = [:]) -> String {
        // A server-wide operator switches between the server's apps.
        let switcher = apps.isEmpty ? "" : """
            <form method="post" action="/console/switch" class="switch"><label for="app">App</label><select id="app" name="app">\(apps.map { "<option value=\"\(e($0))\"\($0 == app.bundleID ? " selected" : "")>\(e($0))</option>" }.joined())</select>
            <button type="submit" id="switch-app">Switch</button></form>
            """
        let control = !canAct ? readOnlyNote : paused
            ? "<form method=\"post\" action=\"/console/app/resume\" class=\"inline\"><button type=\"submit\" id=\"resume-app\">Resume the app</button></form>"
            : "<form method=\"post\" action=\"/console/app/pause\" class=\"pause\"><label for=\"reason\">Pause the app: nothing is sent until it is resumed. Why?</label><input id=\"reason\" name=\"reason\" maxlength=\"500\" required><button type=\"submit\" id=\"pause-app\">Pause the app</button></form>"
        // The app's own figures (ConsoleController.stats); the queue's read "at least" past the count's limit.
        let more = stats["queueMore"] == .bool(true)
        func n(_ k: String) -> String { (stats[k].map { $0.briefDescription } ?? "0") + (more && ["queued", "scheduled", "inFlight"].contains(k) ? "+" : "") }
        let rate = String(format: "%.1f", stats["rate"]?.numberValue?.doubleValue ?? 0)
        func stat(_ id: String, _ label: String, _ value: String) -> String { "<div><dt>\(label)</dt><dd id=\"\(id)\">\(value)</dd></div>" }
        return """
        \(switcher)<h1>\(e(app.bundleID))</h1>\(noticeLine(notice))
        <table class="facts"><tr><th>Team</th><td>\(e(app.teamID))</td></tr><tr><th>Key</th><td>\(e(app.keyID))</td></tr>
        <tr><th>APNs</th><td>\(e(environment))</td></tr><tr><th>Status</th><td id="status"\(paused ? " class=\"warn\"" : "")>\(e(status))</td></tr>
        <tr><th>Attributes types</th><td>\(e(app.schemas.map(\.attributesType).joined(separator: ", ")))</td></tr></table>
        \(control)
        <h2>Queue</h2>
        <dl class="stats" aria-live="polite">\(stat("queued", "Queued", n("queued")))\(stat("scheduled", "Scheduled", n("scheduled")))\(stat("inFlight", "In flight", n("inFlight")))\(stat("sent", "Sent, last hour", n("sent")))\(stat("rate", "Sent per second, last 5 min", rate))\(stat("failed", "Failed, last hour", n("failed")))\(stat("retried", "Retried, last hour", n("retried")))\(stat("superseded", "Superseded, last hour", n("superseded")))\(stat("dropped", "Dropped, last hour", n("dropped")))</dl>
        <p class="muted" id="stats-scope">\(e(app.bundleID))'s own figures: its open jobs now, and its deliveries as its history records them (written every few seconds).</p>
        \(queueTable(queue, now: now, back: "/console", showActivity: true, canAct: canAct, keys: keys, held: paused ? status : nil))
        \(searchForm(Query()))
        <script src="/console/console.js"></script>
        """
    }

    static func noticeLine(_ notice: ShownNotice?) -> String {
        guard let notice, !notice.text.isEmpty else { return "" }
        return "<p class=\"notice \(notice.tone.rawValue)\" role=\"status\" id=\"notice\">\(e(notice.text))</p>"
    }

    /// A notice's text and how it reads: done (green), a warning (amber: the app is paused), or
    /// not done (red).
    struct ShownNotice: Sendable {
        enum Tone: String, Sendable { case ok, warn, error }
        var text: String
        var tone: Tone
    }

    /// Unfinished jobs with what each waits for and until when; cancel (not in flight) and retry
    /// now (a queued job waiting for its time) when the operator may act (not a viewer).
    /// `keys`: activities' external keys by id (an activity is named by its key, as the backend
    /// knows it); `held`: why nothing of the app is sent now (a pause or a back-off), shown on every
    /// job not in flight.
    static func queueTable(_ queue: [PushJob], now: Date, back: String, showActivity: Bool, canAct: Bool, keys: [String: String] = [:], held: String? = nil) -> String {
        if queue.isEmpty { return "<p class=\"muted\" id=\"queue-empty\">Nothing waiting: every accepted push was sent or finished.</p>" }
        var h = "<table class=\"list queue\" id=\"queue\"><thead><tr><th>Job</th><th>Kind</th>\(showActivity ? "<th>Activity</th>" : "")<th>State</th><th>Due</th><th>Attempts</th><th>Why</th>\(canAct ? "<th></th>" : "")</tr></thead><tbody>"
        for j in queue {
            let isHeld = held != nil && j.state != .claimed && j.state != .scheduled
            let plain: String = switch j.state {
            case .scheduled: "scheduled"
            case .claimed: "in flight"
            default: j.runAt > now ? (j.attempts > 0 ? "waiting for retry" : "waiting") : "queued"
            }
            let state = isHeld ? "held" : plain
            h += "<tr data-job=\"\(j.id)\"><td>\(j.id)</td><td>\(e(j.kind.rawValue))</td>"
            if showActivity { h += "<td class=\"id\">\(j.activityID.map { "<a href=\"/console/activities/\(e($0))\">\(e(keys[$0] ?? $0))</a>" } ?? "—")</td>" }
            let why = isHeld ? [held!, j.lastError].compactMap { $0 }.joined(separator: "; last answer: ") : (j.lastError ?? "")
            h += "<td class=\"state\(isHeld ? " held" : "")\">\(e(state))</td><td>\(e(time(j.runAt)))</td><td>\(j.attempts)</td><td>\(e(why))</td>"
            guard canAct else {
                h += "</tr>"
                continue
            }
            h += "<td class=\"actions\">"
            if j.state != .claimed {
                h += "<form method=\"post\" action=\"/console/jobs/\(j.id)/cancel\"><input type=\"hidden\" name=\"back\" value=\"\(e(back))\"><button type=\"submit\" class=\"cancel\">Cancel</button></form>"
            }
            if j.state == .queued, j.runAt > now {
                h += "<form method=\"post\" action=\"/console/jobs/\(j.id)/retry\"><input type=\"hidden\" name=\"back\" value=\"\(e(back))\"><button type=\"submit\" class=\"retry\">Retry now</button></form>"
            }
            h += "</td></tr>"
        }
        return h + "</tbody></table>"
    }

    static func audit(_ entries: [AuditEntry], more: Int64?) -> String {
        var h = "<h1>Audit log</h1><p class=\"muted\">What was done in the console, newest first: which admin key, what, when.</p>"
        if entries.isEmpty { return h + "<p>Nothing yet.</p>" }
        h += "<table class=\"list\" id=\"audit\"><thead><tr><th>At</th><th>Admin key</th><th>Action</th><th>Target</th><th>Detail</th></tr></thead><tbody>"
        for a in entries {
            h += "<tr><td>\(e(time(a.at)))</td><td><code>\(e(a.keyID))</code></td><td class=\"action\">\(e(a.action))</td><td>\(e(a.target ?? ""))</td><td>\(e(a.detail ?? ""))</td></tr>"
        }
        h += "</tbody></table>"
        if let more { h += "<p><a href=\"/console/audit?before=\(more)\">Older</a></p>" }
        return h
    }

    static func webhooks(_ views: [JSONValue], notice: ShownNotice?, created: (id: String, secret: String)?, error: APIError?, canAct: Bool) -> String {
        var h = "<h1>Webhooks</h1>\(noticeLine(notice))<p class=\"muted\">Each receives the app's events, signed (docs/events.md).</p>"
        if let created {
            h += "<p class=\"ok\" role=\"status\" id=\"created\">Webhook \(e(created.id)) added. Its signing secret, shown only now: <code id=\"secret\">\(e(created.secret))</code></p>"
        }
        if let error { h += "<p class=\"error\" role=\"alert\"><b>\(e(error.code))</b>: \(e(error.message))</p>" }
        if views.isEmpty { h += "<p>No webhook yet.</p>" } else {
            h += "<table class=\"list\" id=\"webhooks\"><thead><tr><th>URL</th><th>Receives</th><th>Status</th><th>Delivered</th><th>Waiting</th><th>Failure</th><th>Recent attempts</th>\(canAct ? "<th></th>" : "")</tr></thead><tbody>"
            for v in views {
                let id = v["id"]?.stringValue ?? ""
                var failure = ""
                if let f = v["failure"] {
                    let status = f["status"]?.numberValue?.int64Value ?? 0
                    failure = "\(status == 0 ? "no answer" : "HTTP \(status)"): \(f["error"]?.stringValue ?? ""); \(f["attempts"]?.briefDescription ?? "0") attempts"
                    if let next = f["nextAttemptAt"]?.numberValue?.doubleValue { failure += "; next at \(time(Date(timeIntervalSince1970: next)))" }
                }
                if let reason = v["disabledReason"]?.stringValue { failure = reason + (failure.isEmpty ? "" : "; " + failure) }
                let receives = v["eventTypes"]?.arrayValue.map { $0.compactMap(\.stringValue).joined(separator: ", ") } ?? "every type"
                var attempts = ""
                for a in v["attempts"]?.arrayValue ?? [] {
                    let status = a["status"]?.numberValue?.int64Value ?? 0
                    let at = (a["at"]?.numberValue?.doubleValue).map { time(Date(timeIntervalSince1970: $0)) } ?? ""
                    attempts += "<li>\(e(at)) \(status == 0 ? "no answer" : "HTTP \(status)") · \(a["events"]?.briefDescription ?? "0") event(s) · \(a["latencyMS"]?.briefDescription ?? "") ms\(a["kind"] == "redelivery" ? " · redelivery" : "")</li>"
                }
                let enabled = v["enabled"] != .bool(false)
                h += "<tr data-webhook=\"\(e(id))\"><td>\(e(v["url"]?.stringValue ?? ""))</td><td class=\"receives\">\(e(receives))</td><td class=\"status \(e(v["status"]?.stringValue ?? ""))\">\(e(v["status"]?.stringValue ?? ""))</td><td>\(v["delivered"]?.briefDescription ?? "0")</td>"
                h += "<td>\(v["waiting"]?.briefDescription ?? "0")\(v["waitingMore"] == .bool(true) ? "+" : "")</td><td class=\"failure\">\(e(failure))</td>"
                h += "<td class=\"attempts\">\(attempts.isEmpty ? "none yet" : "<ul>\(attempts)</ul>")</td>"
                h += canAct ? """
                    <td><form method="post" action="/console/webhooks/\(e(id))/enabled"><input type="hidden" name="enabled" value="\(enabled ? "false" : "true")">\
                    <button type="submit" class="\(enabled ? "disable" : "enable")">\(enabled ? "Disable" : "Enable")</button></form>\
                    <form method="post" action="/console/webhooks/\(e(id))/delete"><button type="submit" class="delete">Delete</button></form></td></tr>
                    """ : "</tr>"
            }
            h += "</tbody></table>"
        }
        guard canAct else { return h + readOnlyNote }
        h += """
        <h2>Add a webhook</h2>
        <form method="post" action="/console/webhooks"><label for="url">URL</label><input id="url" name="url" placeholder="https://backend.example.com/isle-events" required>
        <fieldset><legend>Receives (none ticked: every type)</legend>\(EventType.allCases.map { "<label class=\"check\"><input type=\"checkbox\" name=\"type.\($0.rawValue)\"> \($0.rawValue)</label>" }.joined())</fieldset>
        <button type="submit">Add</button></form>
        """
        return h
    }

    /// Polls `/console/stats` every two seconds; the server gives the rate (from the app's history,
    /// which is written every few seconds: differences between polls would jump). Served as
    /// `/console/console.js`: the pages' CSP allows scripts from the console's origin only, never inline.
    static let liveStats = """
    (() => {
      const queue = ['queued', 'scheduled', 'inFlight'];
      async function poll() {
        try {
          const r = await fetch('/console/stats', { credentials: 'same-origin' });
          if (!r.ok) return;
          const s = await r.json();
          for (const k of ['queued', 'scheduled', 'inFlight', 'sent', 'failed', 'retried', 'superseded', 'dropped']) {
            const el = document.getElementById(k); if (el) el.textContent = String(s[k]) + (s.queueMore && queue.includes(k) ? '+' : '');
          }
          const rate = document.getElementById('rate'); if (rate) rate.textContent = Number(s.rate).toFixed(1);
        } catch (e) {}
      }
      poll(); setInterval(poll, 2000);
    })();
    """

    static func searchForm(_ q: Query) -> String {
        let states = [""] + ActivityRecordState.allCases.map(\.rawValue)
        return """
        <form class="search" method="get" action="/console/activities" role="search">
        <label for="key">External key (or its beginning)</label><input id="key" name="key" value="\(e(q.key))">
        <label for="state">State</label><select id="state" name="state">\(states.map { "<option value=\"\(e($0))\"\($0 == q.state ? " selected" : "")>\($0.isEmpty ? "any" : e($0))</option>" }.joined())</select>
        <label for="topic">Topic</label><input id="topic" name="topic" value="\(e(q.topic))">
        <label for="installation">Installation</label><input id="installation" name="installation" value="\(e(q.installation))">
        <label for="user">User</label><input id="user" name="user" value="\(e(q.user))">
        <button type="submit">Find</button></form>
        """
    }

    static func search(_ q: Query, results: [ActivityRecord]) -> String {
        var h = "<h1>Activities</h1>" + searchForm(q)
        if q.key.isEmpty, q.topic.isEmpty, q.installation.isEmpty, q.user.isEmpty { h += "<p class=\"muted\">The newest 100\(q.state.isEmpty ? "" : " " + e(q.state)); find others by external key (or its beginning), topic, installation or user.</p>" }
        if results.isEmpty { return h + "<p>No activity matches.</p>" }
        h += "<table class=\"list\" id=\"results\"><thead><tr><th>External key</th><th>Type</th><th>State</th><th>Installation</th><th>Started</th><th>Topics</th></tr></thead><tbody>"
        for a in results {
            h += "<tr><td><a href=\"/console/activities/\(e(a.id))\">\(e(a.externalKey ?? a.id))</a></td><td>\(e(a.attributesType))</td><td>\(e(a.state.rawValue))</td><td>\(e(a.installationID ?? "—"))</td>"
            h += "<td>\(e(time(a.startedAt)))</td><td>\(e(a.topics.joined(separator: ", ")))</td></tr>"
        }
        return h + "</tbody></table>"
    }

    static func activity(_ a: ActivityRecord, deliveries: [DeliveryRecord], queue: [PushJob], budget: API.Budget, now: Date, compose: Compose, notice: ShownNotice?, canAct: Bool,
                         unsent: [PushJob] = []) -> String {
        var h = "<h1>\(e(a.externalKey ?? a.id))</h1>\(noticeLine(notice))<table class=\"facts\">"
        h += "<tr><th>Activity</th><td>\(e(a.id))</td></tr><tr><th>Type</th><td>\(e(a.attributesType))</td></tr>"
        h += "<tr><th>State</th><td>\(e(a.state.rawValue))\(a.stateReason.map { ": " + e($0) } ?? "")</td></tr>"
        h += "<tr><th>APNs environment</th><td>\(e(a.environment?.rawValue ?? "the server's default"))</td></tr>"
        let whose = budget.per == .installation ? "the app on this phone: all its activities and channels together, as a phone may count it" : "this activity alone"
        h += "<tr><th>Priority 10, last hour</th><td id=\"budget\">\(budget.used) of \(budget.limit)\(budget.used >= budget.limit ? ": spent; further pushes go at priority 5 until the hour rolls on" : "") <span class=\"muted\" id=\"budget-per\">(counted for \(whose))</span></td></tr>"
        h += "<tr><th>Content</th><td><code>\(e(a.content?.jsonString ?? "—"))</code></td></tr></table>"
        h += "<h2>Queue</h2>" + queueTable(queue, now: now, back: "/console/activities/\(a.id)", showActivity: false, canAct: canAct)
        if canAct, a.state.acceptsPushes {
            h += "<form method=\"post\" action=\"/console/activities/\(e(a.id))/end\" class=\"inline\"><button type=\"submit\" id=\"end-activity\">End this activity now</button></form>"
        }
        h += "<h2>Timeline</h2>"
        if deliveries.isEmpty { h += "<p class=\"muted\">Nothing sent yet.</p>" }
        else {
            h += "<table class=\"list timeline\"><thead><tr><th>At</th><th>Job</th><th>Attempt</th><th>Priority</th><th>Status</th><th>Reason</th><th>Latency</th><th>apns-id</th></tr></thead><tbody>"
            var attempts: [Int64: Int] = [:]
            for d in deliveries {
                attempts[d.jobID, default: 0] += 1
                let priority = "\(d.priority.rawValue)\(d.downgraded ? " (downgraded from 10)" : "")"
                // What the device did, when the APNs says (isle sim): a 200 the device throttled or
                // ignored is not shown as a plain success.
                let note = d.deviceNote
                let deviceDidIt = note.map { n in ["applied:", "started:", "ended:", "widgetsReloaded:"].contains { n.hasPrefix($0) } } ?? true
                h += "<tr class=\"s\(d.status)\(deviceDidIt ? "" : " device-warn")\"><td>\(e(time(d.at)))</td><td>\(d.jobID)</td><td>\(attempts[d.jobID]!)</td><td>\(e(priority))</td>"
                h += "<td class=\"status\">\(d.status == 0 ? "no answer" : String(d.status))</td><td>\(e(d.reason ?? ""))\(note.map { "<span class=\"device\(deviceDidIt ? " muted" : " warn")\">device: \(e($0))</span>" } ?? "")</td><td>\(String(format: "%.1f", d.latencyMS)) ms</td><td><code>\(e(d.apnsID?.text ?? ""))</code></td></tr>"
            }
            h += "</tbody></table>"
        }
        // What was accepted and never sent: superseded by newer content, or dropped (an operator's
        // cancel, a push past its time) — the timeline alone would not show them.
        if !unsent.isEmpty {
            h += "<h2>Not sent</h2><table class=\"list unsent\" id=\"unsent\"><thead><tr><th>Accepted</th><th>Job</th><th>Kind</th><th>State</th><th>Why</th></tr></thead><tbody>"
            for j in unsent {
                h += "<tr data-job=\"\(j.id)\"><td>\(e(time(j.createdAt)))</td><td>\(j.id)</td><td>\(e(j.kind.rawValue))</td><td class=\"state\">\(e(j.state.rawValue))</td><td>\(e(j.lastError ?? ""))</td></tr>"
            }
            h += "</tbody></table>"
        }
        guard canAct else { return h + readOnlyNote }
        h += "<h2>Send an update or end</h2>"
        if let error = compose.error {
            h += "<p class=\"error\" role=\"alert\"><b>\(e(error.code))</b>\(error.field.map { " (" + e($0) + ")" } ?? ""): \(e(error.message))</p>"
        }
        if let result = compose.result { h += "<p class=\"ok\" role=\"status\" id=\"compose-result\">\(e(result))</p>" }
        if !compose.warnings.isEmpty {
            h += "<div class=\"error\" role=\"alert\" id=\"warnings\"><p><b>Not queued.</b> The validator warns:</p><ul>"
            for w in compose.warnings {
                let lines = w.split(separator: "\n", maxSplits: 1).map(String.init)
                h += "<li>\(e(lines[0]))\(lines.count > 1 ? "<br><span class=\"muted fix\">\(e(lines[1]))</span>" : "")</li>"
            }
            h += "</ul><p>Fix the request, or tick the box below to queue it as it is.</p></div>"
        }
        let example = #"{"contentState": {}, "alert": {"title": "…", "body": "…"}, "priority": 10}"#
        h += """
        <form method="post" action="/console/activities/\(e(a.id))/compose">
        <label for="event">Event</label><select id="event" name="event"><option value="update"\(compose.event == "update" ? " selected" : "")>update</option>
        <option value="end"\(compose.event == "end" ? " selected" : "")>end</option></select>
        <label for="body">Request (as for POST /v1/activities/{id}/update)</label>
        <textarea id="body" name="body" rows="8" placeholder="\(e(example))">\(e(compose.body))</textarea>
        \(compose.warnings.isEmpty ? "" : "<label class=\"confirm\"><input type=\"checkbox\" name=\"confirm\" id=\"confirm\"> Queue it despite these warnings</label>")
        <button type="submit">Validate and queue</button></form>
        """
        return h
    }

    static func time(_ d: Date) -> String { ISO8601DateFormatter().string(from: d) }

    static let css = """
    label.check { display: inline-block; margin: 0 1.2em .2em 0; white-space: nowrap; font-weight: normal }
    td.attempts ul { margin: 0; padding-left: 1em }
    :root { color-scheme: light dark; --fg: #1c1c1e; --bg: #fff; --muted: #6e6e73; --line: #d1d1d6; --err: #c0392b; --ok: #1e8449; --warn: #a8650a; }
    @media (prefers-color-scheme: dark) { :root { --fg: #f2f2f7; --bg: #1c1c1e; --muted: #aeaeb2; --line: #3a3a3c; --err: #ff6b5b; --ok: #5ad17a; --warn: #f0a73a; } }
    body { margin: 0; font: 15px/1.4 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
    .top { display: flex; flex-wrap: wrap; gap: 8px 16px; justify-content: space-between; align-items: center; padding: 10px 16px; border-bottom: 1px solid var(--line); }
    .top nav { display: flex; flex-wrap: wrap; gap: 8px 12px; align-items: center; }
    .top form { margin: 0; }
    main { padding: 16px; max-width: 1100px; }
    a { color: #0a84ff; }
    table { border-collapse: collapse; width: 100%; margin: 8px 0 16px; }
    th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; overflow-wrap: break-word; }
    th, button, td.status, td.state { white-space: nowrap; } td code, td.id { overflow-wrap: anywhere; }
    .facts th { width: 160px; color: var(--muted); font-weight: 500; }
    .stats { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 8px; margin: 8px 0 16px; }
    .stats > div { border: 1px solid var(--line); border-radius: 8px; padding: 8px 10px; }
    .stats dt { color: var(--muted); } .stats dd { margin: 0; font-size: 22px; font-variant-numeric: tabular-nums; }
    td.actions, .queue th, .queue td:nth-child(-n+2) { white-space: nowrap; overflow-wrap: normal; } td.actions form, form.inline { display: inline-block; margin: 0 4px 0 0; }
    label.confirm { display: flex; gap: 6px; align-items: center; }
    form.switch { grid-template-columns: auto 1fr auto; align-items: center; max-width: 520px; }
    #audit td:nth-child(-n+3), #audit th { white-space: nowrap; overflow-wrap: normal; }
    nav.ranges { display: flex; gap: 12px; margin: 0 0 12px; }
    figure.chart { margin: 0 0 16px; } figure.chart svg { width: 100%; max-width: 720px; height: auto; display: block; }
    figure.chart text { font-size: 11px; fill: var(--muted); } figure.chart .axis { stroke: var(--muted); } figure.chart .grid { stroke: var(--line); stroke-dasharray: 3 3; }
    figcaption .key { margin-right: 14px; } figcaption .key i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
    form { display: grid; gap: 6px; max-width: 720px; margin: 12px 0; }
    form.search { grid-template-columns: auto 1fr; align-items: center; }
    input, select, textarea, button { font: inherit; padding: 6px 8px; border: 1px solid var(--line); border-radius: 6px; background: transparent; color: inherit; }
    button { cursor: pointer; justify-self: start; }
    textarea { font-family: ui-monospace, monospace; }
    .error { color: var(--err); } .ok { color: var(--ok); } .warn { color: var(--warn); } .muted { color: var(--muted); }
    p.notice { padding: 6px 10px; border-left: 4px solid currentColor; }
    tr.s200 .status { color: var(--ok); } tr.s200.device-warn .status { color: var(--warn); } span.device { display: block; font-size: 13px; } tr[class^="s4"] .status { color: var(--err); } tr[class^="s5"] .status, tr.s0 .status { color: var(--warn); }
    td.status.failing { color: var(--err); } td.status.stopped, td.status.disabled, td.state.held { color: var(--warn); }
    @media (max-width: 600px) { .timeline th:nth-child(8), .timeline td:nth-child(8) { display: none; } form.search { grid-template-columns: 1fr; }
      table.list { display: block; overflow-x: auto; } main { padding: 12px; } .facts th { width: auto; } }
    """
}
