// @herald/client against a real local Herald (one worker, two gateways): what every
// client must guarantee (docs/client.md), measured as 0 lost, 0 shown twice and 0 out
// of order.

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { HeraldApi, HeraldClient, type Message } from "../../src/index.js";
import { Herald, eventually, sleep, token } from "./herald.js";

let herald: Herald;

beforeAll(async () => {
  herald = await Herald.start(2);
});
afterAll(async () => {
  await herald?.stop();
});

/** A device that records what it showed, per conversation. */
function device(user: string, dev: string, urls: string[], extra: Partial<ConstructorParameters<typeof HeraldClient>[0]> = {}) {
  const client = new HeraldClient({ url: urls, token: () => token(user, dev), WebSocket: WebSocket as any, backoff: { baseMs: 100, maxMs: 1_000 }, ...extra });
  const shown: Message[] = [];
  const states: string[] = [];
  client.on("message", (m) => shown.push(m));
  client.on("state", (s) => states.push(s.state));
  client.connect();
  return { client, shown, states };
}

/** Every message of `conv` exactly once, in seq order 1..n. */
function judge(shown: Message[], conv: string, n: number) {
  const mine = shown.filter((m) => m.conv === conv);
  const seqs = mine.map((m) => m.seq);
  const ids = new Set(mine.map((m) => m.id));
  return { lost: n - ids.size, twice: mine.length - ids.size, outOfOrder: seqs.some((s, i) => s !== i + 1) ? 1 : 0 };
}

describe("against a real Herald", () => {
  it("20 devices of a group see every message once and in order", async () => {
    const users = Array.from({ length: 20 }, (_, i) => `member${i}`);
    const conv = "room-20";
    await herald.api("member0", "POST", "/v1/conversations", { id: conv, kind: "group", members: [...users, "sender"] });
    const gws = herald.gateways.map((g) => g.base);
    const devices = users.map((u, i) => device(u, "web", i % 2 ? gws : [...gws].reverse()));
    await eventually(20_000, "every device connected", () => devices.every((d) => d.client.state === "connected"));
    const sender = device("sender", "web", gws);
    await eventually(10_000, "the sender connected", () => sender.client.state === "connected");
    const n = 40;
    const results = await Promise.all(Array.from({ length: n }, (_, i) => sender.client.send(conv, { text: `hello ${i}` })));
    expect(results.map((r) => r.seq).sort((a, b) => a - b)).toEqual(Array.from({ length: n }, (_, i) => i + 1));
    expect(results.every((r) => typeof r.id === "string" && /^[0-9]+$/.test(r.id) && !r.dup)).toBe(true);
    await eventually(30_000, "every device showed every message", () => devices.every((d) => d.shown.length >= n));
    await sleep(300); // anything shown twice would show now
    for (const d of devices) expect(judge(d.shown, conv, n)).toEqual({ lost: 0, twice: 0, outOfOrder: 0 });
    for (const d of [...devices, sender]) d.client.close();
  });

  it("shows the sender its message delivered once the recipient's device has it", async () => {
    const conv = "dm-ticks";
    await herald.api("alice", "POST", "/v1/conversations", { id: conv, kind: "direct", members: ["alice", "bob"] });
    const gws = herald.gateways.map((g) => g.base);
    const alice = device("alice", "web", gws, { deliveryStatus: true });
    await eventually(10_000, "alice connected", () => alice.client.state === "connected");
    const sent = await alice.client.send(conv, { text: "are you there?" });
    expect(alice.client.statusOf(conv, sent.seq)?.state).toBe("sent");
    const bob = device("bob", "web", [...gws].reverse());
    await eventually(15_000, "alice sees it delivered", () => alice.client.statusOf(conv, sent.seq)?.state === "delivered");
    bob.client.read(conv, sent.seq);
    await eventually(15_000, "alice sees it read", () => alice.client.statusOf(conv, sent.seq)?.state === "read");
    for (const d of [alice, bob]) d.client.close();
  });

  it("a device whose gateway is SIGKILLed reconnects to the other and misses nothing", async () => {
    const conv = "room-kill";
    await herald.api("alice", "POST", "/v1/conversations", { id: conv, kind: "group", members: ["alice", "bob"] });
    const [gw1, gw2] = herald.gateways;
    const alice = device("alice", "web", [gw1.base, gw2.base]);
    const bob = device("bob", "web", [gw2.base]);
    await eventually(10_000, "both connected", () => alice.client.state === "connected" && bob.client.state === "connected");
    const n = 60;
    const sends: Promise<unknown>[] = [];
    for (let i = 0; i < n; i++) {
      sends.push(bob.client.send(conv, { i }));
      if (i === n / 3) herald.kill(gw1);
      await sleep(25);
    }
    await Promise.all(sends);
    await eventually(30_000, "alice showed every message", () => alice.shown.length >= n);
    await sleep(300);
    expect(judge(alice.shown, conv, n)).toEqual({ lost: 0, twice: 0, outOfOrder: 0 });
    expect(alice.states).toContain("disconnected");
    expect(alice.states.filter((s) => s === "connected").length).toBeGreaterThanOrEqual(2);
    alice.client.close();
    bob.client.close();
  });

  it("refreshes its token in the session before it expires, so the session outlives it", async () => {
    const conv = "room-refresh";
    await herald.api("carol", "POST", "/v1/conversations", { id: conv, kind: "direct", members: ["carol", "dave"] });
    const asked: string[] = [];
    // Tokens valid for 6 s, refreshed 4 s before: the first refresh comes after ~2 s.
    const carol = device("carol", "web", [herald.gateways[1].base], {
      token: (reason) => (asked.push(reason), token("carol", "web", 6)),
      refreshBeforeMs: 4_000,
    });
    await eventually(10_000, "connected", () => carol.client.state === "connected");
    await sleep(8_000);
    expect(asked.filter((r) => r === "refresh").length).toBeGreaterThanOrEqual(2);
    expect(carol.states).toEqual(["connecting", "connected"]);
    await herald.api("dave", "POST", "/v1/messages", { cmid: "d-1", conv, body: "still there?" });
    await eventually(10_000, "the refreshed session delivers", () => carol.shown.length === 1);
    carol.client.close();
  });

  it("an offline device gets its backlog in pages, once and in order; sends over the rate limit wait and go through", async () => {
    const conv = "room-backlog";
    await herald.api("erin", "POST", "/v1/conversations", { id: conv, kind: "direct", members: ["erin", "frank"] });
    // Registered, then offline while 260 messages are committed (pages hold 200).
    await herald.api("erin", "POST", "/v1/devices", undefined, "web");
    // Counts the send frames frank puts on the wire.
    let sendFrames = 0;
    class CountingSocket extends WebSocket {
      override send(data: any, ...rest: any[]) {
        if (String(data).startsWith('{"t":"send"')) sendFrames++;
        return (super.send as any)(data, ...rest);
      }
    }
    const frank = device("frank", "web", [herald.gateways[1].base], { WebSocket: CountingSocket as any });
    await eventually(10_000, "frank connected", () => frank.client.state === "connected");
    const n = 260;
    const refused: string[] = [];
    frank.client.on("error", (e) => refused.push(e.code));
    // Over the session's burst (200) and rate (50/s): some sends are refused rate_limited
    // and resent after the hint, with the same cmid.
    const results = await Promise.all(Array.from({ length: n }, (_, i) => frank.client.send(conv, { i })));
    expect(new Set(results.map((r) => r.seq)).size).toBe(n);
    const erin = device("erin", "web", [herald.gateways[1].base]);
    let caughtUp = 0;
    erin.client.on("caught_up", () => caughtUp++);
    await eventually(30_000, "erin showed the backlog", () => erin.shown.length >= n && caughtUp > 0);
    await sleep(300);
    expect(judge(erin.shown, conv, n)).toEqual({ lost: 0, twice: 0, outOfOrder: 0 });
    expect(refused).toEqual([]);
    expect(sendFrames, "some sends were refused rate_limited and sent again").toBeGreaterThan(n);
    // The typed HTTP API: unread counts, reads, history.
    const api = new HeraldApi({ url: herald.gateways[1].base, token: () => token("erin", "web") });
    const unread = async () => (await api.conversations()).items.find((c) => c.id === conv)?.unread;
    expect(await unread()).toBe(n);
    expect(await api.read(conv, n)).toEqual({ conv, read_seq: n });
    const page = await api.history(conv, { afterSeq: n - 5 });
    expect(page.items.map((m) => m.seq)).toEqual([n - 4, n - 3, n - 2, n - 1, n]);
    expect(await unread()).toBe(0);
    await expect(api.history("no-such-room")).rejects.toMatchObject({ status: 404, code: "not_found" });
    erin.client.close();
    frank.client.close();
  });
});
