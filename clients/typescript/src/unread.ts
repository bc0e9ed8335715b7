// Unread counts kept live between two conversation lists: `last_seq - read_seq` per
// conversation (docs/protocol.md section 2.5), moved by messages shown and sent, and by
// the user's own read positions (its `read` frames from other devices, and its reads).

import type { ConversationItem } from "./api.js";

export class UnreadCounts {
  private readonly last = new Map<string, number>();
  private readonly read = new Map<string, number>();

  /** `changed` is called with a conversation's new count whenever it changes. */
  constructor(private readonly changed: (conv: string, unread: number) => void) {}

  /** Starts from a conversation list (`GET /v1/conversations`). */
  seed(items: Pick<ConversationItem, "id" | "last_seq" | "read_seq">[]): void {
    for (const c of items) {
      const before = this.count(c.id);
      this.last.set(c.id, Math.max(this.last.get(c.id) ?? 0, c.last_seq));
      this.read.set(c.id, Math.max(this.read.get(c.id) ?? 0, c.read_seq));
      this.report(c.id, before);
    }
  }

  /** A message of `conv` at `seq` exists (shown, or sent by this device). */
  message(conv: string, seq: number): void {
    const before = this.count(conv);
    if (seq > (this.last.get(conv) ?? 0)) this.last.set(conv, seq);
    this.report(conv, before);
  }

  /** The user's read position in `conv` moved to `seq` (never back). */
  readUpTo(conv: string, seq: number): void {
    const before = this.count(conv);
    if (seq > (this.read.get(conv) ?? 0)) this.read.set(conv, seq);
    this.report(conv, before);
  }

  count(conv: string): number {
    return Math.max(0, (this.last.get(conv) ?? 0) - (this.read.get(conv) ?? 0));
  }

  private report(conv: string, before: number): void {
    const now = this.count(conv);
    if (now !== before) this.changed(conv, now);
  }
}
