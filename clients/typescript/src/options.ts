// The client's options, events and the WebSocket it needs: the types an app sees.

import type { BackoffOptions } from "./backoff.js";
import type { BrowserEnv } from "./browser.js";
import type { OutboxStorage, SendResult } from "./outbox.js";
import type { Presence } from "./presence.js";
import type { WireMessage } from "./protocol.js";
import type { MessageStatus } from "./status.js";
import type { LoggedOut, Logger, TokenKeeper, TokenReason, TokenSource, TokenUnavailable } from "./tokens.js";

export type { Logger, TokenReason, TokenSource };

export type ConnectionState = "disconnected" | "connecting" | "connected" | "closed";

/** The part of the WebSocket API the client uses: the browser's, or the `ws` package's. */
export interface WebSocketLike {
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
}
export type WebSocketFactory = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface HeraldOptions {
  /**
   * The gateway: `https://chat.example.com` (or `http://`, `ws://`, `wss://`). Several:
   * each connection after a lost one tries the next (a load balancer usually does this).
   */
  url: string | string[];
  /**
   * A token, or a function returning a fresh one. It is called only when no token is
   * held, the one held is within `refreshBeforeMs` of its `exp`, or the server refused
   * it (4001, 4004): not per reconnect. A call that throws is retried with jittered
   * backoff, then reported as `token_error` (`TokenUnavailable`). Returning `null`
   * means the user is logged out: the client closes (`logged_out`) and says so. A
   * `TokenKeeper` shared with a `HeraldApi` makes both use one token.
   */
  token: TokenSource | TokenKeeper;
  /** A debug hook: token calls and retries, reconnect decisions, with details. */
  debug?: Logger;
  /** The WebSocket class (default: the global one; in Node pass `ws`'s). */
  WebSocket?: WebSocketFactory;
  /** Ack each message when it arrives (default). False: the app calls `msg.ack()` once it stored it. */
  autoAck?: boolean;
  /** Where the token goes: the first frame (default; kept out of URLs and logs) or the query string. */
  tokenIn?: "frame" | "query";
  /** Offer `herald.v1` (default true; false for gateways older than the subprotocol). */
  offerSubprotocol?: boolean;
  backoff?: BackoffOptions;
  /** A gap still open this long after `caught_up` is filled with `sync` (default 3 000 ms). */
  gapSyncAfterMs?: number;
  /** A send without an answer this long is resent, same cmid (default 10 000 ms). */
  sendTimeoutMs?: number;
  /** Message ids remembered to drop repeats (default 10 000). */
  dedupCapacity?: number;
  outboxStorage?: OutboxStorage;
  /** `online`/`visibilitychange` hooks (default: the browser's when there is one; null: none). */
  browser?: BrowserEnv | null;
  /** Refresh the token in the session this long before its `exp` (default 60 000 ms). */
  refreshBeforeMs?: number;
  /** Ask for `delivered` frames (the `status` event; default false: no ticks, no frames). */
  deliveryStatus?: boolean;
  /** Ask for `typing` and `presence` frames (the `typing` and `presence` events; default false: none). */
  typingAndPresence?: boolean;
}

/** The defaults of the options that have one. */
export const DEFAULTS = {
  autoAck: true,
  tokenIn: "frame",
  offerSubprotocol: true,
  gapSyncAfterMs: 3_000,
  sendTimeoutMs: 10_000,
  dedupCapacity: 10_000,
  refreshBeforeMs: 60_000,
  deliveryStatus: false,
  typingAndPresence: false,
} satisfies Partial<HeraldOptions>;

/** A message shown to the app, in seq order per conversation. */
export interface Message extends WireMessage {
  /** Records that the app stored it (only needed with `autoAck: false`). */
  ack(): void;
}

export interface StateChange {
  state: ConnectionState;
  previous: ConnectionState;
  /** The close code that ended the session, when one did. */
  code?: number;
  /** Why the client stopped (`closed`): `replaced`, `protocol`, `unauthorized`, `revoked`, `logged_out` or `closed` by the app. */
  reason?: string;
}

export interface HeraldEvents {
  state: StateChange;
  message: Message;
  read: { conv: string; user: string; seq: number };
  caught_up: { delivered: number };
  /** A conversation's unread count changed (see `seedUnread`). */
  unread: { conv: string; unread: number };
  sent: SendResult & { cmid: string; conv: string };
  /** How far one of the user's own messages got changed (sent, delivered, read). */
  status: MessageStatus;
  /** Who is typing in `conv` changed (with `typingAndPresence`). */
  typing: { conv: string; users: string[] };
  /** A followed user's presence, as the server told it (with `typingAndPresence`, see `followPresence`). */
  presence: Presence;
  /** The token function failed after its retries (`TokenUnavailable`), or said the user is logged out (`LoggedOut`). */
  token_error: { error: TokenUnavailable | LoggedOut };
  /** A server `error` not answered through a promise (acks, reads, refused refreshes, ...). */
  error: { code: string; message: string; ref?: string | null };
}

