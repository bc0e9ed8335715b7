// The HTTP API (docs/protocol.md section 2), typed: conversations, members, titles,
// roles, recalls and edits, history, sync, reads, device registration and logout.
// `429 rate_limited` is retried after its `Retry-After`; a recall or edit is retried
// with its cmid while the server is `unavailable`; a `401` is retried once with a new
// token; a request not answered within `timeoutMs` is `unavailable`; every other error
// is thrown as an [`ApiError`] with the protocol's code.

import type { MessageId } from "./ids.js";
import { TokenKeeper, type Logger, type TokenSource } from "./tokens.js";
import { newCmid } from "./outbox.js";
import type { ErrorCode, MemberRole, WireMessage } from "./protocol.js";

export interface Conversation {
  id: string;
  kind: "direct" | "group";
  title: string | null;
  members: string[];
  /** Each current member's role. */
  roles: Record<string, MemberRole>;
  last_seq: number;
  created_at: number;
}

/** A committed timeline change's event: where it is in the conversation. */
export interface ChangeResult {
  id: MessageId;
  conv: string;
  seq: number;
  ts: number;
  /** This cmid was committed before: the first commit's event. */
  dup: boolean;
}

/** An item of the caller's conversation list, with its unread count. */
export interface ConversationItem {
  id: string;
  kind: "direct" | "group";
  title: string | null;
  last_seq: number;
  read_seq: number;
  /** `last_seq - read_seq`: the caller's unread messages. */
  unread: number;
  joined_seq: number;
  /** Where this device's timeline starts (at or above `joined_seq`); absent from older servers. */
  start_seq?: number;
  last_message?: WireMessage;
}

export interface Page<T> {
  items: T[];
}

/** A refusal: the HTTP status and the protocol's error code (section 2.1). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = "ApiError";
  }
}

export interface ApiOptions {
  /** The gateway: `https://chat.example.com`. */
  url: string;
  /**
   * A token, a function returning a fresh one, or a `TokenKeeper` shared with other
   * clients. The function is called only when no token is held, the one held is near
   * its `exp`, or a request was refused with 401 (then retried once with the new one);
   * not per request.
   */
  token: TokenSource | TokenKeeper;
  /** A request not answered this long is aborted with `ApiError` `unavailable` (default 15 000 ms). */
  timeoutMs?: number;
  /** A debug hook: token calls, retries after 401, timeouts. */
  debug?: Logger;
  /** `fetch` (default: the global one). */
  fetch?: typeof globalThis.fetch;
  /** How many times a `429` is retried after its `Retry-After` (default 3). */
  maxRetries?: number;
}

/** The push services a token may belong to (protocol section 2.12). */
export type PushPlatform = "apns" | "apns_sandbox" | "fcm" | "hms" | "webpush";

export class HeraldApi {
  private readonly base: string;
  private readonly fetch: typeof globalThis.fetch;
  private readonly tokens: TokenKeeper;

  constructor(private readonly o: ApiOptions) {
    this.base = o.url.replace(/^ws/, "http").replace(/\/+$/, "");
    this.fetch = o.fetch ?? globalThis.fetch.bind(globalThis);
    this.tokens = o.token instanceof TokenKeeper ? o.token : new TokenKeeper(o.token, { log: o.debug });
  }

  registerDevice(): Promise<{ tenant: string; user: string; device: string; platform: string }> {
    return this.call("POST", "/v1/devices");
  }

  /** Logs this device out (its session closes with 4002). */
  async logout(): Promise<void> {
    await this.call("DELETE", "/v1/devices/me");
  }

  /**
   * Registers (or replaces) this device's push token, so that messages it has not acked
   * in time reach it as push notifications (protocol section 2.12). Call it whenever
   * the platform hands the app a token.
   */
  registerPush(platform: PushPlatform, token: string): Promise<{ platform: PushPlatform; token: string; updated_at: number }> {
    return this.call("PUT", "/v1/devices/me/push", { platform, token });
  }

  /** Removes this device's push token: no more push notifications. */
  async unregisterPush(): Promise<void> {
    await this.call("DELETE", "/v1/devices/me/push");
  }

  createConversation(c: { id?: string; kind: "direct" | "group"; members: string[]; title?: string | null }): Promise<Conversation> {
    return this.call("POST", "/v1/conversations", c);
  }

  changeMembers(conv: string, change: { add?: string[]; remove?: string[] }): Promise<Conversation> {
    return this.call("POST", `/v1/conversations/${encodeURIComponent(conv)}/members`, change);
  }

  /** Sets (or with `null` removes) a group's title: a `title_changed` event. */
  changeTitle(conv: string, title: string | null): Promise<Conversation> {
    return this.call("POST", `/v1/conversations/${encodeURIComponent(conv)}/title`, { title });
  }

  /** Gives a member a role (the owner only; `owner` hands ownership over): a `role_changed` event. */
  changeRole(conv: string, user: string, role: MemberRole): Promise<Conversation> {
    return this.call("POST", `/v1/conversations/${encodeURIComponent(conv)}/roles`, { user, role });
  }

  /** Recalls a message (its sender within the recall window, or a group's manager): a `recalled` event. */
  recall(id: MessageId, cmid: string = newCmid()): Promise<ChangeResult> {
    return this.durably(() => this.call("POST", `/v1/messages/${id}/recall`, { cmid }));
  }

  /** Edits one of the user's messages within the edit window: an `edited` event carrying `body`. */
  edit(id: MessageId, body: unknown, cmid: string = newCmid()): Promise<ChangeResult> {
    return this.durably(() => this.call("POST", `/v1/messages/${id}/edit`, { cmid, body }));
  }

  /** One page of the caller's conversations, most recently active first, with unread counts. */
  conversations(o: { limit?: number; cursor?: string } = {}): Promise<Page<ConversationItem> & { next_cursor?: string }> {
    return this.call("GET", `/v1/conversations${query({ limit: o.limit, cursor: o.cursor })}`);
  }

  /** History of one conversation after `afterSeq`, in seq order. */
  history(conv: string, o: { afterSeq?: number; limit?: number } = {}): Promise<Page<WireMessage> & { more: boolean; joined_seq: number; start_seq?: number }> {
    return this.call("GET", `/v1/conversations/${encodeURIComponent(conv)}/messages${query({ after_seq: o.afterSeq, limit: o.limit })}`);
  }

  /** Every message of the caller's conversations with an id above `after`, settled ones only. */
  sync(o: { after?: MessageId; limit?: number } = {}): Promise<Page<WireMessage> & { more: boolean }> {
    return this.call("GET", `/v1/sync${query({ after: o.after, limit: o.limit })}`);
  }

  /** Whether the caller's contacts among `users` are online (at most 200); others are left out of the answer. */
  presence(users: string[]): Promise<{ users: { user: string; online: boolean; last_seen: number | null }[] }> {
    return this.call("GET", `/v1/presence${query({ users: users.join(",") })}`);
  }

  /** Moves the caller's read position (never backwards). */
  read(conv: string, seq: number): Promise<{ conv: string; read_seq: number }> {
    return this.call("POST", `/v1/conversations/${encodeURIComponent(conv)}/read`, { seq });
  }

  /** Sends over HTTP (the WebSocket client's `send` is usually better: it keeps an outbox). */
  send(cmid: string, conv: string, body: unknown): Promise<{ id: MessageId; conv: string; seq: number; ts: number; dup: boolean }> {
    return this.call("POST", "/v1/messages", { cmid, conv, body });
  }

  /** Retries a change keyed by its cmid while the server says `unavailable` (it was not confirmed in time). */
  private async durably<T>(change: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await change();
      } catch (e) {
        if (!(e instanceof ApiError && e.code === "unavailable") || attempt >= (this.o.maxRetries ?? 3) + 2) throw e;
        await new Promise((resolve) => setTimeout(resolve, 250 * attempt));
      }
    }
  }

  private async fetchWithin(url: string, init: RequestInit): Promise<Response> {
    const timeoutMs = this.o.timeoutMs ?? 15_000;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), timeoutMs);
    try {
      return await this.fetch(url, { ...init, signal: abort.signal });
    } catch (e) {
      if (abort.signal.aborted) {
        this.o.debug?.("api.timeout", { url, timeoutMs });
        throw new ApiError(0, "unavailable", `no answer within ${timeoutMs} ms`);
      }
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const retries = this.o.maxRetries ?? 3;
    let renewed = false;
    for (let attempt = 0; ; attempt++) {
      const token = await this.tokens.get("connect");
      const r = await this.fetchWithin(`${this.base}${path}`, {
        method,
        headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (r.status === 401 && !renewed && this.tokens.renewable) {
        // The token held was refused (expired early, revoked): once more with a new one.
        renewed = true;
        this.tokens.refused();
        this.o.debug?.("api.unauthorized_retry", { method, path });
        await this.tokens.get("expired");
        continue;
      }
      if (r.status === 429 && attempt < retries) {
        const secs = Number(r.headers.get("retry-after"));
        await new Promise((resolve) => setTimeout(resolve, (Number.isFinite(secs) && secs > 0 ? secs : 1) * 1000));
        continue;
      }
      const text = await r.text();
      if (r.ok) return (text ? JSON.parse(text) : undefined) as T;
      let code: ErrorCode = "internal";
      let message = r.statusText;
      try {
        const e = JSON.parse(text).error;
        code = e.code;
        message = e.message;
      } catch {
        // Not the protocol's body (a proxy's page): keep the status.
      }
      throw new ApiError(r.status, code, message);
    }
  }
}

function query(params: Record<string, string | number | undefined>): string {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${encodeURIComponent(String(v))}`);
  return parts.length ? `?${parts.join("&")}` : "";
}
