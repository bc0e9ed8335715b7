// The npm package as a tenant gets it: `npm pack` (which builds through `prepack`), the
// tarball's contents (ESM, CommonJS, types, source maps, the licence), then the tarball
// installed into a scratch project and used against a real local Herald from Node (ESM
// and CommonJS) and from a page bundled by esbuild in headless Chromium.

import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { build } from "esbuild";
import { chromium, type Browser } from "playwright-core";
import { Herald, token } from "../integration/herald.js";
import { writeApp } from "./app.js";

const pkgDir = resolve(import.meta.dirname, "../..");
const work = mkdtempSync(join(tmpdir(), "herald-pack-"));
const app = join(work, "app");
let files: string[] = [];
let tarball = "";
let herald: Herald;
let server: Server;
let origin = "";
let browser: Browser;

const run = (cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = process.env) =>
  execFileSync(cmd, args, { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

beforeAll(async () => {
  // The packed tarball, built from a clean tree by prepack (no dist/ beforehand).
  rmSync(join(pkgDir, "dist"), { recursive: true, force: true });
  const packed = JSON.parse(run("npm", ["pack", "--json", "--silent", "--pack-destination", work], pkgDir));
  files = packed[0].files.map((f: { path: string }) => f.path);
  tarball = join(work, packed[0].filename);
  mkdirSync(app);
  writeApp(app);
  // The tarball has no dependencies; ws is the Node app's own (from this package's devDependencies).
  run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", tarball, join(pkgDir, "node_modules/ws")], app);
  server = createServer((req, res) => {
    const name = req.url === "/bundle.js" ? "bundle.js" : "index.html";
    res.setHeader("content-type", name.endsWith(".js") ? "text/javascript" : "text/html");
    res.end(readFileSync(join(app, name)));
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  herald = await Herald.start(1, { HERALD_GATEWAY__CORS_ORIGINS: origin });
}, 300_000);
afterAll(async () => {
  await browser?.close();
  server?.close();
  await herald?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** Arguments of one round trip in a conversation of its own. */
async function roundTripArgs(name: string) {
  const conv = `pack-${name}`;
  await herald.api(`${name}-a`, "POST", "/v1/conversations", { id: conv, kind: "direct", members: [`${name}-a`, `${name}-b`] });
  return {
    url: herald.gateways[0].base,
    senderToken: token(`${name}-a`, "web"),
    receiverToken: token(`${name}-b`, "web"),
    conv,
    text: `hello from ${name}`,
  };
}

describe("the packed npm package", () => {
  it("ships ESM, CommonJS, types, source maps, the source they map to and the licence", () => {
    for (const f of [
      "package.json",
      "LICENSE",
      "README.md",
      "dist/esm/index.js",
      "dist/esm/index.d.ts",
      "dist/esm/index.js.map",
      "dist/esm/index.d.ts.map",
      "dist/cjs/index.js",
      "dist/cjs/index.d.ts",
      "dist/cjs/index.js.map",
      "dist/cjs/package.json",
      "src/index.ts",
    ]) {
      expect(files, f).toContain(f);
    }
    expect(files.filter((f) => f.startsWith("test/") || f.startsWith("demo/") || f.startsWith("scripts/"))).toEqual([]);
    const installed = join(app, "node_modules/@herald/client");
    const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8"));
    expect(manifest.license).toBe("Apache-2.0");
    expect(readFileSync(join(installed, "LICENSE"), "utf8")).toContain("Apache License");
    // Every map names sources that the package ships.
    for (const map of files.filter((f) => f.endsWith(".map"))) {
      const { sources } = JSON.parse(readFileSync(join(installed, map), "utf8"));
      for (const s of sources) expect(existsSync(resolve(installed, map, "..", s)), `${map} -> ${s}`).toBe(true);
    }
  });

  it("type-checks in a TypeScript app through import and require", { timeout: 180_000 }, () => {
    run(process.execPath, [join(pkgDir, "node_modules/typescript/bin/tsc"), "-p", app], app);
  });

  for (const [flavour, entry] of [
    ["esm", "esm.mjs"],
    ["cjs", "cjs.cjs"],
  ]) {
    it(`sends and shows a message from Node (${flavour})`, async () => {
      const args = await roundTripArgs(flavour);
      const out = run(process.execPath, [entry], app, { ...process.env, ROUND_TRIP: JSON.stringify(args) });
      expect(JSON.parse(out)).toEqual({ seq: 1, shownSeq: 1, shownText: args.text, sameId: true });
    });
  }

  it("sends and shows a message from a page bundled for the browser", async () => {
    const result = await build({
      absWorkingDir: app,
      entryPoints: ["page.js"],
      bundle: true,
      platform: "browser",
      format: "iife",
      outfile: join(app, "bundle.js"),
      logLevel: "silent",
    });
    expect(result.errors).toEqual([]);
    browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: ["--no-sandbox"] });
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(origin);
    const args = await roundTripArgs("browser");
    const out = await page.evaluate((a) => (window as any).roundTrip(a), args);
    expect(out).toEqual({ seq: 1, shownSeq: 1, shownText: args.text, sameId: true });
    expect(errors).toEqual([]);
  });
});
