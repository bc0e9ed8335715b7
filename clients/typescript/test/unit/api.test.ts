import { afterEach, describe, expect, it, vi } from "vitest";
import { ApiError, HeraldApi } from "../../src/index.js";

function fakeFetch(answers: Array<{ status: number; body?: unknown; headers?: Record<string, string> }>) {
  const calls: Array<{ url: string; init: any }> = [];
  const fetch = async (url: any, init: any) => {
    calls.push({ url: String(url), init });
    const a = answers.shift()!;
    return new Response(a.body === undefined ? null : JSON.stringify(a.body), { status: a.status, headers: a.headers });
  };
  return { fetch: fetch as typeof globalThis.fetch, calls };
}

afterEach(() => vi.useRealTimers());

describe("the HTTP API client", () => {
  it("calls the documented paths with the bearer token and parses the answer", async () => {
    const { fetch, calls } = fakeFetch([{ status: 200, body: { items: [{ id: "c1", unread: 3 }] } }, { status: 200, body: { conv: "c 1", read_seq: 4 } }]);
    const api = new HeraldApi({ url: "https://chat.example.com/", token: () => "tok", fetch });
    expect((await api.conversations({ limit: 10 })).items[0].unread).toBe(3);
    expect(await api.read("c 1", 4)).toEqual({ conv: "c 1", read_seq: 4 });
    expect(calls[0].url).toBe("https://chat.example.com/v1/conversations?limit=10");
    expect(calls[0].init.headers.authorization).toBe("Bearer tok");
    expect(calls[1]).toMatchObject({ url: "https://chat.example.com/v1/conversations/c%201/read", init: { method: "POST", body: '{"seq":4}' } });
  });

  it("waits out 429 with Retry-After, then gives up with the protocol's error", async () => {
    vi.useFakeTimers();
    const limited = { status: 429, body: { error: { code: "rate_limited", message: "slow down" } }, headers: { "retry-after": "2" } };
    const { fetch, calls } = fakeFetch([limited, { status: 200, body: { tenant: "t" } }, limited, limited]);
    const api = new HeraldApi({ url: "http://gw", token: "tok", fetch, maxRetries: 1 });
    const ok = api.registerDevice();
    await vi.advanceTimersByTimeAsync(1_999);
    expect(calls).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    await expect(ok).resolves.toEqual({ tenant: "t" });
    const refused = api.registerDevice().catch((e) => e);
    await vi.advanceTimersByTimeAsync(2_000);
    const e = await refused;
    expect(e).toBeInstanceOf(ApiError);
    expect(e).toMatchObject({ status: 429, code: "rate_limited" });
  });

  it("registers and removes the device's push token", async () => {
    const { fetch, calls } = fakeFetch([{ status: 200, body: { platform: "fcm", token: "t1", updated_at: 5 } }, { status: 204 }]);
    const api = new HeraldApi({ url: "http://gw", token: "tok", fetch });
    expect(await api.registerPush("fcm", "t1")).toEqual({ platform: "fcm", token: "t1", updated_at: 5 });
    await expect(api.unregisterPush()).resolves.toBeUndefined();
    expect(calls[0]).toMatchObject({ url: "http://gw/v1/devices/me/push", init: { method: "PUT", body: '{"platform":"fcm","token":"t1"}' } });
    expect(calls[1]).toMatchObject({ url: "http://gw/v1/devices/me/push", init: { method: "DELETE" } });
  });

  it("retries an edit with its cmid while unavailable, and refuses a forbidden recall at once", async () => {
    vi.useFakeTimers();
    const unavailable = { status: 503, body: { error: { code: "unavailable", message: "not confirmed in time" } } };
    const event = { id: "9", conv: "g", seq: 4, ts: 1, dup: true };
    const forbidden = { status: 403, body: { error: { code: "forbidden", message: "the edit window has passed" } } };
    const { fetch, calls } = fakeFetch([unavailable, { status: 200, body: event }, forbidden]);
    const api = new HeraldApi({ url: "http://gw", token: "tok", fetch });
    const edited = api.edit("7", { text: "fixed" }, "e-1");
    await vi.advanceTimersByTimeAsync(300);
    await expect(edited).resolves.toEqual(event);
    expect(calls.map((c) => [c.url, c.init.body])).toEqual([
      ["http://gw/v1/messages/7/edit", '{"cmid":"e-1","body":{"text":"fixed"}}'],
      ["http://gw/v1/messages/7/edit", '{"cmid":"e-1","body":{"text":"fixed"}}'],
    ]);
    await expect(api.recall("7", "r-1")).rejects.toMatchObject({ status: 403, code: "forbidden" });
    expect(calls).toHaveLength(3);
  });

  it("throws other errors at once, with their code", async () => {
    const { fetch } = fakeFetch([{ status: 403, body: { error: { code: "forbidden", message: "not a member" } } }]);
    const api = new HeraldApi({ url: "http://gw", token: "tok", fetch });
    await expect(api.history("c", { afterSeq: 5 })).rejects.toMatchObject({ status: 403, code: "forbidden" });
  });
});
