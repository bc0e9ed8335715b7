import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ApiError, HeraldApi, HeraldClient, LoggedOut, TokenKeeper, TokenUnavailable, type HeraldOptions, type StateChange, type TokenReason } from "../../src/index.js";

/** A WebSocket the test plays the server of. */
class FakeSocket {
  static all: FakeSocket[] = [];
  sent: any[] = [];
  onopen: ((ev: any) => void) | null = null;
  onmessage: ((ev: { data: any }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: any) => void) | null = null;
  constructor(readonly url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    this.sent.push(JSON.parse(data));
  }
  close() {}
  serverClose(code: number) {
    this.onclose?.({ code, reason: "" });
  }
}

const last = () => FakeSocket.all[FakeSocket.all.length - 1];

/** An unsigned JWT whose payload has `exp` (the client reads it, the server checks it). */
function jwt(exp: number, sub = "alice"): string {
  const part = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${part({ alg: "HS256" })}.${part({ sub, exp })}.sig`;
}
const inAnHour = () => Math.floor(Date.now() / 1000) + 3600;

function client(token: HeraldOptions["token"], extra: Partial<HeraldOptions> = {}) {
  const c = new HeraldClient({ url: "https://chat.example.com/", token, WebSocket: FakeSocket as any, backoff: { random: () => 0.5 }, browser: null, ...extra });
  const states: StateChange[] = [];
  const errors: unknown[] = [];
  c.on("state", (s) => states.push(s));
  c.on("token_error", (e) => errors.push(e.error));
  return { c, states, errors };
}

/** Lets the client's timers and promises run, then plays a session's start. */
async function sessionStarts(): Promise<FakeSocket> {
  await vi.advanceTimersByTimeAsync(0);
  const ws = last();
  ws.onopen?.({});
  ws.onmessage?.({ data: JSON.stringify({ t: "hello", session: "s", hb_ms: 10_000, pending: 0 }) });
  return ws;
}

beforeEach(() => {
  FakeSocket.all = [];
  vi.useFakeTimers();
});
afterEach(() => vi.useRealTimers());

describe("the token function", () => {
  it("is called once across 5 forced reconnects while the token is fresh", async () => {
    const reasons: TokenReason[] = [];
    const fresh = jwt(inAnHour());
    const { c } = client((r) => (reasons.push(r), fresh));
    c.connect();
    let ws = await sessionStarts();
    for (let i = 0; i < 5; i++) {
      // A gateway rollout: every session is cut and comes back.
      ws.serverClose(i % 2 ? 1011 : 4003);
      await vi.advanceTimersByTimeAsync(5_000);
      ws = await sessionStarts();
      expect(ws.sent[0]).toEqual({ t: "auth", token: fresh });
    }
    expect(FakeSocket.all).toHaveLength(6);
    expect(reasons).toEqual(["connect"]);
    expect(c.tokenCalls).toBe(1);
  });

  it("is called again when the held token is near its exp, and after 4001 or 4004", async () => {
    const reasons: TokenReason[] = [];
    let exp = Math.floor(Date.now() / 1000) + 30; // inside refreshBeforeMs (60 s)
    const { c } = client((r) => (reasons.push(r), jwt(exp)));
    c.connect();
    let ws = await sessionStarts();
    exp = inAnHour();
    ws.serverClose(1011);
    await vi.advanceTimersByTimeAsync(5_000);
    ws = await sessionStarts();
    expect(reasons).toEqual(["connect", "connect"]);
    ws.serverClose(4004);
    await vi.advanceTimersByTimeAsync(5_000);
    ws = await sessionStarts();
    ws.serverClose(4001);
    await vi.advanceTimersByTimeAsync(5_000);
    await sessionStarts();
    expect(reasons).toEqual(["connect", "connect", "expired", "expired"]);
  });

  it("is retried with jitter when it fails, and a lasting failure is a typed error", async () => {
    let calls = 0;
    const log: string[] = [];
    const { c, errors } = client(
      () => {
        calls++;
        if (calls < 3) throw new Error("token endpoint down");
        return jwt(inAnHour());
      },
      { debug: (event) => log.push(event) },
    );
    c.connect();
    await vi.advanceTimersByTimeAsync(10_000);
    await sessionStarts();
    expect(calls).toBe(3);
    expect(c.state).toBe("connected");
    expect(errors).toEqual([]);
    expect(log.filter((e) => e === "token.retry")).toHaveLength(2);

    const down = client(() => {
      throw new Error("still down");
    });
    down.c.connect();
    await vi.advanceTimersByTimeAsync(20_000);
    expect(down.errors[0]).toBeInstanceOf(TokenUnavailable);
    expect((down.errors[0] as TokenUnavailable).attempts).toBe(4);
    // The client keeps trying later (backoff), it does not spin.
    expect(down.c.state).not.toBe("closed");
    down.c.close();
  });

  it("can say logged out: the client stops and tells the app", async () => {
    let loggedIn = true;
    const { c, states, errors } = client(() => (loggedIn ? jwt(Math.floor(Date.now() / 1000) + 30) : null));
    c.connect();
    const ws = await sessionStarts();
    loggedIn = false;
    ws.serverClose(4004);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(c.state).toBe("closed");
    expect(states.at(-1)).toMatchObject({ state: "closed", reason: "logged_out" });
    expect(errors[0]).toBeInstanceOf(LoggedOut);
    const sockets = FakeSocket.all.length;
    await vi.advanceTimersByTimeAsync(120_000);
    expect(FakeSocket.all).toHaveLength(sockets);
  });

  it("a fixed token stops the client at 4004 (it would be refused again)", async () => {
    const { c, states } = client("fixed-token");
    c.connect();
    (await sessionStarts()).serverClose(4004);
    expect(states.at(-1)).toMatchObject({ state: "closed", code: 4004, reason: "revoked" });
  });
});

describe("HTTP requests", () => {
  const answer = (status: number, body: unknown = {}) => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

  it("reuse the token held, and retry once after a 401 with a fresh one", async () => {
    vi.useRealTimers();
    const reasons: TokenReason[] = [];
    let n = 0;
    const api = new HeraldApi({ url: "http://gw", token: (r) => (reasons.push(r), jwt(inAnHour(), `u${++n}`)), fetch: async (_url, init) => {
      const auth = (init?.headers as Record<string, string>).authorization;
      seen.push(auth);
      // The third request finds the token revoked.
      return seen.length === 3 ? answer(401, { error: { code: "unauthorized", message: "revoked" } }) : answer(200, { ok: true });
    } });
    const seen: string[] = [];
    await api.registerDevice();
    await api.registerDevice();
    expect(reasons).toEqual(["connect"]);
    await api.registerDevice(); // 401, then the retry with a new token
    expect(reasons).toEqual(["connect", "expired"]);
    expect(seen).toHaveLength(4);
    expect(seen[3]).not.toBe(seen[2]);
  });

  it("share one token with the WebSocket client through a TokenKeeper", async () => {
    vi.useRealTimers();
    const reasons: TokenReason[] = [];
    const keeper = new TokenKeeper((r) => (reasons.push(r), jwt(inAnHour())));
    const seen: string[] = [];
    const api = new HeraldApi({ url: "http://gw", token: keeper, fetch: async (_url, init) => (seen.push((init?.headers as Record<string, string>).authorization), answer(200, {})) });
    const c = new HeraldClient({ url: "https://gw", token: keeper, WebSocket: FakeSocket as any, browser: null });
    c.connect();
    await new Promise((resolve) => setTimeout(resolve, 0));
    last().onopen?.({});
    await api.registerDevice();
    expect(reasons).toEqual(["connect"]);
    expect(seen[0]).toBe(`Bearer ${last().sent[0].token}`);
    c.close();
  });

  it("a second 401 is thrown, and a request with no answer times out as unavailable", async () => {
    vi.useRealTimers();
    const refused = new HeraldApi({ url: "http://gw", token: () => jwt(inAnHour()), fetch: async () => answer(401, { error: { code: "unauthorized", message: "no" } }) });
    await expect(refused.registerDevice()).rejects.toMatchObject({ status: 401, code: "unauthorized" });
    const hung = new HeraldApi({
      url: "http://gw",
      token: "t",
      timeoutMs: 50,
      fetch: (_url, init) => new Promise((_, reject) => init?.signal?.addEventListener("abort", () => reject(new Error("aborted")))),
    });
    const e = await hung.registerDevice().catch((e) => e);
    expect(e).toBeInstanceOf(ApiError);
    expect(e).toMatchObject({ code: "unavailable" });
  });
});
