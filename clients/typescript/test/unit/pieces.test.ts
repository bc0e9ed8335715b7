import { describe, expect, it } from "vitest";
import { AckBatch } from "../../src/acks.js";
import { Backoff } from "../../src/backoff.js";
import { SeenIds } from "../../src/dedup.js";
import { compareIds, isMessageId } from "../../src/ids.js";
import { Close, parseServerFrame, sessionUrl, tokenExpiry } from "../../src/protocol.js";
import { onSessionEnd } from "../../src/reconnect.js";

describe("ids", () => {
  it("compare as unsigned 64-bit integers, not as numbers or plain strings", () => {
    // Both round to the same double: a number comparison calls them equal.
    expect(Number("7405329411723264001")).toBe(Number("7405329411723264000"));
    expect(compareIds("7405329411723264001", "7405329411723264000")).toBeGreaterThan(0);
    expect(compareIds("9", "10")).toBeLessThan(0);
    expect(compareIds("0010", "10")).toBe(0);
    expect(compareIds("18446744073709551615", "18446744073709551614")).toBeGreaterThan(0);
    expect(["30", "4", "18446744073709551615", "100"].sort(compareIds)).toEqual(["4", "30", "100", "18446744073709551615"]);
    expect(isMessageId("123")).toBe(true);
    expect(isMessageId(123)).toBe(false);
    expect(isMessageId("12a")).toBe(false);
  });

  it("survive parsing exactly: the server writes them as strings", () => {
    const f = parseServerFrame('{"t":"msg","id":"18446744073709551615","conv":"c","seq":1,"from":"a","cmid":"m","ts":5,"body":{"x":1}}');
    expect(f && f.t === "msg" && f.id).toBe("18446744073709551615");
    // An id as a JSON number would already be rounded: such a frame is refused.
    expect(parseServerFrame('{"t":"msg","id":18446744073709551615,"conv":"c","seq":1,"from":"a","cmid":"m","ts":5,"body":1}')).toBeNull();
  });
});

describe("frames", () => {
  it("unknown or malformed frames are skipped, known ones typed", () => {
    expect(parseServerFrame('{"t":"typing","conv":"c"}')).toBeNull();
    expect(parseServerFrame("{nope")).toBeNull();
    expect(parseServerFrame('{"t":"hello","session":"s","hb_ms":"25000","pending":0}')).toBeNull();
    expect(parseServerFrame('{"t":"hello","session":"s","hb_ms":25000,"pending":0,"new_field":1}')).toMatchObject({ t: "hello", hb_ms: 25000 });
    expect(parseServerFrame('{"t":"refreshed","exp":5,"ref":null}')).toMatchObject({ t: "refreshed", exp: 5 });
    expect(parseServerFrame('{"t":"delivered","conv":"ab","seq":3,"count":1,"user":"bob"}')).toMatchObject({ t: "delivered", seq: 3, user: "bob" });
    expect(parseServerFrame('{"t":"delivered","conv":"g","seq":3,"count":12}')).toMatchObject({ t: "delivered", count: 12 });
    expect(parseServerFrame('{"t":"delivered","conv":"g","seq":3,"count":"12"}')).toBeNull();
  });

  it("build the session's URL with the token and the features asked for", () => {
    expect(sessionUrl("https://chat.example.com/", null, [])).toBe("wss://chat.example.com/v1/ws");
    expect(sessionUrl("http://h:1", "a b", [])).toBe("ws://h:1/v1/ws?access_token=a%20b");
    expect(sessionUrl("wss://h", null, ["delivered"])).toBe("wss://h/v1/ws?features=delivered");
  });

  it("read a token's exp without verifying it", () => {
    const payload = Buffer.from(JSON.stringify({ tid: "t", exp: 1900000000 })).toString("base64url");
    expect(tokenExpiry(`e30.${payload}.sig`)).toBe(1900000000);
    expect(tokenExpiry("garbage")).toBeNull();
  });
});

describe("backoff", () => {
  it("is full jitter below a cap that doubles up to the maximum, and resets", () => {
    const b = new Backoff({ baseMs: 100, maxMs: 1000, random: () => 0.999 });
    expect([b.next(), b.next(), b.next(), b.next(), b.next(), b.next()]).toEqual([99, 199, 399, 799, 999, 999]);
    b.reset();
    expect(b.next()).toBe(99);
    const low = new Backoff({ random: () => 0 });
    expect(low.next()).toBe(0);
    const spread = new Backoff({ baseMs: 1000 });
    const delays = Array.from({ length: 200 }, () => {
      spread.reset();
      return spread.next();
    });
    expect(Math.min(...delays)).toBeLessThan(200);
    expect(Math.max(...delays)).toBeGreaterThan(800);
  });
});

describe("reconnect decisions follow the server's signals", () => {
  const b = () => new Backoff({ baseMs: 100, random: () => 0.5 });
  it("stops on replaced and protocol errors", () => {
    expect(onSessionEnd(Close.Replaced, {}, b(), true)).toEqual({ kind: "stop", reason: "replaced" });
    expect(onSessionEnd(Close.Protocol, {}, b(), true)).toEqual({ kind: "stop", reason: "protocol" });
  });
  it("asks for a new token after 4001, or stops when the token is fixed", () => {
    expect(onSessionEnd(Close.Unauthorized, {}, b(), true)).toMatchObject({ kind: "reconnect", newToken: true });
    expect(onSessionEnd(Close.Unauthorized, {}, b(), false)).toEqual({ kind: "stop", reason: "unauthorized" });
  });
  it("waits as told: drain after_ms, retry_after_ms on 4008 and 1013", () => {
    expect(onSessionEnd(Close.Draining, { reconnectAfterMs: 7_000 }, b(), true)).toEqual({ kind: "reconnect", delayMs: 7_000, newToken: false });
    expect(onSessionEnd(Close.Policy, { retryAfterMs: 12_000 }, b(), true)).toMatchObject({ delayMs: 12_000 });
    expect(onSessionEnd(Close.TryAgainLater, { retryAfterMs: 300 }, b(), true)).toMatchObject({ delayMs: 300 });
    expect(onSessionEnd(Close.TryAgainLater, {}, b(), true)).toMatchObject({ delayMs: 50 });
  });
  it("backs off on failures and lost connections", () => {
    expect(onSessionEnd(null, {}, b(), true)).toEqual({ kind: "reconnect", delayMs: 50, newToken: false });
    expect(onSessionEnd(Close.InternalError, {}, b(), true)).toMatchObject({ delayMs: 50 });
    expect(onSessionEnd(Close.HeartbeatTimeout, {}, b(), true)).toMatchObject({ kind: "reconnect" });
  });
});

describe("dedup", () => {
  it("drops repeats and forgets the oldest beyond its capacity", () => {
    const s = new SeenIds(3);
    expect(["1", "2", "1", "3"].map((id) => s.add(id))).toEqual([true, true, false, true]);
    expect(s.add("4")).toBe(true);
    expect(s.size).toBe(3);
    expect(s.has("1")).toBe(false);
    expect(s.has("4")).toBe(true);
  });
});

describe("acks", () => {
  it("batch after a delay, at once when full, and come back after a failed send", () => {
    const a = new AckBatch(20, 3);
    expect(a.dueAt()).toBeNull();
    a.add("1", 100);
    a.add("2", 105);
    expect(a.take(110)).toEqual([]);
    expect(a.take(120)).toEqual([["1", "2"]]);
    for (const id of ["3", "4", "5", "6"]) a.add(id, 200);
    expect(a.dueAt()).toBe(200);
    expect(a.take(200)).toEqual([["3", "4", "5"], ["6"]]);
    a.restore(["7"], 300);
    a.add("8", 301);
    expect(a.take(0, true)).toEqual([["7", "8"]]);
  });
});
