// Each conversation's timeline in `seq` order (docs/protocol.md section 4.2): what
// arrives above a gap is held until the gap fills, by push or by `sync`. Backlog and
// realtime interleave, so holding is the normal case, not an error.

import type { WireMessage } from "./protocol.js";

interface Line {
  /** Highest seq shown: everything up to it is on screen. */
  shown: number;
  /** Arrived above a gap, by seq. */
  waiting: Map<number, WireMessage>;
  /** When the current gap was first seen open (ms). */
  gapSince: number | null;
  /** A `sync` for this gap is out. */
  syncing: boolean;
}

/** A gap to fill: sync `conv` after `afterSeq`. */
export interface Gap {
  conv: string;
  afterSeq: number;
}

export class Timelines {
  private readonly lines = new Map<string, Line>();

  /** `show` is called for each message once, in seq order per conversation. */
  constructor(private readonly show: (m: WireMessage) => void) {}

  private line(conv: string): Line {
    let l = this.lines.get(conv);
    if (!l) {
      l = { shown: 0, waiting: new Map(), gapSince: null, syncing: false };
      this.lines.set(conv, l);
    }
    return l;
  }

  /** The highest seq shown in `conv` (0: nothing yet). */
  shown(conv: string): number {
    return this.lines.get(conv)?.shown ?? 0;
  }

  /** Seqs held above a gap in `conv`. */
  held(conv: string): number[] {
    return [...(this.lines.get(conv)?.waiting.keys() ?? [])].sort((a, b) => a - b);
  }

  /**
   * Starts `conv` after `seq` when the app knows better than 0: its store, or the
   * conversation list's `start_seq` (`joined_seq` from older servers). Never moves a timeline back.
   */
  startAfter(conv: string, seq: number): void {
    const l = this.line(conv);
    if (seq <= l.shown) return;
    l.shown = seq;
    for (const s of [...l.waiting.keys()]) if (s <= seq) l.waiting.delete(s);
    this.flush(l);
  }

  /** A message arrived (push or sync). False when it was at or below what is shown. */
  arrive(m: WireMessage): boolean {
    const l = this.line(m.conv);
    if (m.seq <= l.shown || l.waiting.has(m.seq)) return false;
    l.waiting.set(m.seq, m);
    this.flush(l);
    return true;
  }

  private flush(l: Line): void {
    for (let next = l.waiting.get(l.shown + 1); next; next = l.waiting.get(l.shown + 1)) {
      l.waiting.delete(l.shown + 1);
      l.shown += 1;
      this.show(next);
    }
    if (l.waiting.size === 0) l.gapSince = null;
  }

  /**
   * The gaps to fill now: those seen open for `afterMs` (first seen on an earlier call),
   * with no sync out. Each returned gap is marked syncing until [`Timelines.synced`].
   */
  due(now: number, afterMs: number): Gap[] {
    const out: Gap[] = [];
    for (const [conv, l] of this.lines) {
      if (l.waiting.size === 0 || l.syncing) continue;
      if (l.gapSince === null) {
        l.gapSince = now;
        continue;
      }
      if (now - l.gapSince >= afterMs) {
        l.syncing = true;
        out.push({ conv, afterSeq: l.shown });
      }
    }
    return out;
  }

  /**
   * A sync of `conv` was answered (or lost with its session). `more`: the page was not
   * the last, so the gap is due again at once.
   */
  synced(conv: string, more: boolean, now: number, afterMs: number): void {
    const l = this.line(conv);
    l.syncing = false;
    l.gapSince = more && l.waiting.size > 0 ? now - afterMs : l.waiting.size > 0 ? now : null;
  }

  /** A session ended: syncs in flight are gone with it. */
  sessionEnded(): void {
    for (const l of this.lines.values()) {
      l.syncing = false;
      l.gapSince = null;
    }
  }
}
