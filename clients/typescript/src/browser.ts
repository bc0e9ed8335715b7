// Browser hooks: when the network comes back (`online`) or the page becomes visible
// again (`visibilitychange`; timers of hidden tabs are throttled), a client waiting to
// reconnect does it at once, and a connected one checks its session with a ping
// instead of waiting for the next one.

/** What the hooks need of `window` and `document` (injectable for tests). */
export interface BrowserEnv {
  window: Pick<EventTarget, "addEventListener" | "removeEventListener">;
  document: Pick<EventTarget, "addEventListener" | "removeEventListener"> & { visibilityState: string };
}

/** The browser's, or null outside one (Node, workers without a document). */
export function browserEnv(): BrowserEnv | null {
  const g = globalThis as any;
  return g.window?.addEventListener && g.document?.addEventListener ? { window: g.window, document: g.document } : null;
}

/** Calls `wake` on `online` and when the page becomes visible; returns the unsubscribe. */
export function watchBrowser(env: BrowserEnv, wake: () => void): () => void {
  const online = () => wake();
  const visibility = () => {
    if (env.document.visibilityState === "visible") wake();
  };
  env.window.addEventListener("online", online);
  env.document.addEventListener("visibilitychange", visibility);
  return () => {
    env.window.removeEventListener("online", online);
    env.document.removeEventListener("visibilitychange", visibility);
  };
}
