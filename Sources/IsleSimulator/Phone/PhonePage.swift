import Foundation
import Hummingbird
import IsleCore
import IsleHTTPAPI
import NIOCore
import ServiceLifecycle

/// `GET /phone/{device}`: a page that shows a simulated iPhone and keeps it current with
/// server-sent events (`GET /phone/{device}/stream`, one `screen` event per change). Everything is
/// served from the binary: no CDN, no build step; the script only swaps in the server-rendered
/// HTML and keeps countdowns moving.
enum PhonePage {
    static func routes(_ router: Router<BasicRequestContext>, world: SimulatorWorld) {
        router.get("phone/:device") { _, context in
            let id = try context.parameters.require("device")
            let body = try render(world, id)
            return Response(status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store"],
                            body: .init(byteBuffer: ByteBuffer(string: document(title: "Isle · \(id)", body: body))))
        }
        router.get("phone/:device/stream") { _, context in
            let id = try context.parameters.require("device")
            _ = try render(world, id)
            let changes = world.changes.subscribe(device: id)
            return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-store"], body: ResponseBody { writer in
                try await writer.write(ByteBuffer(string: event(try render(world, id))))
                // Ends when the client goes away (the write throws) or the server shuts down.
                for await _ in changes.cancelOnGracefulShutdown() {
                    guard let html = try? render(world, id) else { break }
                    try await writer.write(ByteBuffer(string: event(html)))
                }
                try await writer.finish(nil)
            })
        }
    }

    static func render(_ world: SimulatorWorld, _ id: String) throws -> String {
        do {
            let device = try world.device(id)
            let screen = try world.screen(deviceID: id)
            return PhoneRenderer(device: device, screen: screen, realTime: !(world.clock is ManualWallClock)).body()
        } catch {
            throw APIError.notFound("device \(id)")
        }
    }

    /// One server-sent event; a line break inside the HTML becomes another `data:` line.
    static func event(_ html: String) -> String {
        "event: screen\n" + html.split(separator: "\n", omittingEmptySubsequences: false).map { "data: \($0)\n" }.joined() + "\n"
    }

    static func document(title: String, body: String) -> String {
        """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>\(HTML.escape(title))</title>
        <style>\(css)</style>
        </head>
        <body>
        <main id="phone" aria-live="polite">\(body)</main>
        <script>\(script)</script>
        </body>
        </html>
        """
    }

    static let css = """
    :root { color-scheme: light dark; --bg: #f2f2f7; --fg: #1c1c1e; --card: rgba(255,255,255,.85); --muted: #6e6e73; --accent: #ff9f0a; }
    @media (prefers-color-scheme: dark) { :root { --bg: #000; --fg: #f2f2f7; --card: rgba(44,44,46,.9); --muted: #aeaeb2; } }
    * { box-sizing: border-box; }
    body { margin: 0; font: 15px/1.35 -apple-system, system-ui, sans-serif; background: var(--bg); color: var(--fg); }
    .device { display: flex; flex-wrap: wrap; gap: 24px; padding: 16px; align-items: flex-start; }
    .screen { width: 100%; max-width: 390px; min-height: 720px; border-radius: 44px; padding: 14px; background: linear-gradient(160deg, #3a4a7a, #1b2238); color: #fff; position: relative; }
    .status { display: flex; justify-content: space-between; font-size: 12px; opacity: .8; padding: 4px 18px 10px; }
    .island { margin: 0 auto 16px; min-height: 36px; width: 126px; border-radius: 20px; background: #000; display: flex; justify-content: space-between; align-items: center; padding: 0 12px; font-size: 13px; }
    .island.compact { width: 250px; }
    .island.minimal { width: 250px; background: transparent; }
    .island.minimal .minimal { background: #000; border-radius: 18px; padding: 8px 12px; }
    .island.expanded { width: 100%; border-radius: 32px; display: block; padding: 14px 18px; }
    .banner { background: var(--card); color: var(--fg); border-radius: 16px; padding: 10px 14px; margin-bottom: 10px; }
    .activity, .widget { background: var(--card); color: var(--fg); border-radius: 20px; padding: 12px 16px; margin-bottom: 10px; }
    .activity h3 { margin: 0 0 4px; font-size: 16px; }
    .activity p { margin: 2px 0; }
    .activity.stale { opacity: .7; }
    .activity.ended { filter: grayscale(1); opacity: .75; }
    .note { color: var(--muted); font-size: 12px; }
    .timer { font-variant-numeric: tabular-nums; color: var(--accent); font-weight: 600; }
    .empty { color: #c7c7cc; text-align: center; }
    dl { display: grid; grid-template-columns: auto 1fr; gap: 0 10px; margin: 4px 0; font-size: 13px; }
    dt { color: var(--muted); }
    dd { margin: 0; overflow-wrap: anywhere; }
    .widgets { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
    .device.ipad .screen { max-width: 720px; }
    .elsewhere { display: grid; grid-template-columns: repeat(auto-fit, minmax(180px, 1fr)); gap: 10px; margin: 12px 0; }
    .surface { background: var(--card); border-radius: 16px; padding: 10px 14px; }
    .surface h3 { margin: 0 0 6px; font-size: 13px; }
    .widget header { font-size: 12px; color: var(--muted); }
    .log { flex: 1; min-width: 280px; max-width: 720px; }
    .log h2 { font-size: 16px; }
    .log ol { padding-left: 0; list-style: none; margin: 0; }
    .log li { padding: 6px 0; border-bottom: 1px solid rgba(128,128,128,.25); font-size: 13px; }
    .log time { color: var(--muted); font-variant-numeric: tabular-nums; }
    .log .code { font-weight: 600; }
    """

    /// Swaps in each `screen` event and keeps countdowns moving: with the simulator's clock in real
    /// time, from the browser's clock (corrected by the simulator's); on a virtual clock, frozen at
    /// the simulator's time until it is advanced.
    static let script = """
    (() => {
      const phone = document.getElementById('phone');
      let skew = 0, frozen = false, simNow = 0;
      function sync() {
        const d = phone.querySelector('.device');
        if (!d) return;
        simNow = Number(d.dataset.now) * 1000;
        skew = simNow - Date.now();
        frozen = d.dataset.clock === 'virtual';
      }
      function tick() {
        const now = frozen ? simNow : Date.now() + skew;
        for (const t of phone.querySelectorAll('time.timer')) {
          const s = Math.max(0, Math.round(Number(t.dataset.end) - now / 1000));
          t.textContent = Math.floor(s / 60) + ':' + String(s % 60).padStart(2, '0');
        }
      }
      sync(); tick(); setInterval(tick, 1000);
      const source = new EventSource(location.pathname.replace(/\\/$/, '') + '/stream');
      source.addEventListener('screen', (e) => { phone.innerHTML = e.data; sync(); tick(); });
    })();
    """
}
