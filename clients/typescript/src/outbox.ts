// Durable sends (docs/protocol.md section 4.1): a message the app sends is kept, under a
// client-generated `cmid`, until the server answers `sent`. It is resent with the same
// `cmid` after a lost connection, `unavailable` or `rate_limited` (after the hint), and
// the server never commits it twice. The storage is pluggable so the outbox survives a
// reload (IndexedDB in browsers, see indexeddb.ts); memory by default.

import { Backoff } from "./backoff.js";
import type { MessageId } from "./ids.js";
import type { ErrorCode } from "./protocol.js";

/** A message waiting for its `sent`. */
export interface OutboxEntry {
  cmid: string;
  conv: string;
  body: unknown;
  /** When the app sent it (ms since the epoch). */
  createdAt: number;
}

/** Where the outbox keeps its entries. Every method may be asynchronous. */
export interface OutboxStorage {
  /** Every entry stored, in any order (the outbox sorts by `createdAt`). */
  load(): Promise<OutboxEntry[]>;
  put(entry: OutboxEntry): Promise<void>;
  delete(cmid: string): Promise<void>;
}

export class MemoryOutboxStorage implements OutboxStorage {
  private readonly entries = new Map<string, OutboxEntry>();
  async load(): Promise<OutboxEntry[]> {
    return [...this.entries.values()];
  }
  async put(e: OutboxEntry): Promise<void> {
    this.entries.set(e.cmid, e);
  }
  async delete(cmid: string): Promise<void> {
    this.entries.delete(cmid);
  }
}

/** What `send()` resolves to: the committed message. */
export interface SendResult {
  id: MessageId;
  seq: number;
  ts: number;
  /** The cmid had been committed before (a resend): these are the first commit's fields. */
  dup: boolean;
}

/** A send the server refused for good (`bad_request`, `forbidden`, `conflict`, ...). */
export class SendRefused extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly cmid: string,
  ) {
    super(`${code}: ${message}`);
    this.name = "SendRefused";
  }
}

interface Slot {
  entry: OutboxEntry;
  /** Not before this time (ms). */
  dueAt: number;
  /** Sent in the current session at this time, no answer yet. */
  sentAt: number | null;
  backoff: Backoff;
  waiters: Array<{ resolve: (r: SendResult) => void; reject: (e: Error) => void }>;
}

/** Answers the outbox retries: the others are final. */
const RETRIED: ReadonlySet<string> = new Set(["unavailable", "rate_limited", "internal"]);

export class Outbox {
  private readonly slots = new Map<string, Slot>();

  constructor(
    private readonly storage: OutboxStorage = new MemoryOutboxStorage(),
    /** A send without an answer this long is sent again (same cmid). */
    private readonly answerTimeoutMs = 10_000,
  ) {}

  /** Loads what an earlier page or process left unsent; it is sent like new. */
  async restore(now: number): Promise<OutboxEntry[]> {
    const stored = await this.storage.load();
    stored.sort((a, b) => a.createdAt - b.createdAt);
    for (const entry of stored) if (!this.slots.has(entry.cmid)) this.slots.set(entry.cmid, this.slot(entry, now));
    return stored;
  }

  private slot(entry: OutboxEntry, now: number): Slot {
    return { entry, dueAt: now, sentAt: null, backoff: new Backoff({ baseMs: 500, maxMs: 30_000 }), waiters: [] };
  }

  /** Keeps a new message (stored before this resolves) and returns its entry. */
  async add(entry: OutboxEntry, now: number): Promise<OutboxEntry> {
    await this.storage.put(entry);
    this.slots.set(entry.cmid, this.slot(entry, now));
    return entry;
  }

  /** A promise of `cmid`'s commit. */
  wait(cmid: string): Promise<SendResult> {
    const s = this.slots.get(cmid);
    if (!s) return Promise.reject(new Error(`no message ${cmid} in the outbox`));
    return new Promise((resolve, reject) => s.waiters.push({ resolve, reject }));
  }

  /** Entries to send now, oldest first (so one conversation's sends keep their order). */
  due(now: number): OutboxEntry[] {
    const out: OutboxEntry[] = [];
    for (const s of this.slots.values()) {
      const unanswered = s.sentAt !== null && now - s.sentAt >= this.answerTimeoutMs;
      if ((s.sentAt === null && now >= s.dueAt) || unanswered) {
        s.sentAt = now;
        out.push(s.entry);
      }
    }
    return out.sort((a, b) => a.createdAt - b.createdAt);
  }

  /** The earliest time something falls due (ms), or null. */
  nextDue(): number | null {
    let next: number | null = null;
    for (const s of this.slots.values()) {
      const at = s.sentAt === null ? s.dueAt : s.sentAt + this.answerTimeoutMs;
      next = next === null ? at : Math.min(next, at);
    }
    return next;
  }

  /** A session ended: whatever was sent in it gets no answer there, so is due again. */
  sessionEnded(): void {
    for (const s of this.slots.values()) s.sentAt = null;
  }

  /** `sent`: the message is committed. */
  async committed(cmid: string, r: SendResult): Promise<boolean> {
    const s = this.slots.get(cmid);
    if (!s) return false;
    this.slots.delete(cmid);
    await this.storage.delete(cmid);
    for (const w of s.waiters) w.resolve(r);
    return true;
  }

  /** `error` with the send's cmid: retried (after the hint or a backoff) or final. */
  async refused(cmid: string, code: ErrorCode, message: string, now: number, retryAfterMs?: number): Promise<void> {
    const s = this.slots.get(cmid);
    if (!s) return;
    if (RETRIED.has(code)) {
      s.sentAt = null;
      s.dueAt = now + (code === "rate_limited" && retryAfterMs !== undefined ? retryAfterMs : s.backoff.next());
      return;
    }
    this.slots.delete(cmid);
    await this.storage.delete(cmid);
    const e = new SendRefused(code, message, cmid);
    for (const w of s.waiters) w.reject(e);
  }

  get size(): number {
    return this.slots.size;
  }

  has(cmid: string): boolean {
    return this.slots.has(cmid);
  }

  /** The message kept under `cmid`, if it is still waiting. */
  entry(cmid: string): OutboxEntry | undefined {
    return this.slots.get(cmid)?.entry;
  }
}

/** A fresh client message id: random, 32 hex digits. */
export function newCmid(): string {
  const c = globalThis.crypto;
  if (c?.randomUUID) return c.randomUUID().replace(/-/g, "");
  let s = "";
  for (let i = 0; i < 32; i++) s += Math.floor(Math.random() * 16).toString(16);
  return s;
}
