// What a chat screen shows of each conversation (docs/client.md section 9): messages
// with their current text (an edit replaces it and marks it edited, a recall blanks
// it) and a line for each membership, title or role change. Give it every message in
// seq order (the client's `message` event, history pages); it keeps the lines.

import type { MessageId } from "./ids.js";
import type { TimelineEvent, WireMessage } from "./protocol.js";

/** One line of a conversation's screen. */
export interface ScreenLine {
  id: MessageId;
  seq: number;
  from: string;
  /** A message's body; `undefined` once recalled, and on a change's line. */
  body?: unknown;
  /** The seq of the edit the body comes from. */
  editedSeq?: number;
  recalled: boolean;
  /** A membership, title or role change: what happened. */
  event?: TimelineEvent;
  /** The cmid of the message (lets an app match its own pending sends). */
  cmid: string;
}

/** The text of a body as people read it: its `text` field, else its JSON. */
export function bodyText(body: unknown): string {
  if (typeof body === "object" && body !== null && typeof (body as { text?: unknown }).text === "string") {
    return (body as { text: string }).text;
  }
  return JSON.stringify(body);
}

/** A line as people read it: `alice added bob`, `message recalled`, `hi (edited)`. */
export function lineText(l: ScreenLine): string {
  const e = l.event;
  if (e) {
    switch (e.type) {
      case "member_added":
        return `${l.from} added ${e.users.join(", ")}`;
      case "member_removed":
        return `${l.from} removed ${e.users.join(", ")}`;
      case "member_left":
        return `${l.from} left`;
      case "title_changed":
        return e.title === null ? `${l.from} removed the title` : `${l.from} renamed the conversation "${e.title}"`;
      case "role_changed":
        return `${l.from} made ${e.user} ${e.role}`;
      default:
        return `${l.from} changed the conversation`;
    }
  }
  if (l.recalled) return "message recalled";
  const text = bodyText(l.body);
  return l.editedSeq !== undefined ? `${text} (edited)` : text;
}

export class Screens {
  private readonly byConv = new Map<string, ScreenLine[]>();

  /** The lines of `conv`, in seq order. */
  lines(conv: string): readonly ScreenLine[] {
    return this.byConv.get(conv) ?? [];
  }

  /**
   * Shows `m`, the next message of its conversation in seq order (repeats of a line
   * already shown change nothing). Returns the line it added or changed, if any.
   */
  show(m: WireMessage): ScreenLine | undefined {
    let lines = this.byConv.get(m.conv);
    if (!lines) this.byConv.set(m.conv, (lines = []));
    if (lines.some((l) => l.id === m.id)) return undefined;
    const e = m.event ?? undefined;
    if (e?.type === "edited" || e?.type === "recalled") {
      const target = lines.find((l) => l.id === e.target && !l.event);
      if (!target) return undefined; // before this screen's start
      if (e.type === "recalled") {
        target.recalled = true;
        target.body = undefined;
      } else if (!target.recalled && (target.editedSeq ?? 0) < m.seq) {
        // A history page may have shown a later edit already.
        target.body = m.body;
        target.editedSeq = m.seq;
      }
      return target;
    }
    const recalled = m.recalled_seq !== undefined && m.recalled_seq !== null;
    const line: ScreenLine = { id: m.id, seq: m.seq, from: m.from, cmid: m.cmid, recalled, event: e };
    if (!e && !recalled) line.body = m.body;
    if (!e && m.edited_seq !== undefined && m.edited_seq !== null) line.editedSeq = m.edited_seq;
    lines.push(line);
    if (lines.length > 1 && lines[lines.length - 2].seq > m.seq) lines.sort((a, b) => a.seq - b.seq);
    return line;
  }
}
