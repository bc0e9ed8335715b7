// @herald/client's push registration against a real local Herald (one worker, one
// gateway) whose tenant's push webhook is a server in this test: the device registers
// its token, stays away, and the webhook gets one signed notification for it.

import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiError, HeraldApi } from "../../src/index.js";
import { Herald, TENANT, eventually, token } from "./herald.js";

const PUSH_SECRET = "ts-push-secret-0123456789";

let herald: Herald;
let webhook: Server;
const received: Array<{ body: any; signed: boolean }> = [];

/** The receiver's check (docs/protocol.md section 4.10): HMAC-SHA256 of `timestamp.body`. */
function signed(timestamp: string, signature: string, body: string): boolean {
  const expected = Buffer.from(`sha256=${createHmac("sha256", PUSH_SECRET).update(`${timestamp}.${body}`).digest("hex")}`);
  const given = Buffer.from(signature);
  return given.length === expected.length && timingSafeEqual(given, expected);
}

beforeAll(async () => {
  webhook = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const ok = signed(String(req.headers["x-herald-timestamp"]), String(req.headers["x-herald-signature"]), body);
      received.push({ body: JSON.parse(body), signed: ok });
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((r) => webhook.listen(0, "127.0.0.1", r));
  const { port } = webhook.address() as AddressInfo;
  herald = await Herald.start(1, {
    HERALD_PUSH__WEBHOOK_URL: `http://127.0.0.1:${port}/push`,
    HERALD_PUSH__WEBHOOK_SECRET: PUSH_SECRET,
    HERALD_PUSH__DELAY_MS: "1000",
    HERALD_PUSH__POLL_MS: "100",
  });
});
afterAll(async () => {
  await herald?.stop();
  webhook?.close();
});

describe("push registration against a real Herald", () => {
  it("registers a token, refuses a bad one, and the webhook gets a signed notification", async () => {
    const api = (user: string, dev: string) => new HeraldApi({ url: herald.gateways[0].base, token: () => token(user, dev) });
    const grace = api("grace", "phone");
    expect(await grace.registerPush("fcm", "grace-token")).toMatchObject({ platform: "fcm", token: "grace-token" });
    const refused = await grace.registerPush("sms" as any, "x").catch((e) => e);
    expect(refused).toBeInstanceOf(ApiError);
    expect(refused).toMatchObject({ status: 400, code: "bad_request" });

    const heidi = api("heidi", "laptop");
    await heidi.createConversation({ id: "dm-push", kind: "direct", members: ["grace", "heidi"] });
    await heidi.send("p-1", "dm-push", { text: "call me" });
    await eventually(15_000, "the webhook got grace's notification", () => received.length > 0);
    expect(received[0].signed).toBe(true);
    expect(received[0].body).toMatchObject({ tenant: TENANT, user: "grace", device: "phone", platform: "fcm", token: "grace-token", conv: "dm-push", sender: "heidi", count: 1, badge: 1 });

    // Unregistered: the next message notifies nobody.
    await grace.unregisterPush();
    await heidi.send("p-2", "dm-push", { text: "never mind" });
    await new Promise((r) => setTimeout(r, 3_000));
    expect(received).toHaveLength(1);
  });
});
