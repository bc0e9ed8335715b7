// Timeline events with @herald/client against a real local Herald (one worker, two
// gateways): membership, title and role changes, recalls and edits reach every device
// in their place (the actor's own too), a screen built from the client's messages
// shows them as docs/client.md section 9 asks, and history reads back the same.

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { ApiError, HeraldApi, HeraldClient, Screens, lineText, type Message } from "../../src/index.js";
import { Herald, eventually, sleep, token } from "./herald.js";

let herald: Herald;

beforeAll(async () => {
  herald = await Herald.start(2);
});
afterAll(async () => {
  await herald?.stop();
});

/** A device whose screen is built from the client's `message` events. */
function device(user: string, dev: string, urls: string[]) {
  const client = new HeraldClient({ url: urls, token: () => token(user, dev), WebSocket: WebSocket as any, backoff: { baseMs: 100, maxMs: 1_000 } });
  const screen = new Screens();
  const shown: Message[] = [];
  client.on("message", (m) => {
    shown.push(m);
    screen.show(m);
  });
  client.connect();
  return { client, screen, shown };
}

const api = (user: string, dev = "web") => new HeraldApi({ url: herald.gateways[0].base, token: () => token(user, dev) });

describe("timeline events against a real Herald", () => {
  it("edits, recalls and membership changes reach every device in their place", async () => {
    const gws = herald.gateways.map((g) => g.base);
    const conv = "room-events";
    const alice = api("alice");
    const created = await alice.createConversation({ id: conv, kind: "group", members: ["alice", "bob"] });
    expect(created.roles).toEqual({ alice: "owner", bob: "member" });
    const a = device("alice", "web", [gws[0]]);
    const b = device("bob", "web", [gws[1]]);
    await eventually(10_000, "both connected", () => a.client.state === "connected" && b.client.state === "connected");

    const first = await a.client.send(conv, { text: "helo" });
    const second = await a.client.send(conv, { text: "wrong room" });
    const edit = await alice.edit(first.id, { text: "hello" });
    expect(edit.seq).toBe(3);
    await alice.recall(second.id);
    await alice.changeMembers(conv, { add: ["carol"] });
    await alice.changeTitle(conv, "Team");
    const roles = await alice.changeRole(conv, "bob", "admin");
    expect(roles.roles.bob).toBe("admin");

    await eventually(15_000, "bob shows all seven", () => b.client.shown(conv) === 7);
    expect(b.screen.lines(conv).map(lineText)).toEqual([
      "hello (edited)",
      "message recalled",
      "alice added carol",
      'alice renamed the conversation "Team"',
      "alice made bob admin",
    ]);
    // The actor's own device: its sends from their `sent`, its changes pushed to it.
    await eventually(15_000, "alice shows all seven", () => a.client.shown(conv) === 7);
    expect(a.screen.lines(conv).map(lineText)).toEqual(b.screen.lines(conv).map(lineText));
    await sleep(300);
    const seqs = b.shown.filter((m) => m.conv === conv).map((m) => m.seq);
    expect(seqs).toEqual([1, 2, 3, 4, 5, 6, 7]);

    // History gives the same screen, messages as they are now.
    const page = await api("bob").history(conv);
    const fromHistory = new Screens();
    for (const m of page.items) fromHistory.show(m);
    expect(fromHistory.lines(conv).map(lineText)).toEqual(b.screen.lines(conv).map(lineText));
    expect(page.items[0]).toMatchObject({ body: { text: "hello" }, edited_seq: 3 });
    expect(page.items[1]).toMatchObject({ body: null, recalled_seq: 4 });
    for (const d of [a, b]) d.client.close();
  });

  it("refusals carry the protocol's codes", async () => {
    const conv = "room-rules";
    await api("alice").createConversation({ id: conv, kind: "group", members: ["alice", "bob", "carol"] });
    const sent = await api("alice").send("m1", conv, { text: "mine" });
    const refused = (p: Promise<unknown>) => p.then(() => "ok", (e: ApiError) => `${e.status} ${e.code}`);
    expect(await refused(api("bob").edit(sent.id, { text: "theirs" }))).toBe("403 forbidden");
    expect(await refused(api("bob").recall(sent.id))).toBe("403 forbidden");
    expect(await refused(api("carol").changeTitle(conv, "x"))).toBe("403 forbidden");
    expect(await refused(api("bob").changeMembers(conv, { remove: ["carol"] }))).toBe("403 forbidden");
    expect(await refused(api("alice").recall("123456"))).toBe("404 not_found");
    expect(await refused(api("alice").recall(sent.id))).toBe("ok");
    expect(await refused(api("alice").recall(sent.id))).toBe("409 conflict");
  });
});
