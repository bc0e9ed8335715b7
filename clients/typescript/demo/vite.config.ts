// The demo page, served by Vite from the package source (../src). Environment:
// DEMO_GATEWAYS      the gateways, comma-separated (default http://127.0.0.1:8080,http://127.0.0.1:8081)
// DEMO_PORT          the page's port (default 5173; list its origin in gateway.cors_origins)
// DEMO_TOKENS        1: serve the dev-only token endpoint (tokens.ts); off by default
// HERALD_JWT_SECRET  the gateways' secret, for that endpoint
// DEMO_TENANT        the tenant of its tokens (default acme)

import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";
import { devTokens } from "./tokens.js";

const env = process.env;
const gateways = (env.DEMO_GATEWAYS ?? "http://127.0.0.1:8080,http://127.0.0.1:8081")
  .split(",")
  .map((g) => g.trim())
  .filter(Boolean);

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  define: { __HERALD_GATEWAYS__: JSON.stringify(gateways) },
  server: {
    host: "127.0.0.1",
    port: Number(env.DEMO_PORT ?? 5173),
    strictPort: true,
    // The package source is one folder up.
    fs: { allow: [fileURLToPath(new URL("..", import.meta.url))] },
  },
  plugins: [devTokens(env.DEMO_TOKENS === "1", { secret: env.HERALD_JWT_SECRET, tenant: env.DEMO_TENANT })],
});
