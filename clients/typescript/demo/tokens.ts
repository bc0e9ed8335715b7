// The demo's dev-only token endpoint, a Vite plugin: `GET /demo/token?user=&device=`
// answers an HS256 token (docs/protocol.md section 1.1) signed with the gateway's
// secret. A real app gets tokens from its own login service; Herald has no token
// endpoint. Off unless DEMO_TOKENS=1, and then refused on anything but a
// loopback address, so that it cannot hand out tokens to a network.

import { createHmac } from "node:crypto";
import type { Plugin } from "vite";

export interface TokenOptions {
  secret: string;
  tenant: string;
  /** Token lifetime in seconds. */
  ttlSecs: number;
}

/** An HS256 token for `user` on `device`. */
export function mint(o: TokenOptions, user: string, device: string): string {
  const b64 = (v: object) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const head = b64({ alg: "HS256", typ: "JWT" });
  const exp = Math.floor(Date.now() / 1000) + o.ttlSecs;
  const body = b64({ tid: o.tenant, sub: user, dev: device, plat: "web", exp });
  const sig = createHmac("sha256", o.secret).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

const NAME = /^[A-Za-z0-9._-]{1,64}$/;
const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1"]);

/** The endpoint when `enabled`; otherwise a plugin that does nothing. */
export function devTokens(enabled: boolean, o: Partial<TokenOptions>): Plugin {
  return {
    name: "herald-demo-tokens",
    apply: "serve",
    configResolved(config) {
      if (!enabled) return;
      const host = config.server.host;
      if (typeof host !== "string" || !LOOPBACK.has(host)) {
        throw new Error(`DEMO_TOKENS=1 mints tokens for anyone who asks: serve on a loopback host (not ${String(host)})`);
      }
      if (!o.secret || o.secret.length < 32) throw new Error("DEMO_TOKENS=1 needs HERALD_JWT_SECRET (at least 32 characters)");
    },
    configureServer(server) {
      server.middlewares.use("/demo/token", (req, res) => {
        const q = new URL(req.url ?? "", "http://x").searchParams;
        const user = q.get("user") ?? "";
        const device = q.get("device") ?? "";
        if (!enabled) {
          res.statusCode = 404;
          res.end("dev tokens are off: start the demo with DEMO_TOKENS=1 (demo/run.sh does)");
        } else if (!NAME.test(user) || !NAME.test(device)) {
          res.statusCode = 400;
          res.end("user and device: 1..64 of A-Z a-z 0-9 . _ -");
        } else {
          res.setHeader("content-type", "text/plain");
          res.setHeader("cache-control", "no-store");
          res.end(mint({ secret: o.secret!, tenant: o.tenant ?? "acme", ttlSecs: o.ttlSecs ?? 3600 }, user, device));
        }
      });
    },
  };
}
