// A backend's APNs sender in Java 17 with nothing but the JDK: java.net.http.HttpClient over
// HTTP/2, TLS trusting only the given CA (PEM), an ES256 provider token from java.security (the DER
// ECDSA signature turned into JOSE's raw r||s). It speaks APNs only — no Isle code, no simulator
// control API, no libraries. Run as a single-file source program:
//
//     printf 'start 0a1b…\n' | APNS_URL=… java ApnsJava.java
//
// Configuration (environment): APNS_URL, APNS_BROADCAST_URL, APNS_MANAGEMENT_URL, APNS_CA (PEM),
// APNS_KEY (.p8), APNS_KEY_ID, APNS_TEAM_ID, APNS_BUNDLE_ID, CLIENT_LABEL.
//
// Commands on stdin, one a line (the tokens reach a backend from the app):
//     start <push-to-start token>    update <update token>    end <update token>
//     widgets <widget push token>    channel                  broadcast <channel id>
// For each it prints `<command> <status> <apns-id | channel id | apns-request-id> [outcome]`, and
// exits 1 on an answer other than 200 (201 for `channel`).

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.math.BigInteger;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.util.Base64;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

public class ApnsJava {
    static final long APPLE_EPOCH = 978307200L; // a Swift Date in a ContentState counts from 2001-01-01
    static String label, bundle, token;
    static HttpClient http;
    static long lastTimestamp = 0;

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) { System.err.println(name + " is not set"); System.exit(2); }
        return v;
    }

    /** Trust exactly the certificates in the PEM file (the simulator's CA), nothing else. */
    static SSLContext trusting(String caPath) throws Exception {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        try (InputStream in = new FileInputStream(caPath)) {
            int i = 0;
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) store.setCertificateEntry("ca-" + i++, c);
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(store);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        return ctx;
    }

    static String b64url(byte[] b) { return Base64.getUrlEncoder().withoutPadding().encodeToString(b); }

    /** A DER ECDSA signature (SEQUENCE { INTEGER r, INTEGER s }) as JOSE's 64 bytes r||s. */
    static byte[] derToRaw(byte[] der) {
        int i = 0;
        if (der[i++] != 0x30) throw new IllegalArgumentException("not a DER sequence");
        int len = der[i++] & 0xff;
        if (len == 0x81) i++; // long form length (never more than one byte for P-256)
        byte[] out = new byte[64];
        for (int part = 0; part < 2; part++) {
            if (der[i++] != 0x02) throw new IllegalArgumentException("not a DER integer");
            int n = der[i++] & 0xff;
            byte[] v = new byte[n];
            System.arraycopy(der, i, v, 0, n);
            i += n;
            byte[] fixed = new BigInteger(1, v).toByteArray(); // big-endian, maybe a leading 0
            int copy = Math.min(fixed.length, 32);
            System.arraycopy(fixed, fixed.length - copy, out, part * 32 + 32 - copy, copy);
        }
        return out;
    }

    static String providerToken(String keyPath, String keyID, String teamID) throws Exception {
        String pem = Files.readString(Path.of(keyPath)).replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        PrivateKey key = KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(Base64.getDecoder().decode(pem)));
        String input = b64url(("{\"alg\":\"ES256\",\"kid\":\"" + keyID + "\"}").getBytes(StandardCharsets.UTF_8)) + "."
            + b64url(("{\"iss\":\"" + teamID + "\",\"iat\":" + System.currentTimeMillis() / 1000 + "}").getBytes(StandardCharsets.UTF_8));
        Signature signer = Signature.getInstance("SHA256withECDSA");
        signer.initSign(key);
        signer.update(input.getBytes(StandardCharsets.US_ASCII));
        return input + "." + b64url(derToRaw(signer.sign()));
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static long timestamp() { // seconds, strictly increasing from step to step
        lastTimestamp = Math.max(System.currentTimeMillis() / 1000, lastTimestamp + 1);
        return lastTimestamp;
    }

    static String state(String step) {
        long now = System.currentTimeMillis() / 1000 - APPLE_EPOCH;
        return "{\"driverName\":" + quote(label + " " + step) + ",\"deliveryTimer\":[" + now + "," + (now + 1800) + "]}";
    }

    static HttpResponse<String> send(String base, String path, String body, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + path)).timeout(Duration.ofSeconds(15))
            .header("authorization", "bearer " + token).header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8));
        if (headers.length > 0) b.headers(headers);
        HttpResponse<String> r = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
        if (r.version() != HttpClient.Version.HTTP_2) throw new IllegalStateException(base + " answered over " + r.version() + ", not HTTP/2");
        return r;
    }

    static HttpResponse<String> devicePush(String pushType, String deviceToken, String aps) throws Exception {
        String suffix = pushType.equals("widgets") ? ".push-type.widgets" : ".push-type.liveactivity";
        return send(env("APNS_URL"), "/3/device/" + deviceToken, "{\"aps\":" + aps + "}",
            "apns-push-type", pushType, "apns-topic", bundle + suffix, "apns-priority", "10");
    }

    public static void main(String[] args) throws Exception {
        label = System.getenv().getOrDefault("CLIENT_LABEL", "java");
        bundle = env("APNS_BUNDLE_ID");
        token = providerToken(env("APNS_KEY"), env("APNS_KEY_ID"), env("APNS_TEAM_ID"));
        http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_2).sslContext(trusting(env("APNS_CA")))
            .connectTimeout(Duration.ofSeconds(10)).build();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            String[] w = line.trim().split("\\s+");
            if (w[0].isEmpty()) continue;
            if (w[0].equals("quit")) break;
            HttpResponse<String> r;
            int expected = 200;
            String valueHeader = "apns-id";
            switch (w[0]) {
                case "start":
                    r = devicePush("liveactivity", w[1], "{\"timestamp\":" + timestamp() + ",\"event\":\"start\""
                        + ",\"alert\":{\"title\":\"Order confirmed\",\"body\":" + quote(label + " is on it") + "}"
                        + ",\"attributes-type\":\"PizzaDeliveryAttributes\""
                        + ",\"attributes\":{\"numberOfPizzas\":2,\"totalAmount\":\"$21.00\",\"orderNumber\":" + quote(label) + "}"
                        + ",\"content-state\":" + state("start") + ",\"input-push-token\":1}");
                    break;
                case "update":
                    r = devicePush("liveactivity", w[1], "{\"timestamp\":" + timestamp() + ",\"event\":\"update\",\"content-state\":" + state("update")
                        + ",\"alert\":{\"title\":\"On the way\",\"body\":" + quote(label + " is driving") + "}}");
                    break;
                case "end": {
                    long t = timestamp();
                    r = devicePush("liveactivity", w[1], "{\"timestamp\":" + t + ",\"event\":\"end\",\"content-state\":" + state("end")
                        + ",\"dismissal-date\":" + (t + 3600) + "}");
                    break;
                }
                case "widgets":
                    r = devicePush("widgets", w[1], "{\"content-changed\":true}");
                    break;
                case "channel":
                    r = send(env("APNS_MANAGEMENT_URL"), "/1/apps/" + bundle + "/channels", "{\"message-storage-policy\":0,\"push-type\":\"LiveActivity\"}");
                    expected = 201;
                    valueHeader = "apns-channel-id";
                    break;
                case "broadcast":
                    r = send(env("APNS_BROADCAST_URL"), "/4/broadcasts/apps/" + bundle,
                        "{\"aps\":{\"timestamp\":" + timestamp() + ",\"event\":\"update\",\"content-state\":" + state("broadcast") + "}}",
                        "apns-channel-id", w[1], "apns-push-type", "liveactivity", "apns-priority", "10", "apns-expiration", "0");
                    valueHeader = "apns-request-id";
                    break;
                default:
                    System.err.println("unknown command " + w[0]);
                    System.exit(2);
                    return;
            }
            String value = r.headers().firstValue(valueHeader).orElse(null);
            boolean ok = r.statusCode() == expected && value != null;
            if (!ok) {
                Matcher m = Pattern.compile("\"reason\"\\s*:\\s*\"([^\"]*)\"").matcher(r.body());
                value = m.find() ? m.group(1) : "-";
            }
            System.out.println(w[0] + " " + r.statusCode() + " " + value + " " + r.headers().firstValue("isle-sim-outcome").orElse(""));
            System.out.flush();
            if (!ok) {
                System.err.println(w[0] + ": APNs answered " + r.statusCode() + " " + r.body());
                System.exit(1);
            }
        }
        System.exit(0); // the client's selector thread would otherwise keep the JVM a moment
    }
}
