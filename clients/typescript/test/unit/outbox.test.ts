import "fake-indexeddb/auto";
import { describe, expect, it } from "vitest";
import { IndexedDbOutboxStorage } from "../../src/indexeddb.js";
import { MemoryOutboxStorage, Outbox, SendRefused, newCmid, type OutboxEntry } from "../../src/outbox.js";

const entry = (cmid: string, createdAt = 0): OutboxEntry => ({ cmid, conv: "c", body: { text: cmid }, createdAt });
const result = { id: "7405329411723264001", seq: 3, ts: 9, dup: false };

describe("the outbox", () => {
  it("keeps a message until sent, and resolves its promise with the commit", async () => {
    const storage = new MemoryOutboxStorage();
    const o = new Outbox(storage, 1000);
    await o.add(entry("m1"), 0);
    const done = o.wait("m1");
    expect(o.due(0).map((e) => e.cmid)).toEqual(["m1"]);
    expect(o.due(10), "sent, waiting for its answer").toEqual([]);
    expect(await storage.load()).toHaveLength(1);
    await o.committed("m1", result);
    await expect(done).resolves.toEqual(result);
    expect(await storage.load()).toEqual([]);
    expect(o.size).toBe(0);
  });

  it("resends with the same cmid: unanswered, after a lost session, after unavailable", async () => {
    const o = new Outbox(new MemoryOutboxStorage(), 1000);
    await o.add(entry("m1"), 0);
    expect(o.due(0)).toHaveLength(1);
    expect(o.due(999)).toHaveLength(0);
    expect(o.due(1000).map((e) => e.cmid), "no answer in time").toEqual(["m1"]);
    o.sessionEnded();
    expect(o.due(1001).map((e) => e.cmid), "the session was lost").toEqual(["m1"]);
    await o.refused("m1", "unavailable", "x", 2000);
    const next = o.nextDue()!;
    expect(next).toBeGreaterThanOrEqual(2000);
    expect(next).toBeLessThan(2500);
    expect(o.due(next).map((e) => e.cmid)).toEqual(["m1"]);
  });

  it("honours rate_limited's hint", async () => {
    const o = new Outbox(new MemoryOutboxStorage(), 1000);
    await o.add(entry("m1"), 0);
    o.due(0);
    await o.refused("m1", "rate_limited", "slow down", 100, 4000);
    expect(o.due(4099)).toEqual([]);
    expect(o.due(4100)).toHaveLength(1);
  });

  it("gives up on final refusals and says why", async () => {
    const o = new Outbox(new MemoryOutboxStorage(), 1000);
    await o.add(entry("m1"), 0);
    const done = o.wait("m1");
    await o.refused("m1", "forbidden", "not a member", 0);
    await expect(done).rejects.toBeInstanceOf(SendRefused);
    await expect(done).rejects.toMatchObject({ code: "forbidden", cmid: "m1" });
    expect(o.size).toBe(0);
  });

  it("sends oldest first, and restores what an earlier instance left", async () => {
    const storage = new MemoryOutboxStorage();
    const first = new Outbox(storage);
    await first.add(entry("b", 2), 0);
    await first.add(entry("a", 1), 0);
    const second = new Outbox(storage);
    await second.restore(0);
    expect(second.due(0).map((e) => e.cmid)).toEqual(["a", "b"]);
  });

  it("survives in IndexedDB", async () => {
    const name = `outbox-${newCmid()}`;
    const one = new IndexedDbOutboxStorage(name);
    const o = new Outbox(one);
    await o.add(entry("m1", 1), 0);
    await o.add(entry("m2", 2), 0);
    await o.committed("m1", result);
    await one.close();
    const two = new IndexedDbOutboxStorage(name);
    const again = new Outbox(two);
    expect((await again.restore(0)).map((e) => e.cmid)).toEqual(["m2"]);
    expect((await two.load())[0]).toEqual(entry("m2", 2));
  });

  it("makes cmids that do not repeat", () => {
    const ids = new Set(Array.from({ length: 1000 }, newCmid));
    expect(ids.size).toBe(1000);
    expect([...ids][0]).toMatch(/^[0-9a-f]{32}$/);
  });
});
