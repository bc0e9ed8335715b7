// The demo page (demo/) in headless Chromium (Debian's, driven by playwright-core)
// against a real local Herald (one worker, two gateways): two users chat, two tabs are
// two devices of one user, and a page whose gateway is SIGKILLed reconnects to the other. Each page's timeline must
// hold every message once and in seq order. Edits, recalls and membership and title
// changes show on every page, and so do typing and the presence of the people seen. CHROMIUM names the browser (default /usr/bin/chromium);
// DEMO_SCREENSHOT=file saves a screenshot of the chat, DEMO_SCREENSHOT_EVENTS=file one
// of the timeline events, DEMO_SCREENSHOT_TYPING=file one of typing and presence.

import { createServer as netServer } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type Browser, type Page } from "playwright-core";
import { createServer, type ViteDevServer } from "vite";
import { Herald, SECRET } from "../integration/herald.js";

let herald: Herald;
let vite: ViteDevServer;
let browser: Browser;
let origin: string;

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = netServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

beforeAll(async () => {
  const port = await freePort();
  origin = `http://127.0.0.1:${port}`;
  herald = await Herald.start(2, { HERALD_GATEWAY__CORS_ORIGINS: origin });
  Object.assign(process.env, {
    DEMO_TOKENS: "1",
    HERALD_JWT_SECRET: SECRET,
    DEMO_PORT: String(port),
    DEMO_GATEWAYS: herald.gateways.map((g) => g.base).join(","),
  });
  vite = await createServer({ configFile: new URL("../../demo/vite.config.ts", import.meta.url).pathname, logLevel: "warn", clearScreen: false });
  await vite.listen();
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: ["--no-sandbox"] });
});
afterAll(async () => {
  await browser?.close();
  await vite?.close();
  await herald?.stop();
});

/** A signed-in page whose gateways are tried in the order given. */
async function signIn(user: string, gateways: string[], device = "web"): Promise<Page> {
  const page = await browser.newPage({ viewport: { width: 960, height: 600 } });
  page.on("pageerror", (e) => console.error(`${user}: ${e.message}`));
  const q = new URLSearchParams({ user, device, gw: gateways.join(",") });
  await page.goto(`${origin}/?${q}`);
  await page.waitForSelector('#status[data-state="connected"]', { timeout: 20_000 });
  return page;
}

/** Opens (or creates, when `members`) a conversation; returns its id. */
async function openConv(page: Page, members?: string): Promise<string> {
  if (members) {
    await page.fill("#newconv input", members);
    await page.press("#newconv input", "Enter");
  }
  await page.waitForSelector("#convs li.active", { timeout: 10_000 });
  return (await page.getAttribute("#convs li.active", "data-conv"))!;
}

/** Sends from the composer and waits until committed, so sends from two pages keep their order. */
async function send(page: Page, text: string): Promise<void> {
  await page.fill("#composer input", text);
  await page.press("#composer input", "Enter");
  await page.waitForSelector("#timeline li.pending", { state: "detached", timeout: 20_000 });
}

/** Waits until `n` messages are shown and none pending; returns their seqs and texts. */
async function timeline(page: Page, n: number): Promise<{ seqs: number[]; texts: string[] }> {
  await page.waitForFunction(
    (n) => document.querySelectorAll("#timeline li.msg[data-seq]").length >= n && !document.querySelector("#timeline li.pending"),
    n,
    { timeout: 30_000 },
  );
  await page.waitForTimeout(300); // anything shown twice would show now
  return page.$$eval("#timeline li.msg", (lis) => ({
    seqs: lis.map((li) => Number((li as HTMLElement).dataset.seq)),
    texts: lis.map((li) => li.firstChild!.textContent!),
  }));
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

describe("the demo page", () => {
  it("two users chat and each sees every message once and in order", async () => {
    const [gw1, gw2] = herald.gateways.map((g) => g.base);
    const alice = await signIn("alice", [gw1, gw2]);
    const bob = await signIn("bob", [gw2, gw1]);
    const conv = await openConv(alice, "bob");
    await send(alice, "hi bob");
    await bob.click(`#convs li[data-conv="${conv}"]`, { timeout: 10_000 });
    const n = 20;
    for (let i = 1; i < n; i++) await send(i % 2 ? bob : alice, `${i % 2 ? "bob" : "alice"} ${i}`);
    const expected = ["hi bob", ...range(n - 1).map((i) => `${i % 2 ? "bob" : "alice"} ${i}`)];
    for (const page of [alice, bob]) {
      const t = await timeline(page, n);
      expect(t.seqs).toEqual(range(n));
      expect(t.texts).toEqual(expected);
    }
    // Bob's tab acked alice's messages: they show delivered ticks.
    await alice.waitForSelector("#timeline li.own[data-delivered='1']", { timeout: 10_000 });
    // Bob has the conversation open, so alice sees her last message read.
    await alice.waitForSelector("#timeline li.own .meta:has-text('read by bob')", { timeout: 10_000 });
    // A conversation alice has not opened counts its messages as unread.
    await herald.api("carol", "POST", "/v1/conversations", { id: "lunch", kind: "group", title: "lunch", members: ["alice", "bob", "carol"] });
    for (const body of ["noon?", "the usual place", "who's in?"]) await herald.api("carol", "POST", "/v1/messages", { cmid: body, conv: "lunch", body: { text: body } });
    await alice.waitForSelector('#convs li[data-conv="lunch"] .badge[data-unread="3"]', { timeout: 10_000 });
    if (process.env.DEMO_SCREENSHOT) await alice.screenshot({ path: process.env.DEMO_SCREENSHOT });
    await alice.close();
    await bob.close();
  });

  it("two tabs are two devices of one user: both show the chat, and a read in one clears the other's count", async () => {
    const [gw1, gw2] = herald.gateways.map((g) => g.base);
    const tab1 = await signIn("erin", [gw1], "tab-1");
    const tab2 = await signIn("erin", [gw2], "tab-2");
    const frank = await signIn("frank", [gw2]);
    const conv = await openConv(frank, "erin");
    for (const text of ["one", "two", "three"]) await send(frank, text);
    for (const tab of [tab1, tab2]) await tab.waitForSelector(`#convs li[data-conv="${conv}"] .badge[data-unread="3"]`, { timeout: 10_000 });
    // Found through its first message, listed with its title.
    expect(await tab1.textContent(`#convs li[data-conv="${conv}"] .name`)).toBe("frank, erin");
    await tab1.click(`#convs li[data-conv="${conv}"]`);
    await tab2.waitForSelector(`#convs li[data-conv="${conv}"] .badge[data-unread="0"]`, { state: "attached", timeout: 10_000 });
    await send(tab1, "from tab 1");
    await tab2.click(`#convs li[data-conv="${conv}"]`);
    for (const page of [tab1, tab2, frank]) {
      const t = await timeline(page, 4);
      expect(t.seqs).toEqual(range(4));
      expect(t.texts).toEqual(["one", "two", "three", "from tab 1"]);
    }
    for (const page of [tab1, tab2, frank]) await page.close();
  });

  it("edits, recalls and membership and title changes show on every page", async () => {
    const [gw1, gw2] = herald.gateways.map((g) => g.base);
    const gina = await signIn("gina", [gw1]);
    const hank = await signIn("hank", [gw2]);
    const conv = await openConv(gina, "hank");
    await send(gina, "helo");
    await send(gina, "meeting at 3?");
    await send(gina, "wrong room");
    await hank.click(`#convs li[data-conv="${conv}"]`, { timeout: 10_000 });
    await timeline(hank, 3);
    // Gina edits her first message and recalls her last, from their buttons.
    gina.once("dialog", (d) => void d.accept("hello"));
    await gina.click('#timeline li.own:has-text("helo") button.edit');
    await gina.waitForSelector('#timeline li[data-edited="1"]:has-text("hello")', { timeout: 10_000 });
    await gina.click('#timeline li.own:has-text("wrong room") button.recall');
    // She adds ivan; a service of the app renames the group.
    await gina.fill("#members input", "ivan");
    await gina.press("#members input", "Enter");
    await gina.waitForSelector("#timeline li.event:has-text('gina added ivan')", { timeout: 15_000 });
    await herald.api("gina", "POST", `/v1/conversations/${conv}/title`, { title: "Project" });
    for (const page of [gina, hank]) {
      await page.waitForSelector("#timeline li.event:has-text('renamed the conversation')", { timeout: 15_000 });
      const lines = await page.$$eval("#timeline li", (lis) =>
        lis.map((li) => `${li.className.includes("event") ? "event" : "msg"}: ${li.firstChild!.textContent}${(li as HTMLElement).dataset.edited ? " (edited)" : ""}`),
      );
      expect(lines).toEqual([
        "msg: hello (edited)",
        "msg: meeting at 3?",
        "msg: message recalled",
        "event: gina added ivan",
        'event: gina renamed the conversation "Project"',
      ]);
      expect(await page.textContent("#title")).toBe("Project");
    }
    if (process.env.DEMO_SCREENSHOT_EVENTS) await hank.screenshot({ path: process.env.DEMO_SCREENSHOT_EVENTS });
    await gina.close();
    await hank.close();
  });

  it("shows who is typing and the people seen with their presence", async () => {
    const [gw1, gw2] = herald.gateways.map((g) => g.base);
    const kim = await signIn("kim", [gw1]);
    const lee = await signIn("lee", [gw2]);
    const conv = await openConv(kim, "lee");
    await send(kim, "there?");
    await lee.click(`#convs li[data-conv="${conv}"]`, { timeout: 10_000 });
    await timeline(lee, 1);
    // Each has seen the other (a member, a sender): followed, shown online.
    await lee.waitForSelector('#people li[data-user="kim"][data-online="1"]', { timeout: 10_000 });
    await kim.waitForSelector('#people li[data-user="lee"][data-online="1"]', { timeout: 10_000 });
    // Lee types (keys, no send): kim's page says so under the timeline, then not once sent.
    await lee.click("#composer input");
    await lee.keyboard.type("on my way");
    await kim.waitForSelector('#typing[data-typing="lee"]', { timeout: 10_000 });
    expect(await kim.textContent("#typing")).toBe("lee is typing…");
    expect(await lee.textContent("#typing")).toBe("");
    if (process.env.DEMO_SCREENSHOT_TYPING) await kim.screenshot({ path: process.env.DEMO_SCREENSHOT_TYPING });
    await lee.press("#composer input", "Enter");
    await kim.waitForSelector('#typing[data-typing=""]', { state: "attached", timeout: 10_000 });
    // Nothing of it was stored: the timeline holds the two messages only.
    expect((await timeline(kim, 2)).texts).toEqual(["there?", "on my way"]);
    // Lee leaves: kim's page shows lee offline, with when last seen.
    await lee.close();
    await kim.waitForSelector('#people li[data-user="lee"][data-online="0"]', { timeout: 15_000 });
    expect(await kim.textContent('#people li[data-user="lee"] .name')).toContain("last seen");
    await kim.close();
  });

  it("a page whose gateway is SIGKILLed reconnects to the other and shows every message once, in order", async () => {
    const [gw1, gw2] = herald.gateways;
    const carol = await signIn("carol", [gw1.base, gw2.base]);
    const dave = await signIn("dave", [gw2.base]);
    expect(await carol.getAttribute("#status", "data-gateway")).toContain(gw1.base.replace(/^http/, "ws"));
    const conv = await openConv(carol, "dave");
    await send(carol, "before");
    await dave.click(`#convs li[data-conv="${conv}"]`, { timeout: 10_000 });
    const n = 30;
    for (let i = 1; i < n - 1; i++) {
      await send(dave, `dave ${i}`);
      if (i === 10) herald.kill(gw1);
    }
    await carol.waitForSelector('#status[data-state="connected"][data-reconnects="1"]', { timeout: 20_000 });
    expect(await carol.getAttribute("#status", "data-gateway")).toContain(gw2.base.replace(/^http/, "ws"));
    await send(carol, "after");
    for (const page of [carol, dave]) {
      const t = await timeline(page, n);
      expect(t.seqs).toEqual(range(n));
      expect(t.texts).toEqual(["before", ...range(n - 2).map((i) => `dave ${i}`), "after"]);
    }
    await carol.close();
    await dave.close();
  });
});
