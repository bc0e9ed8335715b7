// A local Herald for the integration tests: one worker and two gateways, real
// processes from `cargo build --bins`, against the MariaDB and Redis of IT_MYSQL_URL
// and IT_REDIS_URL (as the Rust end-to-end tests use). Each cluster has its own
// database and Redis key prefix; every process binds port 0 and reports its addresses
// in its log. HERALD_BIN_DIR names the binaries' folder (default: the workspace's
// target/debug).

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHmac, randomBytes } from "node:crypto";
import { mkdirSync, openSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const SECRET = "ts-integration-secret-0123456789";
export const TENANT = "acme";

const binDir = process.env.HERALD_BIN_DIR ?? resolve(import.meta.dirname, "../../../../target/debug");
const mysqlBase = process.env.IT_MYSQL_URL ?? "mysql://root@127.0.0.1:3306";
const redisUrl = process.env.IT_REDIS_URL ?? "redis://127.0.0.1:6379/0";

/** An HS256 token (docs/protocol.md section 1.1). */
export function token(user: string, device: string, expInSecs = 3600): string {
  const b64 = (v: object) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const head = b64({ alg: "HS256", typ: "JWT" });
  const exp = Math.floor(Date.now() / 1000) + expInSecs;
  const body = b64({ tid: TENANT, sub: user, dev: device, plat: "web", exp });
  const sig = createHmac("sha256", SECRET).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

export interface Node {
  name: string;
  child: ChildProcess;
  /** `http://127.0.0.1:port` of the public listener (gateways). */
  base: string;
  admin: string;
}

const ANSI = /\x1b\[[0-9;]*[a-zA-Z]/g;

export class Herald {
  readonly gateways: Node[] = [];
  worker!: Node;
  private readonly id = randomBytes(4).toString("hex");
  private readonly logs = join(tmpdir(), `herald-ts-it-${this.id}`);

  /** Extra settings for every process (e.g. `HERALD_GATEWAY__CORS_ORIGINS`). */
  private env: Record<string, string> = {};

  static async start(gateways = 2, env: Record<string, string> = {}): Promise<Herald> {
    const h = new Herald();
    h.env = env;
    mkdirSync(h.logs, { recursive: true });
    h.worker = await h.launch("herald-worker", "wk-1");
    for (let i = 1; i <= gateways; i++) h.gateways.push(await h.launch("herald-gateway", `gw-${i}`));
    return h;
  }

  private async launch(binary: string, name: string): Promise<Node> {
    const log = join(this.logs, `${name}.log`);
    const fd = openSync(log, "a");
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("HERALD_") && v !== undefined) env[k] = v;
    Object.assign(env, {
      RUST_LOG: "info",
      HERALD_MYSQL_URL: `${mysqlBase}/herald_ts_${this.id}`,
      HERALD_REDIS_URL: redisUrl,
      HERALD_REDIS_KEY_PREFIX: `ts${this.id}`,
      HERALD_JWT_SECRET: SECRET,
      HERALD_NODE_ID: `${name}-${this.id}`,
      HERALD_LISTEN: "127.0.0.1:0",
      HERALD_ADMIN_LISTEN: "127.0.0.1:0",
      ...this.env,
    });
    const child = spawn(join(binDir, binary), [], { env, stdio: ["ignore", fd, fd] });
    const started = binary === "herald-worker" ? "worker started" : "gateway started";
    const deadline = Date.now() + 60_000;
    for (;;) {
      const line = readFileSync(log, "utf8").replace(ANSI, "").split("\n").find((l) => l.includes(started));
      if (line) {
        const field = (f: string) => line.match(new RegExp(`\\b${f}=(\\S+)`))?.[1] ?? "";
        const node = { name, child, base: `http://${field("listen")}`, admin: `http://${field("admin")}` };
        await this.ready(node, log);
        return node;
      }
      if (child.exitCode !== null || Date.now() > deadline) throw new Error(`${name} did not start:\n${readFileSync(log, "utf8")}`);
      await sleep(50);
    }
  }

  private async ready(n: Node, log: string): Promise<void> {
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (n.child.exitCode !== null) break;
      const ok = await fetch(`${n.admin}/readyz`).then((r) => r.ok, () => false);
      if (ok) return;
      await sleep(100);
    }
    throw new Error(`${n.name} not ready:\n${readFileSync(log, "utf8")}`);
  }

  /** An HTTP call as `user` (docs/protocol.md section 2), to a gateway still running. */
  async api(user: string, method: string, path: string, body?: unknown, device = "http"): Promise<any> {
    const live = this.gateways.find((g) => g.child.exitCode === null && g.child.signalCode === null);
    if (!live) throw new Error("no gateway running");
    const r = await fetch(`${live.base}${path}`, {
      method,
      headers: { authorization: `Bearer ${token(user, device)}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  /** SIGKILL: no drain, no close frames. */
  kill(n: Node): void {
    n.child.kill("SIGKILL");
  }

  /** Kills every process and drops the database (best effort, with the `mariadb` client). */
  async stop(): Promise<void> {
    for (const n of [...this.gateways, this.worker]) if (n && n.child.exitCode === null) n.child.kill("SIGKILL");
    const u = new URL(mysqlBase);
    const args = ["-h", u.hostname, "-P", u.port || "3306", "-u", decodeURIComponent(u.username)];
    if (u.password) args.push(`-p${decodeURIComponent(u.password)}`);
    spawnSync("mariadb", [...args, "-e", `DROP DATABASE IF EXISTS herald_ts_${this.id}`], { stdio: "ignore" });
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it holds, or fails with `what` after `ms`. */
export async function eventually(ms: number, what: string, check: () => boolean): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for: ${what}`);
    await sleep(50);
  }
}
