// Acks go out in batches (one frame for many ids), a few milliseconds after the first
// id waits, or at once when the batch is full. Ids not yet sent when a session ends are
// sent in the next one: acks are idempotent and the server accepts unknown ids.

import type { MessageId } from "./ids.js";

export class AckBatch {
  private ids: MessageId[] = [];
  private since: number | null = null;

  constructor(
    readonly delayMs = 20,
    private readonly max = 200,
  ) {}

  add(id: MessageId, now: number): void {
    if (this.ids.length === 0) this.since = now;
    this.ids.push(id);
  }

  /** When the batch is due (ms), or null when empty. */
  dueAt(): number | null {
    if (this.since === null) return null;
    return this.ids.length >= this.max ? this.since : this.since + this.delayMs;
  }

  /** The ids to send now (all, in frames of at most `max`), if due. */
  take(now: number, force = false): MessageId[][] {
    const due = this.dueAt();
    if (due === null || (!force && now < due)) return [];
    const out: MessageId[][] = [];
    for (let i = 0; i < this.ids.length; i += this.max) out.push(this.ids.slice(i, i + this.max));
    this.ids = [];
    this.since = null;
    return out;
  }

  /** Puts ids back (a send failed): they go first next time. */
  restore(ids: MessageId[], now: number): void {
    if (ids.length === 0) return;
    this.ids = [...ids, ...this.ids];
    this.since ??= now;
  }

  get size(): number {
    return this.ids.length;
  }
}
