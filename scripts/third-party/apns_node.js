// A backend's APNs sender in Node.js with nothing but the standard library: `http2` over TLS
// trusting only the given CA, an ES256 provider token from `crypto` (raw r||s signature).
// It speaks APNs only — no Isle code, no simulator control API. No npm packages.
//
// Configuration (environment): APNS_URL, APNS_BROADCAST_URL, APNS_MANAGEMENT_URL, APNS_CA (PEM),
// APNS_KEY (.p8), APNS_KEY_ID, APNS_TEAM_ID, APNS_BUNDLE_ID, CLIENT_LABEL.
//
// Commands on stdin, one a line (the tokens reach a backend from the app):
//     start <push-to-start token>    update <update token>    end <update token>
//     widgets <widget push token>    channel                  broadcast <channel id>
// For each it prints `<command> <status> <apns-id | channel id | apns-request-id> [outcome]`, and
// exits 1 on an answer other than 200 (201 for `channel`).
//
//     printf 'start 0a1b…\n' | APNS_URL=… node apns_node.js
'use strict';
const http2 = require('http2');
const crypto = require('crypto');
const fs = require('fs');
const readline = require('readline');

const env = process.env;
const LABEL = env.CLIENT_LABEL || 'node';
const BUNDLE = env.APNS_BUNDLE_ID;
const APPLE_EPOCH = 978307200; // a Swift Date in a ContentState counts from 2001-01-01
const CA = fs.readFileSync(env.APNS_CA);

function b64url(data) {
  return Buffer.from(data).toString('base64').replace(/=+$/, '').replace(/\+/g, '-').replace(/\//g, '_');
}

// One provider token for the run, shared by every connection: header exactly {alg, kid}.
const TOKEN = (() => {
  const input = b64url(JSON.stringify({ alg: 'ES256', kid: env.APNS_KEY_ID })) + '.' +
    b64url(JSON.stringify({ iss: env.APNS_TEAM_ID, iat: Math.floor(Date.now() / 1000) }));
  const key = crypto.createPrivateKey(fs.readFileSync(env.APNS_KEY));
  const signature = crypto.sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' });
  return input + '.' + b64url(signature);
})();

// One HTTP/2 session per APNs host, kept for the run.
const sessions = new Map();
function session(base) {
  let s = sessions.get(base);
  if (!s || s.closed || s.destroyed) {
    s = http2.connect(base, { ca: CA, minVersion: 'TLSv1.2' });
    s.on('error', (e) => { console.error(`${base}: ${e.message}`); process.exit(1); });
    sessions.set(base, s);
  }
  return s;
}

function send(base, path, headers, body) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const req = session(base).request({
      ':method': 'POST', ':path': path, authorization: `bearer ${TOKEN}`,
      'content-type': 'application/json', 'content-length': data.length, ...headers,
    });
    req.setTimeout(15000, () => { req.close(http2.constants.NGHTTP2_CANCEL); reject(new Error(`${base}${path}: no answer in 15 s`)); });
    let answer = {};
    const chunks = [];
    req.on('response', (h) => { answer = h; });
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve({ status: answer[':status'], headers: answer, body: Buffer.concat(chunks).toString() }));
    req.on('error', reject);
    req.end(data);
  });
}

let lastTimestamp = 0;
function timestamp() { // seconds, strictly increasing from step to step
  lastTimestamp = Math.max(Math.floor(Date.now() / 1000), lastTimestamp + 1);
  return lastTimestamp;
}
function state(step) {
  const now = Math.floor(Date.now() / 1000) - APPLE_EPOCH;
  return { driverName: `${LABEL} ${step}`, deliveryTimer: [now, now + 1800] };
}
function devicePush(pushType, token, aps) {
  const suffix = { liveactivity: '.push-type.liveactivity', widgets: '.push-type.widgets' }[pushType];
  return send(env.APNS_URL, `/3/device/${token}`,
    { 'apns-push-type': pushType, 'apns-topic': BUNDLE + suffix, 'apns-priority': '10' }, { aps });
}

async function run(command, args) {
  switch (command) {
    case 'start': {
      const r = await devicePush('liveactivity', args[0], {
        timestamp: timestamp(), event: 'start',
        alert: { title: 'Order confirmed', body: `${LABEL} is on it` },
        'attributes-type': 'PizzaDeliveryAttributes',
        attributes: { numberOfPizzas: 2, totalAmount: '$21.00', orderNumber: LABEL },
        'content-state': state('start'), 'input-push-token': 1,
      });
      return [r, 200, r.headers['apns-id']];
    }
    case 'update': {
      const r = await devicePush('liveactivity', args[0], {
        timestamp: timestamp(), event: 'update', 'content-state': state('update'),
        alert: { title: 'On the way', body: `${LABEL} is driving` },
      });
      return [r, 200, r.headers['apns-id']];
    }
    case 'end': {
      const t = timestamp();
      const r = await devicePush('liveactivity', args[0], { timestamp: t, event: 'end', 'content-state': state('end'), 'dismissal-date': t + 3600 });
      return [r, 200, r.headers['apns-id']];
    }
    case 'widgets': {
      const r = await devicePush('widgets', args[0], { 'content-changed': true });
      return [r, 200, r.headers['apns-id']];
    }
    case 'channel': {
      const r = await send(env.APNS_MANAGEMENT_URL, `/1/apps/${BUNDLE}/channels`, {}, { 'message-storage-policy': 0, 'push-type': 'LiveActivity' });
      return [r, 201, r.headers['apns-channel-id']];
    }
    case 'broadcast': {
      const r = await send(env.APNS_BROADCAST_URL, `/4/broadcasts/apps/${BUNDLE}`,
        { 'apns-channel-id': args[0], 'apns-push-type': 'liveactivity', 'apns-priority': '10', 'apns-expiration': '0' },
        { aps: { timestamp: timestamp(), event: 'update', 'content-state': state('broadcast') } });
      return [r, 200, r.headers['apns-request-id']];
    }
    default:
      throw new Error(`unknown command ${command}`);
  }
}

async function main() {
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  for await (const line of lines) {
    const words = line.trim().split(/\s+/).filter(Boolean);
    if (words.length === 0) continue;
    if (words[0] === 'quit') break;
    const [answer, expected, found] = await run(words[0], words.slice(1));
    let value = found;
    const ok = answer.status === expected && Boolean(found);
    if (!ok) {
      try { value = JSON.parse(answer.body).reason || '-'; } catch { value = '-'; }
    }
    process.stdout.write(`${words[0]} ${answer.status} ${value} ${answer.headers['isle-sim-outcome'] || ''}\n`);
    if (!ok) {
      console.error(`${words[0]}: APNs answered ${answer.status} ${answer.body}`);
      process.exit(1);
    }
  }
  for (const s of sessions.values()) s.close();
}

main().catch((e) => { console.error(e.stack || String(e)); process.exit(1); });
