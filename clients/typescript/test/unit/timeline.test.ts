import { describe, expect, it } from "vitest";
import type { WireMessage } from "../../src/protocol.js";
import { Timelines } from "../../src/timeline.js";

const msg = (conv: string, seq: number): WireMessage => ({ id: String(1000 + seq), conv, seq, from: "a", cmid: `m${seq}`, ts: 0, body: seq });

function setup() {
  const shown: string[] = [];
  const t = new Timelines((m) => shown.push(`${m.conv}:${m.seq}`));
  return { t, shown };
}

describe("the ordering buffer", () => {
  it("shows each conversation in seq order, holding what arrives above a gap", () => {
    const { t, shown } = setup();
    for (const s of [2, 3, 1, 5]) t.arrive(msg("a", s));
    t.arrive(msg("b", 1));
    expect(shown).toEqual(["a:1", "a:2", "a:3", "b:1"]);
    expect(t.held("a")).toEqual([5]);
    t.arrive(msg("a", 4));
    expect(shown.slice(4)).toEqual(["a:4", "a:5"]);
    expect(t.shown("a")).toBe(5);
  });

  it("drops what is at or below the shown seq, and repeats held above a gap", () => {
    const { t, shown } = setup();
    t.arrive(msg("a", 1));
    expect(t.arrive(msg("a", 1))).toBe(false);
    expect(t.arrive(msg("a", 3))).toBe(true);
    expect(t.arrive(msg("a", 3))).toBe(false);
    expect(shown).toEqual(["a:1"]);
  });

  it("starts after a known position, and never goes back", () => {
    const { t, shown } = setup();
    t.arrive(msg("a", 8));
    t.startAfter("a", 7);
    expect(shown).toEqual(["a:8"]);
    t.startAfter("a", 3);
    expect(t.shown("a")).toBe(8);
    t.arrive(msg("a", 5));
    expect(shown).toEqual(["a:8"]);
  });

  it("reports a gap once it stayed open, then not while its sync is out", () => {
    const { t } = setup();
    t.arrive(msg("a", 1));
    t.arrive(msg("a", 4));
    expect(t.due(0, 1000)).toEqual([]); // first seen open
    expect(t.due(999, 1000)).toEqual([]);
    expect(t.due(1000, 1000)).toEqual([{ conv: "a", afterSeq: 1 }]);
    expect(t.due(5000, 1000), "a sync is out").toEqual([]);
    // The answer held 2 and 3 and said more: due again at once.
    t.arrive(msg("a", 2));
    t.synced("a", true, 6000, 1000);
    expect(t.due(6000, 1000)).toEqual([{ conv: "a", afterSeq: 2 }]);
    t.arrive(msg("a", 3));
    t.synced("a", false, 6100, 1000);
    expect(t.held("a")).toEqual([]);
    expect(t.due(99_999, 1000)).toEqual([]);
  });

  it("forgets syncs in flight when the session ends", () => {
    const { t } = setup();
    t.arrive(msg("a", 2));
    t.due(0, 10);
    expect(t.due(10, 10)).toHaveLength(1);
    t.sessionEnded();
    expect(t.due(20, 10)).toEqual([]);
    expect(t.due(30, 10)).toEqual([{ conv: "a", afterSeq: 0 }]);
  });
});

describe("unread counts", () => {
  it("start from the list, grow with messages, shrink with the user's reads, never below 0", async () => {
    const { UnreadCounts } = await import("../../src/unread.js");
    const changes: string[] = [];
    const u = new UnreadCounts((conv, n) => changes.push(`${conv}=${n}`));
    u.seed([{ id: "a", last_seq: 10, read_seq: 7 }]);
    expect(u.count("a")).toBe(3);
    u.message("a", 11);
    u.message("a", 9); // an older one shown late changes nothing
    u.message("b", 1);
    u.readUpTo("a", 11);
    u.readUpTo("a", 5);
    expect(changes).toEqual(["a=3", "a=4", "b=1", "a=0"]);
    u.readUpTo("b", 40);
    expect(u.count("b")).toBe(0);
  });
});
