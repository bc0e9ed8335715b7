// The scratch project of the package test: what a tenant's app would be, using
// @herald/client from the packed tarball (never from ../src). The same round trip runs
// from Node as ESM and as CommonJS, and from a page bundled by esbuild for the browser:
// a receiving device connects, a sending device sends, the receiver shows the message.

import { writeFileSync } from "node:fs";
import { join } from "node:path";

/** The round trip, as plain JavaScript over an imported `HeraldClient` and WebSocket. */
const ROUND_TRIP = `
async function roundTrip(HeraldClient, WebSocket, args) {
  const { url, senderToken, receiverToken, conv, text } = args;
  const open = (token) => new HeraldClient({ url, token: () => token, WebSocket, backoff: { baseMs: 100, maxMs: 1000 } });
  const receiver = open(receiverToken);
  const sender = open(senderToken);
  const shown = new Promise((resolve) => receiver.on("message", (m) => { if (m.conv === conv) resolve(m); }));
  const connected = (c) => new Promise((resolve) => {
    if (c.state === "connected") return resolve();
    c.on("state", (s) => { if (s.state === "connected") resolve(); });
  });
  receiver.connect();
  sender.connect();
  await Promise.all([connected(receiver), connected(sender)]);
  const sent = await sender.send(conv, { text });
  const m = await shown;
  receiver.close();
  sender.close();
  return { seq: sent.seq, shownSeq: m.seq, shownText: m.body.text, sameId: m.id === sent.id };
}
`;

/** Writes the scratch project's files into `dir` (its package.json and entry points). */
export function writeApp(dir: string): void {
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "scratch", private: true, type: "module" }, null, 2));
  const run = `roundTrip(HeraldClient, WebSocket, JSON.parse(process.env.ROUND_TRIP)).then(
  (r) => { console.log(JSON.stringify(r)); process.exit(0); },
  (e) => { console.error(e); process.exit(1); });`;
  writeFileSync(join(dir, "esm.mjs"), `import { HeraldClient } from "@herald/client";\nimport WebSocket from "ws";\n${ROUND_TRIP}\n${run}\n`);
  writeFileSync(
    join(dir, "cjs.cjs"),
    `const { HeraldClient } = require("@herald/client");\nconst WebSocket = require("ws");\n${ROUND_TRIP}\n${run}\n`,
  );
  writeFileSync(
    join(dir, "page.js"),
    `import { HeraldClient } from "@herald/client";\n${ROUND_TRIP}\nwindow.roundTrip = (args) => roundTrip(HeraldClient, WebSocket, args);\n`,
  );
  writeFileSync(join(dir, "index.html"), `<!doctype html><meta charset="utf-8"><title>scratch</title><script src="bundle.js"></script>\n`);
  // The types, as a TypeScript app sees them through the package's exports: ESM
  // (import) and CommonJS (require) resolve their own declarations.
  const typed = (imp: string) => `${imp}
const c = new HeraldClient({ url: "http://127.0.0.1:1", token: () => "t" });
const state: ConnectionState = c.state;
const order: number = compareIds("9", "10");
export { state, order };
`;
  writeFileSync(join(dir, "typed.mts"), typed(`import { HeraldClient, compareIds, type ConnectionState } from "@herald/client";`));
  writeFileSync(
    join(dir, "typed.cts"),
    typed(`import { HeraldClient, compareIds, type ConnectionState } from "@herald/client";`),
  );
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true, lib: ["ES2022", "DOM"], types: [] },
      files: ["typed.mts", "typed.cts"],
    }),
  );
}
