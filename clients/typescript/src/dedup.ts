// Repeats are normal (a lost ack, a reconnect, a rebuild after Redis data loss): a
// message already seen is dropped by id, and acked again. The set is bounded: the
// oldest ids are forgotten first, and a repeat that old is still caught by the
// timeline, whose seq it is below.

import type { MessageId } from "./ids.js";

export class SeenIds {
  private readonly ids = new Set<MessageId>();

  constructor(private readonly capacity = 10_000) {}

  /** Records `id`; false when it was already seen. */
  add(id: MessageId): boolean {
    if (this.ids.has(id)) return false;
    this.ids.add(id);
    if (this.ids.size > this.capacity) {
      // A Set iterates in insertion order: the first is the oldest.
      const oldest = this.ids.values().next().value as MessageId;
      this.ids.delete(oldest);
    }
    return true;
  }

  has(id: MessageId): boolean {
    return this.ids.has(id);
  }

  get size(): number {
    return this.ids.size;
  }
}
