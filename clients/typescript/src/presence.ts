// Typing indicators and presence (docs/protocol.md section 4.12, docs/client.md
// section 10): who is typing where, until when; who is online; and how often this
// client tells the server the user is typing. Ephemeral: nothing here is stored.

import type { TypingState } from "./protocol.js";

/** While the user keeps typing, `started` is sent again this often (the server shows it for `expires_in_ms`, 6 s by default). */
export const TYPING_RENEW_MS = 3_000;

/** Who is typing in each conversation, each until its indicator expires. */
export class TypingIndicators {
  /** conv -> user -> when the indicator expires (ms). */
  private readonly byConv = new Map<string, Map<string, number>>();

  constructor(private readonly changed: (conv: string, users: string[]) => void) {}

  /** The users typing in `conv` now, in the order they started. */
  typing(conv: string): string[] {
    return [...(this.byConv.get(conv)?.keys() ?? [])];
  }

  /** A `typing` frame. */
  shown(conv: string, user: string, state: TypingState, expiresInMs: number, now: number): void {
    if (state === "started") {
      let users = this.byConv.get(conv);
      if (!users) this.byConv.set(conv, (users = new Map()));
      const isNew = !users.has(user);
      users.set(user, now + expiresInMs);
      if (isNew) this.changed(conv, this.typing(conv));
    } else {
      this.stop(conv, user);
    }
  }

  /** The user's message arrived, or its indicator stopped: no longer typing. */
  stop(conv: string, user: string): void {
    const users = this.byConv.get(conv);
    if (!users?.delete(user)) return;
    if (users.size === 0) this.byConv.delete(conv);
    this.changed(conv, this.typing(conv));
  }

  /** Drops the indicators that expired. */
  expire(now: number): void {
    for (const [conv, users] of [...this.byConv]) {
      for (const [user, until] of [...users]) if (until <= now) this.stop(conv, user);
    }
  }

  /** The session ended: a new one starts with no one typing. */
  clear(): void {
    for (const [conv, users] of [...this.byConv]) for (const user of [...users.keys()]) this.stop(conv, user);
  }
}

/** When to tell the server the user is typing: `started` at most every `TYPING_RENEW_MS` per conversation, `stopped` once after it. */
export class TypingSender {
  /** conv -> when `started` was last sent. */
  private readonly started = new Map<string, number>();

  /** Whether to send this state for `conv` now. */
  shouldSend(conv: string, state: TypingState, now: number): boolean {
    const last = this.started.get(conv);
    if (state === "stopped") return this.started.delete(conv);
    if (last !== undefined && now - last < TYPING_RENEW_MS) return false;
    this.started.set(conv, now);
    return true;
  }

  /** A new session: the server has forgotten what was sent. */
  reset(): void {
    this.started.clear();
  }
}

/** A user's presence as the server last told it. */
export interface Presence {
  user: string;
  online: boolean;
  /** While offline, when its last session ended (ms); null when online or unknown. */
  lastSeen: number | null;
}
