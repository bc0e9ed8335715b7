// The demo chat page: sign in as a user and device, a conversation list with unread
// counts, each timeline in seq order, sends shown pending until sent, delivered ticks
// and read receipts on the user's own messages, timeline events (edited text with its
// mark, recalled messages, a line per membership, title or role change; the user edits
// and recalls its own messages and adds members), "X is typing…" under the timeline,
// the people seen with an online dot (presence), and a status line with the
// connection's state and reconnects. Everything Herald-specific goes through
// @herald/client (imported from the package source).

import { HeraldApi, HeraldClient, IndexedDbOutboxStorage, bodyText, lineText, type Message, type WebSocketFactory, type WireMessage } from "../src/index.js";

declare const __HERALD_GATEWAYS__: string[];

/** A timeline entry: shown (it has its seq) or still pending (only a cmid). */
interface Item {
  cmid: string;
  id?: string;
  seq?: number;
  from: string;
  text: string;
  state: "pending" | "sent" | "shown" | "failed";
  /** Own messages from a history page: how many recipients had it then, of how many. */
  delivered?: number;
  of?: number;
  /** A membership, title or role change's line (not a message). */
  change?: boolean;
  edited?: boolean;
  recalled?: boolean;
}

interface Conv {
  id: string;
  title: string;
  shown: Item[];
  pending: Item[];
  /** Other members' read positions. */
  reads: Map<string, number>;
  /** Edits and recalls already applied, by id (history pages may repeat them). */
  applied: Set<string>;
  /** Listed (title known, latest page loaded). */
  listed: boolean;
  /** Its member count, when known (a direct conversation has 2). */
  members?: number;
}

const $ = <T extends HTMLElement>(sel: string) => document.querySelector(sel) as T;
const params = new URLSearchParams(location.search);
/** `?gw=` overrides the gateways (the browser tests pick each page's first gateway). */
const gateways = params.get("gw")?.split(",") ?? __HERALD_GATEWAYS__;
const convs = new Map<string, Conv>();
let me = "";
let current: string | null = null;
let client: HeraldClient;
let gatewayNow = "";
let reconnects = 0;
let everConnected = false;
let token: () => Promise<string>;
/** The other users seen (senders, readers, members added): their presence is followed. */
const people = new Set<string>();

/** Follows a user's presence from the first time it is seen. */
function know(user: string): void {
  if (!user || user === me || user.startsWith("service:") || people.has(user)) return;
  people.add(user);
  client.followPresence([...people]);
  renderPeople();
}

function renderPeople(): void {
  const ul = $("#people");
  ul.replaceChildren(
    ...[...people].sort().map((user) => {
      const p = client.presenceOf(user);
      const li = document.createElement("li");
      li.dataset.user = user;
      li.dataset.online = p?.online ? "1" : "0";
      const seen = p && !p.online && p.lastSeen ? ` · last seen ${new Date(p.lastSeen).toLocaleTimeString()}` : "";
      li.innerHTML = `<span class="dot"></span><span class="name"></span>`;
      li.querySelector(".name")!.textContent = `${user}${seen}`;
      return li;
    }),
  );
}

/** "bob is typing…" under the open conversation's timeline. */
function renderTyping(): void {
  const users = current ? client.whoIsTyping(current) : [];
  const el = $("#typing");
  el.dataset.typing = users.join(",");
  el.textContent = users.length === 0 ? "" : `${users.join(", ")} ${users.length > 1 ? "are" : "is"} typing…`;
}

async function fetchToken(user: string, device: string): Promise<string> {
  const r = await fetch(`/demo/token?user=${encodeURIComponent(user)}&device=${encodeURIComponent(device)}`);
  if (!r.ok) throw new Error(await r.text());
  return r.text();
}

/** The HTTP API on the first gateway that answers. */
async function api<T>(call: (a: HeraldApi) => Promise<T>, token: () => Promise<string>): Promise<T> {
  let err: unknown;
  for (const url of gateways) {
    try {
      return await call(new HeraldApi({ url, token }));
    } catch (e) {
      err = e;
      if ((e as { status?: number }).status) throw e; // the gateway answered: a refusal
    }
  }
  throw err;
}


function conv(id: string, title?: string | null): Conv {
  let c = convs.get(id);
  if (!c) {
    c = { id, title: title || id, shown: [], pending: [], reads: new Map(), applied: new Set(), listed: false };
    convs.set(id, c);
  }
  return c;
}

function status(state: string): void {
  const el = $("#status");
  el.dataset.state = state;
  el.dataset.reconnects = String(reconnects);
  el.dataset.gateway = gatewayNow;
  const where = state === "connected" ? ` via ${gatewayNow.replace(/^\w+:\/\//, "").replace(/\/v1\/ws.*/, "")}` : "";
  el.textContent = `${state}${where} · reconnects ${reconnects} · unsent ${client?.unsent ?? 0}`;
}

function renderConvs(): void {
  const ul = $("#convs");
  ul.replaceChildren(
    ...[...convs.values()].map((c) => {
      const li = document.createElement("li");
      li.dataset.conv = c.id;
      li.className = c.id === current ? "active" : "";
      const n = client.unread(c.id);
      li.innerHTML = `<span class="name"></span><span class="badge" data-unread="${n}">${n}</span>`;
      li.querySelector(".name")!.textContent = c.title;
      li.onclick = () => open(c.id);
      return li;
    }),
  );
}

function renderTimeline(): void {
  const ol = $("#timeline");
  if (!current) return ol.replaceChildren();
  const c = conv(current);
  const seen = Math.max(0, ...[...c.reads.values()]);
  ol.replaceChildren(...[...c.shown, ...c.pending].map((m) => (m.change ? changeLine(m) : messageLine(c, m, seen))));
  ol.scrollTop = ol.scrollHeight;
}

/** A membership, title or role change: a line of its own between the messages. */
function changeLine(m: Item): HTMLLIElement {
  const li = document.createElement("li");
  li.className = "event";
  li.dataset.seq = String(m.seq);
  li.textContent = m.text;
  return li;
}

function messageLine(c: Conv, m: Item, seen: number): HTMLLIElement {
  const li = document.createElement("li");
  li.className = `msg ${m.from === me ? "own" : ""} ${m.state === "shown" || m.state === "sent" ? "" : "pending"} ${m.recalled ? "recalled" : ""}`;
  if (m.seq !== undefined && m.state === "shown") li.dataset.seq = String(m.seq);
  if (m.edited) li.dataset.edited = "1";
  li.dataset.cmid = m.cmid;
  li.textContent = m.text;
  const meta = document.createElement("span");
  meta.className = "meta";
  let note = m.from === me ? (m.state === "pending" ? "sending…" : m.state === "failed" ? "not sent" : "✓ sent") : m.from;
  const delivered = m.from === me && m.seq !== undefined ? Math.max(m.delivered ?? 0, client.statusOf(c.id, m.seq)?.delivered ?? 0) : 0;
  if (delivered > 0) {
    // Delivered ticks: a device of the recipient has it (in a group, how many have).
    li.dataset.delivered = String(delivered);
    note = m.of === 1 || c.members === 2 ? "✓✓ delivered" : `✓✓ delivered to ${delivered}${m.of ? ` of ${m.of}` : ""}`;
  }
  if (m.from === me && m.seq !== undefined && m.seq <= seen) {
    const who = [...c.reads].filter(([, s]) => s >= m.seq!).map(([u]) => u);
    note = `✓✓ read by ${who.join(", ")}`;
  }
  meta.textContent = `#${m.seq ?? "–"} · ${note}${m.edited ? " · edited" : ""}`;
  li.append(meta);
  if (m.from === me && m.id && !m.recalled) li.append(action("edit", () => editMessage(m)), action("recall", () => recallMessage(m)));
  return li;
}

function action(name: string, run: () => Promise<unknown>): HTMLButtonElement {
  const b = document.createElement("button");
  b.className = `action ${name}`;
  b.textContent = name;
  b.onclick = () => run().catch((err) => alert(String(err.message ?? err)));
  return b;
}

/** Edits one of the user's messages (within the server's edit window): the edit's event shows it. */
async function editMessage(m: Item): Promise<void> {
  const t = prompt("Edit message", m.text);
  if (t !== null && t !== m.text) await api((a) => a.edit(m.id!, { text: t }), token);
}

async function recallMessage(m: Item): Promise<void> {
  await api((a) => a.recall(m.id!), token);
}

/** Marks what is on screen as read, when the page is visible. */
function markRead(): void {
  if (!current || document.visibilityState !== "visible") return;
  const c = conv(current);
  const last = c.shown[c.shown.length - 1]?.seq;
  if (last !== undefined && client.unread(current) > 0) client.read(current, last);
}

function open(id: string): void {
  current = id;
  $("#title").textContent = conv(id).title;
  document.querySelectorAll<HTMLInputElement | HTMLButtonElement>("#composer input, #composer button, #members input, #members button").forEach((el) => (el.disabled = false));
  renderConvs();
  renderTimeline();
  renderTyping();
  markRead();
}

function shown(m: WireMessage | Message): void {
  const c = conv(m.conv);
  if (c.shown.some((i) => i.id === m.id) || c.applied.has(m.id)) return; // the client drops repeats; history may overlap
  const e = m.event ?? undefined;
  know(m.from);
  if (e?.type === "member_added") e.users.forEach(know);
  if (e?.type === "edited" || e?.type === "recalled") {
    // Applied to the message it is about (when it is on this page), in seq order.
    c.applied.add(m.id);
    const target = c.shown.find((i) => i.id === e.target && !i.change);
    if (target && e.type === "recalled") Object.assign(target, { recalled: true, edited: false, text: "message recalled" });
    else if (target && !target.recalled) Object.assign(target, { edited: true, text: bodyText(m.body) });
  } else if (e) {
    c.shown.push({ cmid: m.cmid, id: m.id, seq: m.seq, from: m.from, text: lineText({ ...m, event: e, recalled: false }), state: "shown", change: true });
    if (e.type === "title_changed") c.title = e.title || c.id;
  } else {
    const pending = c.pending.findIndex((i) => i.cmid === m.cmid);
    if (pending >= 0) c.pending.splice(pending, 1);
    const st = "status" in m ? m.status : undefined;
    const recalled = m.recalled_seq !== undefined && m.recalled_seq !== null;
    const edited = m.edited_seq !== undefined && m.edited_seq !== null;
    const text = recalled ? "message recalled" : bodyText(m.body);
    c.shown.push({ cmid: m.cmid, id: m.id, seq: m.seq, from: m.from, text, state: "shown", delivered: st?.delivered, of: st?.of, recalled, edited });
  }
  if (m.conv === current) {
    $("#title").textContent = c.title;
    renderTimeline();
    markRead();
  }
}

async function signIn(user: string, device: string): Promise<void> {
  me = user;
  token = () => fetchToken(user, device);
  await token(); // fails early when the endpoint is off
  $("#signin").hidden = true;
  $("#chat").hidden = false;
  $("#me").textContent = `${user} on ${device}`;
  document.title = `${user} · Herald`;

  // Records which gateway each connection goes to, for the status line.
  class Socket extends WebSocket {
    constructor(url: string | URL, protocols?: string | string[]) {
      super(url, protocols);
      gatewayNow = String(url);
    }
  }
  client = new HeraldClient({
    url: gateways,
    token,
    WebSocket: Socket as unknown as WebSocketFactory,
    outboxStorage: new IndexedDbOutboxStorage(`herald-demo-${user}-${device}`),
    backoff: { baseMs: 250, maxMs: 5_000 },
    deliveryStatus: true,
    typingAndPresence: true,
  });
  client.on("typing", ({ conv: id }) => {
    if (id === current) renderTyping();
  });
  client.on("presence", () => renderPeople());
  client.on("state", ({ state }) => {
    if (state === "connected") {
      if (everConnected) reconnects++;
      everConnected = true;
    }
    status(state);
  });
  client.on("message", (m) => {
    if (!convs.get(m.conv)?.listed) void refreshConvs();
    shown(m);
  });
  client.on("unread", () => renderConvs());
  client.on("read", ({ conv: id, user: who, seq }) => {
    if (who === me) return;
    know(who);
    const c = conv(id);
    if (seq > (c.reads.get(who) ?? 0)) c.reads.set(who, seq);
    if (id === current) renderTimeline();
  });
  client.on("sent", () => status(client.state));
  client.on("status", (s) => {
    if (s.conv === current) renderTimeline();
  });

  // The list and the latest page of each timeline, then the live connection: each
  // timeline goes on after what the page shows.
  await refreshConvs();
  client.connect();
  document.addEventListener("visibilitychange", markRead);
}

let listing: Promise<void> | null = null;
let listAgain = false;

/** Lists the conversations (again, when asked while listing). */
function refreshConvs(): Promise<void> {
  if (listing) {
    listAgain = true;
    return listing;
  }
  listing = (async () => {
    do {
      listAgain = false;
      await listConvs();
    } while (listAgain);
  })().finally(() => (listing = null));
  return listing;
}

async function listConvs(): Promise<void> {
  const list = await api((a) => a.conversations({ limit: 50 }), token);
  client.seedUnread(list.items);
  for (const item of list.items.reverse()) {
    const c = conv(item.id);
    c.title = item.title || item.id;
    if (item.kind === "direct") c.members = 2;
    if (c.listed) continue;
    c.listed = true;
    // Shown live already: the client fills the timeline from the start (joined_seq).
    if (c.shown.length > 0) continue;
    const after = Math.max(item.joined_seq, item.last_seq - 50);
    const page = await api((a) => a.history(item.id, { afterSeq: after, limit: 50 }), token);
    // Messages the client showed meanwhile are merged in.
    const live = c.shown;
    c.shown = [];
    for (const m of page.items) shown(m);
    for (const m of live) if (!c.shown.some((i) => i.id === m.id)) c.shown.push(m);
    c.shown.sort((a, b) => a.seq! - b.seq!);
    client.startAfter(item.id, c.shown[c.shown.length - 1]?.seq ?? after);
  }
  renderConvs();
  if (current) renderTimeline();
}

$("#signin").onsubmit = (e) => {
  e.preventDefault();
  const f = new FormData(e.target as HTMLFormElement);
  sessionStorage.setItem("herald-demo-device", String(f.get("device")));
  signIn(String(f.get("user")), String(f.get("device"))).catch((err) => alert(String(err.message ?? err)));
};

$("#newconv").onsubmit = async (e) => {
  e.preventDefault();
  const form = e.target as HTMLFormElement;
  const others = String(new FormData(form).get("members"))
    .split(/[\s,]+/)
    .filter((m) => m && m !== me);
  const created = await api((a) => a.createConversation({ kind: "group", members: [me, ...others], title: [me, ...others].join(", ") }), token);
  form.reset();
  await refreshConvs();
  open(created.id);
};

$("#members").onsubmit = async (e) => {
  e.preventDefault();
  if (!current) return;
  const form = e.target as HTMLFormElement;
  const add = String(new FormData(form).get("add")).split(/[\s,]+/).filter(Boolean);
  form.reset();
  await api((a) => a.changeMembers(current!, { add }), token).catch((err) => alert(String(err.message ?? err)));
};

// Typing: the client sends `started` at most every 3 s per conversation while keys
// come, and `stopped` once the draft is sent or cleared.
$("#composer").oninput = (e) => {
  if (!current) return;
  client.typing(current, (e.target as HTMLInputElement).value ? "started" : "stopped");
};

$("#composer").onsubmit = (e) => {
  e.preventDefault();
  if (!current) return;
  client.typing(current, "stopped");
  const form = e.target as HTMLFormElement;
  const input = form.querySelector("input")!;
  const c = conv(current);
  const item: Item = { cmid: crypto.randomUUID().replace(/-/g, ""), from: me, text: input.value, state: "pending" };
  c.pending.push(item);
  input.value = "";
  renderTimeline();
  status(client.state);
  client
    .send(current, { text: item.text }, item.cmid)
    .then((r) => {
      item.seq = r.seq;
      item.id = r.id;
      if (item.state === "pending") item.state = "sent";
    })
    .catch(() => (item.state = "failed"))
    .finally(() => {
      if (c.id === current) renderTimeline();
      status(client.state);
    });
};

// A tab is a device: it keeps its device id across reloads (sessionStorage), and a new
// tab gets a new one. `?user=alice&device=tab-1` signs in at once.
const device = params.get("device") ?? sessionStorage.getItem("herald-demo-device") ?? `tab-${Math.random().toString(36).slice(2, 8)}`;
($("#signin").querySelector("[name=device]") as HTMLInputElement).value = device;
if (params.get("user")) {
  sessionStorage.setItem("herald-demo-device", device);
  signIn(params.get("user")!, device).catch((err) => {
    $("#status").textContent = String(err.message ?? err);
  });
}
