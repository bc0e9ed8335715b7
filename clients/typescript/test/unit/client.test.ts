import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { HeraldClient, type HeraldOptions, type Message, type StateChange } from "../../src/index.js";

/** A WebSocket the test plays the server of. */
class FakeSocket {
  static all: FakeSocket[] = [];
  sent: any[] = [];
  closed: { code?: number } | null = null;
  onopen: ((ev: any) => void) | null = null;
  onmessage: ((ev: { data: any }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: any) => void) | null = null;
  constructor(
    readonly url: string,
    readonly protocols?: string | string[],
  ) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close(code?: number) {
    this.closed = { code };
  }
  open() {
    this.onopen?.({});
  }
  frame(f: object) {
    this.onmessage?.({ data: JSON.stringify(f) });
  }
  serverClose(code: number) {
    this.onclose?.({ code, reason: "" });
  }
  of(t: string) {
    return this.sent.filter((f) => f.t === t);
  }
}

const last = () => FakeSocket.all[FakeSocket.all.length - 1];
const msg = (seq: number, conv = "c") => ({ t: "msg", id: String(7405329411723264000n + BigInt(seq)), conv, seq, from: "bob", cmid: `m${seq}`, ts: 1, body: { n: seq } });

function client(extra: Partial<HeraldOptions> = {}) {
  const c = new HeraldClient({ url: "https://chat.example.com/", token: () => "tok", WebSocket: FakeSocket as any, backoff: { random: () => 0.5 }, ...extra });
  const states: StateChange[] = [];
  const shown: Message[] = [];
  c.on("state", (s) => states.push(s));
  c.on("message", (m) => shown.push(m));
  return { c, states, shown };
}

async function connected(c: HeraldClient, hb = 10_000) {
  c.connect();
  await vi.advanceTimersByTimeAsync(0);
  const ws = last();
  ws.open();
  ws.frame({ t: "hello", session: "gw-1-1", hb_ms: hb, pending: 0 });
  return ws;
}

beforeEach(() => {
  FakeSocket.all = [];
  vi.useFakeTimers();
});
afterEach(() => vi.useRealTimers());

describe("the connection state machine", () => {
  it("connects with the token as the first frame and herald.v1 offered", async () => {
    const { c, states } = client();
    const ws = await connected(c);
    expect(ws.url).toBe("wss://chat.example.com/v1/ws");
    expect(ws.protocols).toEqual(["herald.v1"]);
    expect(ws.sent[0]).toEqual({ t: "auth", token: "tok" });
    expect(states.map((s) => s.state)).toEqual(["connecting", "connected"]);
  });

  it("reconnects after a drain when told, and after a lost connection with backoff", async () => {
    const { c, states } = client();
    let ws = await connected(c);
    ws.frame({ t: "reconnect", after_ms: 4_000 });
    ws.serverClose(4003);
    expect(c.state).toBe("disconnected");
    await vi.advanceTimersByTimeAsync(3_999);
    expect(FakeSocket.all).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(FakeSocket.all).toHaveLength(2);
    ws = last();
    ws.serverClose(1006);
    await vi.advanceTimersByTimeAsync(250); // backoff: 0.5 x 500 ms
    expect(FakeSocket.all).toHaveLength(3);
    expect(states.map((s) => s.state)).toEqual(["connecting", "connected", "disconnected", "connecting", "disconnected", "connecting"]);
  });

  it("waits retry_after_ms after a refused session (1013, 4008)", async () => {
    const { c } = client();
    c.connect();
    await vi.advanceTimersByTimeAsync(0);
    last().frame({ t: "error", code: "rate_limited", message: "storm", retry_after_ms: 9_000 });
    last().serverClose(1013);
    await vi.advanceTimersByTimeAsync(8_999);
    expect(FakeSocket.all).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(FakeSocket.all).toHaveLength(2);
  });

  it("asks the app for a new token after 4001; a fixed token stops instead", async () => {
    const reasons: string[] = [];
    const { c } = client({ token: (r) => (reasons.push(r), `tok-${reasons.length}`) });
    const ws = await connected(c);
    ws.serverClose(4001);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(reasons).toEqual(["connect", "expired"]);
    last().open();
    expect(last().sent[0]).toEqual({ t: "auth", token: "tok-2" });

    const fixed = client({ token: "static" });
    (await connected(fixed.c)).serverClose(4001);
    expect(fixed.c.state).toBe("closed");
    expect(fixed.states.at(-1)).toMatchObject({ state: "closed", code: 4001, reason: "unauthorized" });
  });

  it("stops for good when replaced (4002) or told its frames are malformed (4009)", async () => {
    for (const [code, reason] of [
      [4002, "replaced"],
      [4009, "protocol"],
    ] as const) {
      FakeSocket.all = [];
      const { c, states } = client();
      (await connected(c)).serverClose(code);
      await vi.advanceTimersByTimeAsync(60_000);
      expect(FakeSocket.all).toHaveLength(1);
      expect(states.at(-1)).toMatchObject({ state: "closed", code, reason });
    }
  });

  it("pings every half heartbeat and gives a silent session up after two", async () => {
    const { c } = client();
    const ws = await connected(c, 10_000);
    await vi.advanceTimersByTimeAsync(5_250);
    expect(ws.of("ping").length).toBe(1);
    await vi.advanceTimersByTimeAsync(15_000);
    expect(ws.closed).not.toBeNull();
    expect(c.state).not.toBe("connected");
    await vi.advanceTimersByTimeAsync(1_000);
    expect(FakeSocket.all.length).toBe(2);
  });

  it("close() is final", async () => {
    const { c, states } = client();
    const ws = await connected(c);
    c.close();
    expect(ws.closed).toEqual({ code: 1000 });
    await vi.advanceTimersByTimeAsync(60_000);
    expect(FakeSocket.all).toHaveLength(1);
    expect(states.at(-1)).toMatchObject({ state: "closed", reason: "closed" });
    expect(() => c.connect()).toThrow();
  });
});

describe("delivery", () => {
  it("acks in batches, drops repeats (acking them again) and shows each conversation in order", async () => {
    const { c, shown } = client();
    const ws = await connected(c);
    for (const f of [msg(2), msg(1), msg(1), msg(3)]) ws.frame(f);
    await vi.advanceTimersByTimeAsync(25);
    expect(shown.map((m) => m.seq)).toEqual([1, 2, 3]);
    expect(shown[0].id).toBe("7405329411723264001");
    const acks = ws.of("ack");
    expect(acks).toHaveLength(1);
    expect(acks[0].ids).toEqual([msg(2).id, msg(1).id, msg(1).id, msg(3).id]);
  });

  it("with autoAck false, acks only what the app acks", async () => {
    const { c, shown } = client({ autoAck: false });
    const ws = await connected(c);
    ws.frame(msg(1));
    ws.frame(msg(2));
    await vi.advanceTimersByTimeAsync(50);
    expect(ws.of("ack")).toEqual([]);
    shown[1].ack();
    ws.frame(msg(1)); // a repeat of one not acked yet: not acked for the app
    await vi.advanceTimersByTimeAsync(50);
    expect(ws.of("ack")).toEqual([{ t: "ack", ids: [msg(2).id] }]);
  });

  it("fills a gap still open after caught_up with sync, and shows the page in order", async () => {
    const { c, shown } = client({ gapSyncAfterMs: 1_000 });
    const ws = await connected(c);
    ws.frame(msg(1));
    ws.frame(msg(4));
    ws.frame({ t: "caught_up", delivered: 2 });
    await vi.advanceTimersByTimeAsync(1_600);
    const [sync] = ws.of("sync");
    expect(sync).toMatchObject({ conv: "c", after_seq: 1 });
    const items = [msg(2), msg(3), msg(4)].map(({ t, ...m }) => m);
    ws.frame({ t: "history", conv: "c", items, more: false, ref: sync.ref });
    expect(shown.map((m) => m.seq)).toEqual([1, 2, 3, 4]);
  });
});

describe("sends", () => {
  it("resolve with the commit, resend after a lost session with the same cmid", async () => {
    const { c } = client();
    let ws = await connected(c);
    const p = c.send("c", { text: "hi" }, "cm-1");
    await vi.advanceTimersByTimeAsync(0);
    expect(ws.of("send")).toEqual([{ t: "send", cmid: "cm-1", conv: "c", body: { text: "hi" } }]);
    ws.serverClose(1006);
    await vi.advanceTimersByTimeAsync(1_000);
    ws = last();
    ws.open();
    ws.frame({ t: "hello", session: "gw-2-1", hb_ms: 10_000, pending: 0 });
    expect(ws.of("send").map((f) => f.cmid)).toEqual(["cm-1"]);
    ws.frame({ t: "sent", cmid: "cm-1", id: "18446744073709551615", conv: "c", seq: 7, ts: 5, dup: true });
    await expect(p).resolves.toEqual({ id: "18446744073709551615", seq: 7, ts: 5, dup: true });
    expect(c.unsent).toBe(0);
  });

  it("show the device's own message at its seq, so the next one does not wait for a sync", async () => {
    const { c, shown } = client();
    const ws = await connected(c);
    ws.frame(msg(1));
    const p = c.send("c", { text: "mine" }, "cm-2");
    await vi.advanceTimersByTimeAsync(0);
    ws.frame({ t: "sent", cmid: "cm-2", id: "7405329411723264002", conv: "c", seq: 2, ts: 5, dup: false });
    await p;
    ws.frame(msg(3));
    expect(shown.map((m) => [m.seq, m.cmid])).toEqual([[1, "m1"], [2, "cm-2"], [3, "m3"]]);
    expect(shown[1].body).toEqual({ text: "mine" });
    // A later copy (a sync) is a repeat.
    ws.frame({ t: "history", conv: "c", items: [{ ...msg(2), id: "7405329411723264002", cmid: "cm-2" }].map(({ t, ...m }) => m), more: false, ref: null });
    expect(shown).toHaveLength(3);
  });

  it("wait out rate_limited, and reject on a final refusal", async () => {
    const { c } = client();
    const ws = await connected(c);
    const slow = c.send("c", 1, "cm-1");
    const bad = c.send("nope", 2, "cm-2");
    await vi.advanceTimersByTimeAsync(0);
    ws.frame({ t: "error", code: "rate_limited", message: "slow", ref: "cm-1", retry_after_ms: 2_000 });
    ws.frame({ t: "error", code: "forbidden", message: "not a member", ref: "cm-2" });
    await expect(bad).rejects.toMatchObject({ code: "forbidden" });
    await vi.advanceTimersByTimeAsync(1_900);
    expect(ws.of("send").filter((f) => f.cmid === "cm-1")).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(400);
    expect(ws.of("send").filter((f) => f.cmid === "cm-1")).toHaveLength(2);
    ws.frame({ t: "sent", cmid: "cm-1", id: "5", conv: "c", seq: 1, ts: 1, dup: false });
    await expect(slow).resolves.toMatchObject({ seq: 1 });
  });
});

describe("browser hooks", () => {
  function fakeBrowser() {
    const window = new EventTarget();
    const document = Object.assign(new EventTarget(), { visibilityState: "hidden" });
    return { window, document };
  }

  it("reconnect at once when the network comes back or the page shows again", async () => {
    const browser = fakeBrowser();
    const { c } = client({ browser, backoff: { baseMs: 60_000, random: () => 0.9 } });
    (await connected(c)).serverClose(1006);
    expect(c.state).toBe("disconnected");
    browser.window.dispatchEvent(new Event("online"));
    await vi.advanceTimersByTimeAsync(0);
    expect(FakeSocket.all).toHaveLength(2);
    last().open();
    last().frame({ t: "hello", session: "s", hb_ms: 10_000, pending: 0 });
    last().serverClose(1006);
    browser.document.dispatchEvent(new Event("visibilitychange"));
    await vi.advanceTimersByTimeAsync(0);
    expect(FakeSocket.all, "still hidden: no wake").toHaveLength(2);
    browser.document.visibilityState = "visible";
    browser.document.dispatchEvent(new Event("visibilitychange"));
    await vi.advanceTimersByTimeAsync(0);
    expect(FakeSocket.all).toHaveLength(3);
  });

  it("ping a connected session when the page shows again, and unsubscribe on close", async () => {
    const browser = fakeBrowser();
    browser.document.visibilityState = "visible";
    const { c } = client({ browser });
    const ws = await connected(c);
    browser.document.dispatchEvent(new Event("visibilitychange"));
    expect(ws.of("ping")).toHaveLength(1);
    c.close();
    browser.window.dispatchEvent(new Event("online"));
    await vi.advanceTimersByTimeAsync(0);
    expect(FakeSocket.all).toHaveLength(1);
  });
});

describe("unread counts in a session", () => {
  it("follow shown messages, own sends and the user's read frames from other devices", async () => {
    const payload = Buffer.from(JSON.stringify({ sub: "alice", exp: 4102444800 })).toString("base64url");
    const { c } = client({ token: () => `e30.${payload}.sig` });
    const counts: number[] = [];
    c.on("unread", (u) => counts.push(u.unread));
    const ws = await connected(c);
    c.seedUnread([{ id: "c", last_seq: 0, read_seq: 0 }]);
    ws.frame(msg(1));
    ws.frame(msg(2));
    ws.frame({ t: "read", conv: "c", user: "bob", seq: 2 }); // another member: not ours
    ws.frame({ t: "read", conv: "c", user: "alice", seq: 1 }); // alice on another device
    ws.frame({ t: "sent", cmid: "x", id: "9", conv: "c", seq: 3, ts: 1, dup: false });
    c.read("c", 3);
    expect(counts).toEqual([1, 2, 1, 2, 0]);
    expect(c.unread("c")).toBe(0);
  });
});

describe("delivery status", () => {
  const payload = Buffer.from(JSON.stringify({ sub: "alice", exp: 4102444800 })).toString("base64url");

  it("is asked for only with deliveryStatus, and follows sent, delivered and read frames", async () => {
    const plain = await connected(client().c);
    expect(plain.url).toBe("wss://chat.example.com/v1/ws");

    const { c } = client({ token: () => `e30.${payload}.sig`, deliveryStatus: true, tokenIn: "query" });
    const seen: string[] = [];
    c.on("status", (s) => seen.push(`${s.seq}:${s.state}:${s.delivered}/${s.read}`));
    const ws = await connected(c);
    expect(ws.url).toBe(`wss://chat.example.com/v1/ws?access_token=${encodeURIComponent(`e30.${payload}.sig`)}&features=delivered`);
    const p1 = c.send("ab", { text: "one" }, "cm-1");
    const p2 = c.send("ab", { text: "two" }, "cm-2");
    await vi.advanceTimersByTimeAsync(0);
    ws.frame({ t: "sent", cmid: "cm-1", id: "7405329411723264001", conv: "ab", seq: 1, ts: 5, dup: false });
    ws.frame({ t: "sent", cmid: "cm-2", id: "7405329411723264002", conv: "ab", seq: 2, ts: 5, dup: false });
    await Promise.all([p1, p2]);
    // Bob's device has the first: delivered ticks on 1, not on 2.
    ws.frame({ t: "delivered", conv: "ab", seq: 1, count: 1, user: "bob" });
    expect(c.statusOf("ab", 1)).toMatchObject({ state: "delivered", delivered: 1, read: 0, id: "7405329411723264001" });
    expect(c.statusOf("ab", 2)?.state).toBe("sent");
    // A frame for a later message counts for every earlier one; an older one never lowers.
    ws.frame({ t: "delivered", conv: "ab", seq: 2, count: 1, user: "bob" });
    ws.frame({ t: "delivered", conv: "ab", seq: 1, count: 0, user: "bob" });
    ws.frame({ t: "read", conv: "ab", user: "bob", seq: 1 });
    expect(c.statusOf("ab", 1)?.state).toBe("read");
    expect(c.statusOf("ab", 2)?.state).toBe("delivered");
    expect(seen).toEqual(["1:sent:0/0", "2:sent:0/0", "1:delivered:1/0", "2:delivered:1/0", "1:read:1/1"]);
    expect(c.statusOf("ab", 9)).toBeUndefined();
  });

  it("takes the counts of the user's own messages from history pages", async () => {
    const { c } = client({ token: () => `e30.${payload}.sig`, deliveryStatus: true });
    const ws = await connected(c);
    const mine = { ...msg(1, "g"), from: "alice", status: { of: 3, delivered: 2, read: 1 } };
    const theirs = msg(2, "g");
    ws.frame({ t: "history", conv: "g", items: [mine, theirs].map(({ t, ...m }) => m), more: false, ref: null });
    expect(c.statusOf("g", 1)).toMatchObject({ state: "read", of: 3, delivered: 2, read: 1 });
    expect(c.statusOf("g", 2)).toBeUndefined();
    ws.frame({ t: "delivered", conv: "g", seq: 1, count: 3 });
    expect(c.statusOf("g", 1)).toMatchObject({ delivered: 3, read: 1 });
  });
});

describe("typing and presence", () => {
  it("are asked for only with typingAndPresence", async () => {
    const { c } = client();
    const ws = await connected(c);
    expect(ws.url).toBe("wss://chat.example.com/v1/ws");
    const { c: c2 } = client({ typingAndPresence: true, deliveryStatus: true });
    const ws2 = await connected(c2);
    expect(ws2.url).toBe("wss://chat.example.com/v1/ws?features=delivered,typing,presence");
  });

  it("sends typing at most every 3 s per conversation, and stopped once after it", async () => {
    const { c } = client({ typingAndPresence: true });
    const ws = await connected(c);
    c.typing("g");
    c.typing("g");
    c.typing("h");
    expect(ws.of("typing")).toEqual([
      { t: "typing", conv: "g", state: "started" },
      { t: "typing", conv: "h", state: "started" },
    ]);
    await vi.advanceTimersByTimeAsync(3_000);
    c.typing("g");
    c.typing("g", "stopped");
    c.typing("g", "stopped");
    expect(ws.of("typing").slice(2)).toEqual([
      { t: "typing", conv: "g", state: "started" },
      { t: "typing", conv: "g", state: "stopped" },
    ]);
  });

  it("shows who is typing until stopped, expired, or their message arrives", async () => {
    const { c } = client({ typingAndPresence: true });
    const seen: string[] = [];
    c.on("typing", (t) => seen.push(`${t.conv}:${t.users.join(",")}`));
    const ws = await connected(c);
    ws.frame({ t: "typing", conv: "c", user: "bob", state: "started", expires_in_ms: 6_000 });
    ws.frame({ t: "typing", conv: "c", user: "carol", state: "started", expires_in_ms: 1_000 });
    expect(c.whoIsTyping("c")).toEqual(["bob", "carol"]);
    await vi.advanceTimersByTimeAsync(1_500);
    expect(c.whoIsTyping("c")).toEqual(["bob"]);
    ws.frame(msg(1));
    expect(c.whoIsTyping("c")).toEqual([]);
    ws.frame({ t: "typing", conv: "c", user: "bob", state: "started", expires_in_ms: 6_000 });
    ws.frame({ t: "typing", conv: "c", user: "bob", state: "stopped", expires_in_ms: 6_000 });
    expect(seen).toEqual(["c:bob", "c:bob,carol", "c:bob", "c:", "c:bob", "c:"]);
    ws.frame({ t: "typing", conv: "c", user: "bob", state: "started", expires_in_ms: 6_000 });
    ws.serverClose(1006);
    expect(c.whoIsTyping("c")).toEqual([]);
  });

  it("follows presence across reconnects", async () => {
    const { c } = client({ typingAndPresence: true });
    const seen: string[] = [];
    c.on("presence", (p) => seen.push(`${p.user}:${p.online}:${p.lastSeen}`));
    c.followPresence(["bob", "bob", "carol"]);
    let ws = await connected(c);
    expect(ws.of("presence_subscribe")).toEqual([{ t: "presence_subscribe", users: ["bob", "carol"], ref: "presence" }]);
    ws.frame({ t: "presence", user: "bob", online: true, last_seen: null });
    ws.frame({ t: "presence", user: "dave", online: true, last_seen: null });
    expect(c.presenceOf("bob")).toEqual({ user: "bob", online: true, lastSeen: null });
    expect(c.presenceOf("dave")).toBeUndefined();
    ws.serverClose(1006);
    await vi.advanceTimersByTimeAsync(60_000);
    ws = last();
    ws.open();
    ws.frame({ t: "hello", session: "gw-1-2", hb_ms: 10_000, pending: 0 });
    expect(ws.of("presence_subscribe")).toHaveLength(1);
    ws.frame({ t: "presence", user: "bob", online: false, last_seen: 5 });
    expect(seen).toEqual(["bob:true:null", "bob:false:5"]);
    c.followPresence([]);
    expect(ws.of("presence_subscribe")[1]).toEqual({ t: "presence_subscribe", users: [], ref: "presence" });
    expect(c.presenceOf("bob")).toBeUndefined();
  });
});
