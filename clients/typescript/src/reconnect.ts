// What to do when a session ends, by its close code (docs/protocol.md section 3.6) and
// the hints the server gave before closing: `reconnect.after_ms` (drain) and an
// `error`'s `retry_after_ms` (login storm, connection limits).

import type { Backoff } from "./backoff.js";
import { Close } from "./protocol.js";

/** Hints from the session that ended. */
export interface Hints {
  /** From a `reconnect` frame. */
  reconnectAfterMs?: number;
  /** From an `error` `rate_limited` without a request's ref (a refused session). */
  retryAfterMs?: number;
}

export type Decision =
  /** Reconnect after `delayMs`; `newToken`: ask the app for a new token first. */
  | { kind: "reconnect"; delayMs: number; newToken: boolean }
  /** Do not reconnect: the app must act (`replaced`: another session of this device is live, or it logged out). */
  | { kind: "stop"; reason: "replaced" | "protocol" | "unauthorized" | "revoked" };

/**
 * `code`: the close code, or null when the session was lost without one (the network,
 * or the client gave a silent session up). `canRenewToken`: the app gave a token
 * provider (a fixed token that was refused cannot get better).
 */
export function onSessionEnd(code: number | null, hints: Hints, backoff: Backoff, canRenewToken: boolean): Decision {
  switch (code) {
    case Close.Replaced:
      return { kind: "stop", reason: "replaced" };
    case Close.Protocol:
      return { kind: "stop", reason: "protocol" };
    case Close.Unauthorized:
      return canRenewToken ? { kind: "reconnect", delayMs: backoff.next(), newToken: true } : { kind: "stop", reason: "unauthorized" };
    case Close.Revoked:
      // The same token would be refused: only a new one may reconnect.
      return canRenewToken ? { kind: "reconnect", delayMs: backoff.next(), newToken: true } : { kind: "stop", reason: "revoked" };
    case Close.Draining:
      return { kind: "reconnect", delayMs: hints.reconnectAfterMs ?? backoff.next(), newToken: false };
    case Close.Policy:
    case Close.TryAgainLater:
      return { kind: "reconnect", delayMs: hints.retryAfterMs ?? backoff.next(), newToken: false };
    default:
      // 1011, 4000, a network failure, any other code: jittered backoff; a drain hint
      // that came before the connection broke still counts.
      return { kind: "reconnect", delayMs: hints.reconnectAfterMs ?? backoff.next(), newToken: false };
  }
}
