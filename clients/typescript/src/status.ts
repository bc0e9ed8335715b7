// The delivery status of the user's own messages (docs/client.md section 7): sent once
// committed, delivered to `delivered` other members (raised by `delivered` frames, which
// count for every own message at or below their seq), read by `read` members (from the
// other members' `read` frames), and seeded from history pages' `status`.

import type { MessageId } from "./ids.js";
import type { WireMessage } from "./protocol.js";

export type DeliveryState = "sent" | "delivered" | "read";

/** How far one of the user's own messages got. Counts only grow. */
export interface MessageStatus {
  conv: string;
  seq: number;
  id: MessageId;
  state: DeliveryState;
  /** Other members that have it on a device (or read it). */
  delivered: number;
  /** Other members that read it. */
  read: number;
  /** Its recipients, when history said (`status.of`). */
  of?: number;
}

/** Own messages remembered per conversation (the newest). */
const PER_CONVERSATION = 500;

export class DeliveryStatuses {
  /** conv -> seq -> status, of the user's own messages. */
  private readonly mine = new Map<string, Map<number, MessageStatus>>();
  /** conv -> other member -> read position. */
  private readonly readers = new Map<string, Map<string, number>>();

  /** `changed` is called with a message's status whenever it changes. */
  constructor(private readonly changed: (s: MessageStatus) => void) {}

  /** The status of the user's message `seq` in `conv`, if it is one this client saw. */
  statusOf(conv: string, seq: number): MessageStatus | undefined {
    const s = this.mine.get(conv)?.get(seq);
    return s && { ...s };
  }

  /** One of the user's messages was committed (`sent`, or seen from another device). */
  sent(conv: string, seq: number, id: MessageId): void {
    let msgs = this.mine.get(conv);
    if (!msgs) this.mine.set(conv, (msgs = new Map()));
    if (msgs.has(seq)) return;
    const read = [...(this.readers.get(conv)?.values() ?? [])].filter((p) => p >= seq).length;
    const s: MessageStatus = { conv, seq, id, state: "sent", delivered: read, read };
    msgs.set(seq, s);
    if (msgs.size > PER_CONVERSATION) msgs.delete(Math.min(...msgs.keys()));
    this.settle(s);
  }

  /** A history item: the user's own message with its `status`. */
  fromHistory(m: WireMessage, me: string): void {
    if (m.from !== me) return;
    this.sent(m.conv, m.seq, m.id);
    const s = this.mine.get(m.conv)?.get(m.seq);
    if (!s || !m.status) return;
    s.of = m.status.of;
    this.raise(s, m.status.delivered, m.status.read);
  }

  /** A `delivered` frame: `count` other members have every own message up to `seq`. */
  delivered(conv: string, seq: number, count: number): void {
    for (const s of this.mine.get(conv)?.values() ?? []) {
      if (s.seq <= seq) this.raise(s, count, s.read);
    }
  }

  /** A `read` frame of another member: its position in `conv`. */
  read(conv: string, user: string, seq: number): void {
    let readers = this.readers.get(conv);
    if (!readers) this.readers.set(conv, (readers = new Map()));
    if (seq <= (readers.get(user) ?? 0)) return;
    readers.set(user, seq);
    const positions = [...readers.values()];
    for (const s of this.mine.get(conv)?.values() ?? []) {
      if (s.seq <= seq) this.raise(s, s.delivered, positions.filter((p) => p >= s.seq).length);
    }
  }

  private raise(s: MessageStatus, delivered: number, read: number): void {
    if (delivered <= s.delivered && read <= s.read) return;
    s.read = Math.max(s.read, read);
    // Reading implies delivery.
    s.delivered = Math.max(s.delivered, delivered, s.read);
    this.settle(s);
  }

  private settle(s: MessageStatus): void {
    s.state = s.read > 0 ? "read" : s.delivered > 0 ? "delivered" : "sent";
    this.changed({ ...s });
  }
}
