// The wire frames of docs/protocol.md section 3, as TypeScript types, and their parsing.
// Ids are strings on the wire, so JSON.parse keeps them exact; frames whose fields have
// the wrong types are refused here rather than trusted.

import { isMessageId, type MessageId } from "./ids.js";

/** The subprotocol naming this protocol's version (`Sec-WebSocket-Protocol`). */
export const SUBPROTOCOL = "herald.v1";

/** Close codes (docs/protocol.md section 3.6). */
export const Close = {
  HeartbeatTimeout: 4000,
  Unauthorized: 4001,
  Replaced: 4002,
  Draining: 4003,
  /** The token was revoked (the user or device was disconnected by the server API): do not reuse it. */
  Revoked: 4004,
  Policy: 4008,
  Protocol: 4009,
  InternalError: 1011,
  TryAgainLater: 1013,
} as const;

export type ErrorCode =
  | "bad_request"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "conflict"
  | "too_large"
  | "rate_limited"
  | "unavailable"
  | "internal";

/** How far one of the user's own messages got (history items only, docs/protocol.md section 2.7). */
export interface WireStatus {
  of: number;
  delivered: number;
  read: number;
}

/** A member's role in a group (docs/protocol.md section 2.4), lowest first. */
export type MemberRole = "member" | "admin" | "owner";

/**
 * What a timeline event says happened (docs/protocol.md section 4.11), by `type`. Its
 * message's `from` is who did it. A type this client does not know (a newer server's)
 * still counts in the timeline: ack it and show nothing, or a generic line.
 */
export type TimelineEvent =
  | { type: "member_added"; users: string[] }
  | { type: "member_removed"; users: string[] }
  | { type: "member_left" }
  | { type: "title_changed"; title: string | null }
  | { type: "role_changed"; user: string; role: MemberRole }
  | { type: "recalled"; target: MessageId; target_seq: number }
  | { type: "edited"; target: MessageId; target_seq: number };

/** A committed message (`msg` frames and history items). `body` is the sender's JSON. */
export interface WireMessage {
  id: MessageId;
  conv: string;
  seq: number;
  from: string;
  cmid: string;
  ts: number;
  body: unknown;
  /** On the user's own messages in history pages. */
  status?: WireStatus;
  /** On a timeline event: what happened (`body` is null, or an edit's new body). */
  event?: TimelineEvent | null;
  /** On a message edited before it was read from the database: its latest edit's seq (`body` is that edit's). */
  edited_seq?: number | null;
  /** On a message recalled before it was read from the database: the recall's seq (`body` is null). */
  recalled_seq?: number | null;
}

export type ServerFrame =
  | { t: "hello"; session: string; hb_ms: number; pending: number }
  | ({ t: "msg" } & WireMessage)
  | { t: "sent"; cmid: string; id: MessageId; conv: string; seq: number; ts: number; dup: boolean }
  | { t: "read"; conv: string; user: string; seq: number }
  | { t: "caught_up"; delivered: number }
  | { t: "history"; conv: string; items: WireMessage[]; more: boolean; ref: string | null; joined_seq?: number; start_seq?: number }
  | { t: "pong"; ts: number }
  | { t: "error"; code: ErrorCode; message: string; ref?: string | null; retry_after_ms?: number }
  | { t: "reconnect"; after_ms: number }
  | { t: "refreshed"; exp: number; ref: string | null }
  | { t: "delivered"; conv: string; seq: number; count: number; user?: string }
  | { t: "typing"; conv: string; user: string; state: TypingState; expires_in_ms: number }
  | { t: "presence"; user: string; online: boolean; last_seen: number | null };

/** Whether a member started or stopped typing (docs/protocol.md section 4.12). */
export type TypingState = "started" | "stopped";

export type ClientFrame =
  | { t: "auth"; token: string; ref?: string }
  | { t: "refresh"; token: string; ref?: string }
  | { t: "send"; cmid: string; conv: string; body: unknown }
  | { t: "ack"; ids: MessageId[] }
  | { t: "read"; conv: string; seq: number }
  | { t: "sync"; conv: string; after_seq?: number; limit?: number; ref?: string }
  | { t: "ping"; ts?: number }
  | { t: "typing"; conv: string; state?: TypingState; ref?: string }
  | { t: "presence_subscribe"; users: string[]; ref?: string };

const isNat = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
const isStr = (v: unknown): v is string => typeof v === "string";

const isOptNat = (v: unknown): boolean => v === undefined || v === null || isNat(v);

/** An event of a known type must be well-formed; one of an unknown type is kept as it is. */
function isEvent(e: any): boolean {
  if (e === undefined || e === null) return true;
  if (typeof e !== "object" || !isStr(e.type)) return false;
  switch (e.type) {
    case "member_added":
    case "member_removed":
      return Array.isArray(e.users) && e.users.every(isStr);
    case "title_changed":
      return e.title === null || isStr(e.title);
    case "role_changed":
      return isStr(e.user) && isStr(e.role);
    case "recalled":
    case "edited":
      return isMessageId(e.target) && isNat(e.target_seq);
    default:
      return true;
  }
}

function isMessage(m: any): m is WireMessage {
  return (
    m !== null &&
    typeof m === "object" &&
    isMessageId(m.id) &&
    isStr(m.conv) &&
    isNat(m.seq) &&
    isStr(m.from) &&
    isStr(m.cmid) &&
    isNat(m.ts) &&
    "body" in m &&
    isEvent(m.event) &&
    isOptNat(m.edited_seq) &&
    isOptNat(m.recalled_seq)
  );
}

/**
 * Parses a server frame. `null` for a frame this client does not know (a newer server's:
 * skipped, as the protocol asks) or one whose fields are malformed.
 */
export function parseServerFrame(text: string): ServerFrame | null {
  let f: any;
  try {
    f = JSON.parse(text);
  } catch {
    return null;
  }
  if (f === null || typeof f !== "object" || !isStr(f.t)) return null;
  const ok = (() => {
    switch (f.t) {
      case "hello":
        return isStr(f.session) && isNat(f.hb_ms) && isNat(f.pending);
      case "msg":
        return isMessage(f);
      case "sent":
        return isStr(f.cmid) && isMessageId(f.id) && isStr(f.conv) && isNat(f.seq) && isNat(f.ts) && typeof f.dup === "boolean";
      case "read":
        return isStr(f.conv) && isStr(f.user) && isNat(f.seq);
      case "caught_up":
        return isNat(f.delivered);
      case "history":
        return isStr(f.conv) && Array.isArray(f.items) && f.items.every(isMessage) && typeof f.more === "boolean";
      case "pong":
        return isNat(f.ts);
      case "error":
        return isStr(f.code) && isStr(f.message);
      case "reconnect":
        return isNat(f.after_ms);
      case "refreshed":
        return isNat(f.exp);
      case "delivered":
        return isStr(f.conv) && isNat(f.seq) && isNat(f.count) && (f.user === undefined || isStr(f.user));
      case "typing":
        return isStr(f.conv) && isStr(f.user) && (f.state === "started" || f.state === "stopped") && isNat(f.expires_in_ms);
      case "presence":
        return isStr(f.user) && typeof f.online === "boolean" && isOptNat(f.last_seen);
      default:
        return false;
    }
  })();
  return ok ? (f as ServerFrame) : null;
}

/**
 * The session's URL: the token in the query when asked (`tokenIn: "query"`), and the
 * optional frames asked for (`features=`, docs/protocol.md section 3.1).
 */
export function sessionUrl(url: string, token: string | null, features: string[]): string {
  const params = [token === null ? "" : `access_token=${encodeURIComponent(token)}`, features.length ? `features=${features.join(",")}` : ""];
  const query = params.filter(Boolean).join("&");
  return `${url.replace(/^http/, "ws").replace(/\/+$/, "")}/v1/ws${query ? `?${query}` : ""}`;
}

/** A JWT's claims, without checking the token; `null` when unreadable. */
function claims(token: string): any {
  const part = token.split(".")[1];
  if (!part) return null;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(globalThis.atob(b64 + "===".slice((b64.length + 3) % 4)));
  } catch {
    return null;
  }
}

/** The `exp` claim (seconds) of a JWT, without checking it; `null` when unreadable. */
export function tokenExpiry(token: string): number | null {
  const exp = claims(token)?.exp;
  return isNat(exp) ? exp : null;
}

/** The `sub` claim (the user) of a JWT, without checking it; `null` when unreadable. */
export function tokenUser(token: string): string | null {
  const sub = claims(token)?.sub;
  return isStr(sub) ? sub : null;
}
