// A Herald device connection: the state machine (disconnected, connecting, connected,
// closed), reconnects that follow the server's signals, liveness, batched acks, repeats
// dropped by id, each conversation shown in seq order with gaps filled by `sync`, and
// durable sends. docs/client.md is the behaviour every Herald client follows.

import { AckBatch } from "./acks.js";
import { Backoff } from "./backoff.js";
import { browserEnv, watchBrowser } from "./browser.js";
import { SeenIds } from "./dedup.js";
import { Emitter } from "./events.js";
import type { MessageId } from "./ids.js";
import { Outbox, newCmid, type SendResult } from "./outbox.js";
import { parseServerFrame, sessionUrl, SUBPROTOCOL, tokenExpiry, tokenUser, type ClientFrame, type ServerFrame, type TypingState, type WireMessage } from "./protocol.js";
import { TypingIndicators, TypingSender, type Presence } from "./presence.js";
import { onSessionEnd, type Hints } from "./reconnect.js";
import { DeliveryStatuses, type MessageStatus } from "./status.js";
import { Timelines } from "./timeline.js";
import { UnreadCounts } from "./unread.js";
import type { ConversationItem } from "./api.js";
import { DEFAULTS, type ConnectionState, type HeraldEvents, type HeraldOptions, type Message, type StateChange, type TokenReason, type WebSocketFactory, type WebSocketLike } from "./options.js";
import { LoggedOut, TokenKeeper, TokenUnavailable, type Logger } from "./tokens.js";

export type { ConnectionState, HeraldEvents, HeraldOptions, Message, StateChange, TokenReason, WebSocketFactory, WebSocketLike };

const TICK_MS = 250;
/** A connection without `hello` this long is given up. */
const CONNECT_TIMEOUT_MS = 15_000;

export class HeraldClient extends Emitter<HeraldEvents> {
  private stateNow: ConnectionState = "disconnected";
  private ws: WebSocketLike | null = null;
  private readonly backoff: Backoff;
  private readonly seen: SeenIds;
  private readonly acked: SeenIds;
  private readonly acks = new AckBatch();
  private readonly outbox: Outbox;
  private readonly timelines: Timelines;
  private readonly unreadCounts = new UnreadCounts((conv, unread) => this.emit("unread", { conv, unread }));
  private readonly statuses = new DeliveryStatuses((s) => this.emit("status", s));
  private readonly typingNow = new TypingIndicators((conv, users) => this.emit("typing", { conv, users }));
  private readonly typingSent = new TypingSender();
  private readonly presences = new Map<string, Presence>();
  /** The users followed: sent again in every session, which starts following no one. */
  private followed: string[] = [];
  private readonly o: Required<Omit<HeraldOptions, "outboxStorage" | "backoff" | "WebSocket" | "browser" | "debug">> & { WebSocket: WebSocketFactory };
  private readonly tokens: TokenKeeper;
  private readonly log: Logger;
  private readonly unwatch: () => void;
  private hints: Hints = {};
  private needNewToken = false;
  private tokenNow: string | null = null;
  private hbMs = 25_000;
  private lastHeard = 0;
  private lastPing = 0;
  private caughtUp = false;
  private refreshAt: number | null = null;
  private readonly syncs = new Map<string, string>();
  private syncNo = 0;
  /** Connections opened; picks the gateway when there are several. */
  private connections = 0;
  private tick: ReturnType<typeof setInterval> | null = null;
  private ackTimer: ReturnType<typeof setTimeout> | null = null;
  private retry: ReturnType<typeof setTimeout> | null = null;
  private restored: Promise<unknown>;

  constructor(options: HeraldOptions) {
    super();
    const WS = options.WebSocket ?? (globalThis as any).WebSocket;
    if (!WS) throw new Error("no WebSocket: pass options.WebSocket (in Node, the `ws` package)");
    this.o = { ...DEFAULTS, ...options, WebSocket: WS };
    this.backoff = new Backoff(options.backoff);
    this.log = options.debug ?? (() => {});
    this.tokens =
      options.token instanceof TokenKeeper
        ? options.token
        : new TokenKeeper(options.token, {
            renewBeforeMs: this.o.refreshBeforeMs,
            log: options.debug,
            backoff: { random: options.backoff?.random },
          });
    this.seen = new SeenIds(this.o.dedupCapacity);
    this.acked = new SeenIds(this.o.dedupCapacity);
    this.outbox = new Outbox(options.outboxStorage, this.o.sendTimeoutMs);
    this.timelines = new Timelines((m) => this.show(m));
    this.restored = this.outbox.restore(Date.now());
    const env = options.browser === undefined ? browserEnv() : options.browser;
    this.unwatch = env ? watchBrowser(env, () => this.wake()) : () => {};
  }

  /** The network is back or the page visible again: reconnect now, or check the session. */
  private wake(): void {
    if (this.stateNow === "disconnected" && this.retry) {
      clearTimeout(this.retry);
      this.retry = null;
      void this.open();
    } else if (this.stateNow === "connected") {
      this.lastPing = Date.now();
      this.write({ t: "ping", ts: this.lastPing });
    }
  }

  get state(): ConnectionState {
    return this.stateNow;
  }

  /** Messages waiting for `sent`. */
  get unsent(): number {
    return this.outbox.size;
  }

  /** The highest seq shown in `conv`. */
  shown(conv: string): number {
    return this.timelines.shown(conv);
  }

  /** Unread messages of `conv`, kept live from a conversation list given to `seedUnread`. */
  unread(conv: string): number {
    return this.unreadCounts.count(conv);
  }

  /** How far the user's message `seq` of `conv` got (sent, delivered, read), if this client saw it. */
  statusOf(conv: string, seq: number): MessageStatus | undefined {
    return this.statuses.statusOf(conv, seq);
  }

  /** The other members typing in `conv` now (with `typingAndPresence`). */
  whoIsTyping(conv: string): string[] {
    return this.typingNow.typing(conv);
  }

  /** A followed user's presence as last told (with `typingAndPresence`), if known. */
  presenceOf(user: string): Presence | undefined {
    return this.presences.get(user);
  }

  /**
   * Tells the conversation's other members the user is typing (`started`, on each
   * keystroke: sent at most every 3 s per conversation) or stopped (the draft was sent
   * or cleared). Dropped when not connected: typing is a hint, never queued.
   */
  typing(conv: string, state: TypingState = "started"): void {
    if (this.stateNow !== "connected" || !this.typingSent.shouldSend(conv, state, Date.now())) return;
    this.write({ t: "typing", conv, state });
  }

  /**
   * Follows these users' presence (at most 200, the server's default bound), replacing
   * the list followed; kept across reconnects. The `presence` event tells their state
   * now, then each change. Needs `typingAndPresence`.
   */
  followPresence(users: string[]): void {
    this.followed = [...new Set(users)];
    for (const user of [...this.presences.keys()]) if (!this.followed.includes(user)) this.presences.delete(user);
    if (this.stateNow === "connected") this.write({ t: "presence_subscribe", users: this.followed, ref: "presence" });
  }

  /** Starts the unread counts from a conversation list (`HeraldApi.conversations()`). */
  seedUnread(items: Pick<ConversationItem, "id" | "last_seq" | "read_seq">[]): void {
    this.unreadCounts.seed(items);
  }

  /** Starts `conv`'s timeline after `seq` (what the app already has, or the list's `start_seq`). */
  startAfter(conv: string, seq: number): void {
    this.timelines.startAfter(conv, seq);
  }

  /** Opens the connection; it is kept open (reconnecting) until `close()` or a stop signal. */
  connect(): void {
    if (this.stateNow === "closed") throw new Error("this client is closed; create a new one");
    if (this.stateNow !== "disconnected" || this.retry) return;
    void this.open();
  }

  /** Closes for good. Unsent messages stay in the outbox's storage for the next client. */
  close(): void {
    const ws = this.ws;
    this.endSession();
    ws?.close(1000, "closed by the app");
    this.unwatch();
    this.setState("closed", { reason: "closed" });
  }

  /** Sends a message durably: resolves once committed, `{id, seq, ts, dup}`. */
  async send(conv: string, body: unknown, cmid: string = newCmid()): Promise<SendResult> {
    await this.restored;
    await this.outbox.add({ cmid, conv, body, createdAt: Date.now() }, Date.now());
    const committed = this.outbox.wait(cmid);
    this.pump();
    return committed;
  }

  /** Moves the user's read position in `conv` (dropped when not connected). */
  read(conv: string, seq: number): void {
    this.unreadCounts.readUpTo(conv, seq);
    this.write({ t: "read", conv, seq });
  }

  private setState(state: ConnectionState, extra: Partial<StateChange> = {}): void {
    if (state === this.stateNow) return;
    const previous = this.stateNow;
    this.stateNow = state;
    this.emit("state", { state, previous, ...extra });
  }

  /** How often the token function was called. */
  get tokenCalls(): number {
    return this.tokens.calls;
  }

  /** The token function failed or said "logged out": the app hears of it; a logout closes. */
  private tokenFailed(error: unknown): void {
    if (error instanceof LoggedOut) {
      this.emit("token_error", { error });
      const ws = this.ws;
      this.endSession();
      ws?.close(1000, "logged out");
      this.setState("closed", { reason: "logged_out" });
    } else if (error instanceof TokenUnavailable) {
      this.emit("token_error", { error });
    }
  }

  private async open(): Promise<void> {
    this.setState("connecting");
    let token: string;
    try {
      if (this.needNewToken) this.tokens.refused();
      token = await this.tokens.get(this.needNewToken ? "expired" : "connect");
    } catch (e) {
      this.tokenFailed(e);
      if ((this.stateNow as ConnectionState) === "closed") return;
      return this.sessionEnded(null);
    }
    if ((this.stateNow as ConnectionState) === "closed") return;
    this.needNewToken = false;
    this.tokenNow = token;
    const urls = typeof this.o.url === "string" ? [this.o.url] : this.o.url;
    const url = urls[this.connections++ % urls.length];
    const features = [...(this.o.deliveryStatus ? ["delivered"] : []), ...(this.o.typingAndPresence ? ["typing", "presence"] : [])];
    const wsUrl = sessionUrl(url, this.o.tokenIn === "query" ? token : null, features);
    const ws = this.o.offerSubprotocol ? new this.o.WebSocket(wsUrl, [SUBPROTOCOL]) : new this.o.WebSocket(wsUrl);
    this.ws = ws;
    this.hints = {};
    this.lastHeard = Date.now();
    ws.onopen = () => {
      if (this.o.tokenIn === "frame") this.write({ t: "auth", token });
    };
    ws.onmessage = (ev) => this.onText(String(ev.data));
    ws.onclose = (ev) => {
      if (this.ws === ws) this.sessionEnded(ev.code);
    };
    ws.onerror = () => {};
    this.tick = setInterval(() => this.onTick(), TICK_MS);
  }

  /** Detaches the socket and forgets what belonged to the session. */
  private endSession(): void {
    if (this.tick) clearInterval(this.tick);
    if (this.retry) clearTimeout(this.retry);
    this.tick = this.retry = null;
    if (this.ws) this.ws.onclose = this.ws.onmessage = this.ws.onopen = null;
    this.ws = null;
    this.caughtUp = false;
    this.refreshAt = null;
    this.syncs.clear();
    this.outbox.sessionEnded();
    this.timelines.sessionEnded();
    this.typingNow.clear();
    this.typingSent.reset();
  }

  private sessionEnded(code: number | null): void {
    if (this.stateNow === "closed") return;
    const hints = this.hints;
    this.endSession();
    const d = onSessionEnd(code, hints, this.backoff, this.tokens.renewable);
    this.log("session.ended", { code, decision: d });
    if (d.kind === "stop") {
      this.setState("closed", { code: code ?? undefined, reason: d.reason });
      return;
    }
    this.needNewToken ||= d.newToken;
    this.setState("disconnected", { code: code ?? undefined });
    this.retry = setTimeout(() => {
      this.retry = null;
      void this.open();
    }, d.delayMs);
  }

  private write(f: ClientFrame): boolean {
    if (!this.ws || (this.stateNow !== "connected" && f.t !== "auth")) return false;
    try {
      this.ws.send(JSON.stringify(f));
      return true;
    } catch {
      return false;
    }
  }

  private onTick(): void {
    const now = Date.now();
    if (this.stateNow === "connecting" && now - this.lastHeard > CONNECT_TIMEOUT_MS) {
      // No hello: an upgrade or auth that went nowhere.
      const ws = this.ws;
      this.sessionEnded(null);
      ws?.close(1000, "no hello");
      return;
    }
    if (this.stateNow === "connected") {
      if (now - this.lastHeard > 2 * this.hbMs) {
        // Nothing for two heartbeats: a dead path TCP would take minutes to notice.
        const ws = this.ws;
        this.sessionEnded(null);
        ws?.close(4000, "silent");
        return;
      }
      if (now - this.lastPing >= this.hbMs / 2) {
        this.lastPing = now;
        this.write({ t: "ping", ts: now });
      }
      this.pump();
      this.fillGaps(now);
      this.typingNow.expire(now);
      if (this.refreshAt !== null && now >= this.refreshAt) void this.refresh();
    }
  }

  private async refresh(): Promise<void> {
    this.refreshAt = null;
    try {
      const token = await this.tokens.renew("refresh");
      if (this.write({ t: "refresh", token, ref: "refresh" })) this.tokenNow = token;
      this.scheduleRefresh();
    } catch (e) {
      // Unavailable: the session ends at `exp` (4001) and the next connection asks again.
      this.tokenFailed(e);
    }
  }

  private scheduleRefresh(): void {
    const exp = this.tokenNow && this.tokens.renewable ? tokenExpiry(this.tokenNow) : null;
    this.refreshAt = exp === null ? null : Math.max(Date.now() + 1_000, exp * 1000 - this.o.refreshBeforeMs);
  }

  /** Sends what the outbox has due. */
  private pump(): void {
    if (this.stateNow !== "connected") return;
    for (const e of this.outbox.due(Date.now())) this.write({ t: "send", cmid: e.cmid, conv: e.conv, body: e.body });
  }

  private fillGaps(now: number): void {
    // After caught_up a gap is real; before it, one held long (unacked messages may keep
    // caught_up from coming) is filled too.
    const after = this.caughtUp ? this.o.gapSyncAfterMs : 2 * this.o.gapSyncAfterMs;
    for (const g of this.timelines.due(now, after)) {
      const ref = `gap-${++this.syncNo}`;
      this.syncs.set(ref, g.conv);
      this.write({ t: "sync", conv: g.conv, after_seq: g.afterSeq, limit: 200, ref });
    }
  }

  private ack(id: MessageId): void {
    this.acked.add(id);
    this.acks.add(id, Date.now());
    this.ackTimer ??= setTimeout(() => this.flushAcks(), this.acks.delayMs);
  }

  private flushAcks(): void {
    this.ackTimer = null;
    if (this.stateNow !== "connected") return;
    for (const ids of this.acks.take(Date.now(), true)) {
      if (!this.write({ t: "ack", ids })) this.acks.restore(ids, Date.now());
    }
  }

  private onText(text: string): void {
    this.lastHeard = Date.now();
    const f = parseServerFrame(text);
    if (f) this.onFrame(f);
  }

  private onFrame(f: ServerFrame): void {
    switch (f.t) {
      case "hello":
        this.hbMs = f.hb_ms;
        this.lastPing = Date.now();
        this.backoff.reset();
        this.setState("connected");
        this.scheduleRefresh();
        if (this.acks.size > 0) this.ackTimer ??= setTimeout(() => this.flushAcks(), 0);
        this.pump();
        if (this.o.typingAndPresence && this.followed.length > 0) {
          this.write({ t: "presence_subscribe", users: this.followed, ref: "presence" });
        }
        return;
      case "msg":
        return this.arrive(f, true);
      case "history":
        // This device's start (`start_seq`), else its user's membership's (older servers).
        if (f.start_seq !== undefined || f.joined_seq !== undefined) {
          this.timelines.startAfter(f.conv, Math.max(f.start_seq ?? 0, f.joined_seq ?? 0));
        }
        for (const m of f.items) {
          this.statuses.fromHistory(m, this.me());
          this.arrive(m, false);
        }
        if (f.ref && this.syncs.delete(f.ref)) this.timelines.synced(f.conv, f.more, Date.now(), this.o.gapSyncAfterMs);
        return;
      case "sent": {
        const r: SendResult = { id: f.id, seq: f.seq, ts: f.ts, dup: f.dup };
        this.unreadCounts.message(f.conv, f.seq);
        this.statuses.sent(f.conv, f.seq, f.id);
        // The server does not push a device its own messages: they take their place in
        // the timeline here, or the next message would wait for a sync to fill the gap.
        const e = this.outbox.entry(f.cmid);
        if (e && this.seen.add(f.id)) {
          this.timelines.arrive({ id: f.id, conv: f.conv, seq: f.seq, from: this.me(), cmid: f.cmid, ts: f.ts, body: e.body });
        }
        void this.outbox.committed(f.cmid, r).then((mine) => mine && this.emit("sent", { ...r, cmid: f.cmid, conv: f.conv }));
        return;
      }
      case "error":
        return this.onError(f);
      case "read":
        if (f.user === this.me()) this.unreadCounts.readUpTo(f.conv, f.seq);
        else this.statuses.read(f.conv, f.user, f.seq);
        return this.emit("read", { conv: f.conv, user: f.user, seq: f.seq });
      case "delivered":
        return this.statuses.delivered(f.conv, f.seq, f.count);
      case "typing":
        return this.typingNow.shown(f.conv, f.user, f.state, f.expires_in_ms, Date.now());
      case "presence": {
        if (!this.followed.includes(f.user)) return;
        const p: Presence = { user: f.user, online: f.online, lastSeen: f.last_seen };
        this.presences.set(f.user, p);
        return this.emit("presence", p);
      }
      case "caught_up":
        this.caughtUp = true;
        return this.emit("caught_up", { delivered: f.delivered });
      case "reconnect":
        this.hints.reconnectAfterMs = f.after_ms;
        return;
      case "pong":
      case "refreshed":
        return;
    }
  }

  private onError(f: Extract<ServerFrame, { t: "error" }>): void {
    const ref = f.ref ?? undefined;
    if (ref && this.outbox.has(ref)) {
      void this.outbox.refused(ref, f.code, f.message, Date.now(), f.retry_after_ms);
      return;
    }
    const conv = ref ? this.syncs.get(ref) : undefined;
    if (ref && conv !== undefined) {
      this.syncs.delete(ref);
      this.timelines.synced(conv, false, Date.now(), this.o.gapSyncAfterMs);
    }
    if (f.code === "rate_limited" && f.retry_after_ms !== undefined && !ref) this.hints.retryAfterMs = f.retry_after_ms;
    this.emit("error", { code: f.code, message: f.message, ref: f.ref });
  }

  /** A message pushed (`msg`) or pulled (`history`): repeats dropped, the rest shown in order. */
  private arrive(m: WireMessage, pushed: boolean): void {
    if (!this.seen.add(m.id)) {
      // A repeat: acked again once the app has stored the first copy.
      if (pushed && this.acked.has(m.id)) this.ack(m.id);
      return;
    }
    if (this.o.autoAck) this.ack(m.id);
    this.timelines.arrive(m);
  }

  /** The user of the session's token ("" before one is known). */
  private me = (): string => (this.tokenNow && tokenUser(this.tokenNow)) ?? "";

  private show(m: WireMessage): void {
    this.unreadCounts.message(m.conv, m.seq);
    this.typingNow.stop(m.conv, m.from);
    if (m.from === this.me()) this.statuses.sent(m.conv, m.seq, m.id);
    const msg: Message = { ...m, ack: () => this.ack(m.id) };
    this.emit("message", msg);
  }
}
