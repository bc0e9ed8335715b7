// Reconnect and resend delays: exponential with full jitter (a uniformly random delay
// between 0 and the current cap), so that a thousand clients cut at once do not come
// back at once. Server hints (`reconnect.after_ms`, `retry_after_ms`) are already
// jittered per client and are used as given.

export interface BackoffOptions {
  /** The cap of the first delay, ms (default 500). */
  baseMs?: number;
  /** The largest cap, ms (default 30 000). */
  maxMs?: number;
  /** Uniform in [0, 1); injectable for tests. */
  random?: () => number;
}

export class Backoff {
  private attempt = 0;
  private readonly baseMs: number;
  private readonly maxMs: number;
  private readonly random: () => number;

  constructor(o: BackoffOptions = {}) {
    this.baseMs = o.baseMs ?? 500;
    this.maxMs = o.maxMs ?? 30_000;
    this.random = o.random ?? Math.random;
  }

  /** The current cap: base x 2^attempt, at most max. */
  cap(): number {
    return Math.min(this.maxMs, this.baseMs * 2 ** Math.min(this.attempt, 30));
  }

  /** The next delay, in [0, cap), and the cap doubles for the one after. */
  next(): number {
    const d = Math.floor(this.random() * this.cap());
    this.attempt++;
    return d;
  }

  /** A session worked: start from the base again. */
  reset(): void {
    this.attempt = 0;
  }

  get attempts(): number {
    return this.attempt;
  }
}
