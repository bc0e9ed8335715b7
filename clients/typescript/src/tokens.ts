// Token discipline: the app's token function is asked only when no token is held, the
// held one is near its `exp`, or the server refused it (401, 4001, 4004). Reconnects
// and HTTP requests reuse the token held, so a gateway rollout that reconnects every
// client does not become a storm on the tenant's token endpoint. Concurrent askers
// share one call. A failed call is retried with jittered backoff, then surfaced as a
// `TokenUnavailable`; the function returning `null` means the user is logged out.

import { Backoff } from "./backoff.js";
import { tokenExpiry } from "./protocol.js";

/** Why the app is asked for a token. */
export type TokenReason = "connect" | "expired" | "refresh";

/** The app's token: a fixed one, or a function; `null` from it means "logged out". */
export type TokenSource = string | ((reason: TokenReason) => string | null | Promise<string | null>);

/** A debug hook: what the client did and why (token calls, retries, reconnect decisions). */
export type Logger = (event: string, details?: Record<string, unknown>) => void;

/** The token function said the user is logged out (it returned `null`). */
export class LoggedOut extends Error {
  constructor() {
    super("the token function says the user is logged out");
    this.name = "LoggedOut";
  }
}

/** The token function kept failing: `attempts` calls, the last one with `cause`. */
export class TokenUnavailable extends Error {
  constructor(
    readonly attempts: number,
    override readonly cause: unknown,
  ) {
    super(`no token after ${attempts} attempts: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = "TokenUnavailable";
  }
}

export interface TokenKeeperOptions {
  /** A held token this close to its `exp` is renewed before use (default 60 000 ms). */
  renewBeforeMs?: number;
  /** Calls of the token function per renewal before `TokenUnavailable` (default 4). */
  attempts?: number;
  /** Delays between those calls: jittered, exponential (default 500 ms up to 8 s). */
  backoff?: { baseMs?: number; maxMs?: number; random?: () => number };
  log?: Logger;
}

export class TokenKeeper {
  private held: string | null = null;
  private pending: Promise<string> | null = null;
  /** How often the token function was called (for the app's metrics and tests). */
  calls = 0;

  constructor(
    private readonly source: TokenSource,
    private readonly o: TokenKeeperOptions = {},
  ) {
    if (typeof source === "string") this.held = source;
  }

  /** Whether new tokens can be had (a fixed token that was refused cannot get better). */
  get renewable(): boolean {
    return typeof this.source === "function";
  }

  /** The token held, if any (it may be near its expiry). */
  get current(): string | null {
    return this.held;
  }

  /** A usable token: the one held unless it is missing or near its `exp`. */
  async get(reason: TokenReason): Promise<string> {
    if (this.held !== null && (typeof this.source === "string" || !this.nearExpiry(this.held))) return this.held;
    return this.renew(reason);
  }

  /** The server refused the held token: the next `get` asks for a new one. */
  refused(): void {
    if (typeof this.source === "function") this.held = null;
  }

  /** A new token now (a refresh in the session), whatever is held. */
  renew(reason: TokenReason): Promise<string> {
    if (typeof this.source === "string") return Promise.resolve(this.source);
    this.pending ??= this.ask(this.source, reason).finally(() => {
      this.pending = null;
    });
    return this.pending;
  }

  private nearExpiry(token: string): boolean {
    const exp = tokenExpiry(token);
    // A token without a readable `exp` is used until the server refuses it.
    return exp !== null && exp * 1000 - (this.o.renewBeforeMs ?? 60_000) <= Date.now();
  }

  private async ask(fn: Exclude<TokenSource, string>, reason: TokenReason): Promise<string> {
    const attempts = this.o.attempts ?? 4;
    const backoff = new Backoff({ baseMs: 500, maxMs: 8_000, ...this.o.backoff });
    for (let attempt = 1; ; attempt++) {
      this.calls++;
      this.o.log?.("token.ask", { reason, attempt });
      let token: string | null;
      try {
        token = await fn(reason);
      } catch (e) {
        if (attempt >= attempts) {
          this.o.log?.("token.failed", { reason, attempts: attempt, error: String(e) });
          throw new TokenUnavailable(attempt, e);
        }
        const delayMs = backoff.next();
        this.o.log?.("token.retry", { reason, attempt, delayMs, error: String(e) });
        await new Promise((resolve) => setTimeout(resolve, delayMs));
        continue;
      }
      if (token === null) {
        this.held = null;
        this.o.log?.("token.logged_out", { reason });
        throw new LoggedOut();
      }
      this.held = token;
      return token;
    }
  }
}
