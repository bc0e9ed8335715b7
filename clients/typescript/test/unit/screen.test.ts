import { describe, expect, it } from "vitest";
import { parseServerFrame, type TimelineEvent, type WireMessage } from "../../src/protocol.js";
import { lineText, Screens } from "../../src/screen.js";

const msg = (seq: number, body: unknown, event?: TimelineEvent, extra: Partial<WireMessage> = {}): WireMessage => ({
  id: String(1000 + seq),
  conv: "g",
  seq,
  from: "alice",
  cmid: `m${seq}`,
  ts: 0,
  body,
  event,
  ...extra,
});

const texts = (s: Screens) => s.lines("g").map(lineText);

describe("timeline events on the screen", () => {
  it("an edit replaces the text and marks it, a recall blanks it, changes get a line", () => {
    const s = new Screens();
    s.show(msg(1, { text: "helo" }));
    s.show(msg(2, { text: "wrong room" }));
    s.show(msg(3, null, { type: "member_added", users: ["bob", "carol"] }));
    s.show(msg(4, { text: "hello" }, { type: "edited", target: "1001", target_seq: 1 }));
    s.show(msg(5, null, { type: "recalled", target: "1002", target_seq: 2 }));
    s.show(msg(6, null, { type: "title_changed", title: "Team" }));
    s.show(msg(7, null, { type: "role_changed", user: "bob", role: "admin" }));
    s.show(msg(8, null, { type: "member_removed", users: ["carol"] }));
    s.show(msg(9, null, { type: "member_left" }));
    expect(texts(s)).toEqual([
      "hello (edited)",
      "message recalled",
      "alice added bob, carol",
      'alice renamed the conversation "Team"',
      "alice made bob admin",
      "alice removed carol",
      "alice left",
    ]);
  });

  it("a history page that shows a later edit is not undone by an earlier edit, nor twice", () => {
    const s = new Screens();
    s.show(msg(1, { text: "third" }, undefined, { edited_seq: 9 }));
    s.show(msg(4, { text: "second" }, { type: "edited", target: "1001", target_seq: 1 }));
    s.show(msg(1, { text: "again" }));
    s.show(msg(2, null, undefined, { recalled_seq: 3 }));
    expect(texts(s)).toEqual(["third (edited)", "message recalled"]);
    // An edit of a message before the screen's start, or of a recalled one, changes nothing.
    s.show(msg(10, { text: "x" }, { type: "edited", target: "999", target_seq: 0 }));
    s.show(msg(11, { text: "x" }, { type: "edited", target: "1002", target_seq: 2 }));
    expect(texts(s)).toEqual(["third (edited)", "message recalled"]);
  });

  it("an event of a newer server gets a generic line and still counts", () => {
    const f = parseServerFrame('{"t":"msg","id":"5","conv":"g","seq":5,"from":"bob","cmid":"c","ts":1,"body":null,"event":{"type":"pinned","target":"4"}}');
    expect(f?.t).toBe("msg");
    const s = new Screens();
    s.show(f as WireMessage);
    expect(texts(s)).toEqual(["bob changed the conversation"]);
  });

  it("msg frames with events parse, malformed ones are refused", () => {
    const base = '"t":"msg","id":"7","conv":"g","seq":3,"from":"a","cmid":"c","ts":1,"body":null';
    expect(parseServerFrame(`{${base},"event":{"type":"recalled","target":"2","target_seq":2}}`)).toMatchObject({ event: { type: "recalled" } });
    expect(parseServerFrame(`{${base},"edited_seq":4}`)).toMatchObject({ edited_seq: 4 });
    expect(parseServerFrame(`{${base},"event":{"type":"recalled","target":2,"target_seq":2}}`)).toBeNull();
    expect(parseServerFrame(`{${base},"event":{"type":"member_added","users":"bob"}}`)).toBeNull();
    expect(parseServerFrame(`{${base},"event":"member_left"}`)).toBeNull();
    expect(parseServerFrame(`{${base},"recalled_seq":"4"}`)).toBeNull();
  });
});
