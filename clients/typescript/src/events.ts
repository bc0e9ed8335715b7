// A small typed event emitter (no dependency on Node's or the DOM's).

export type Listener<T> = (value: T) => void;

export class Emitter<Events extends object> {
  private readonly listeners = new Map<keyof Events, Set<Listener<any>>>();

  /** Subscribes; returns the unsubscribe function. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener);
    return () => set!.delete(listener);
  }

  protected emit<K extends keyof Events>(event: K, value: Events[K]): void {
    for (const l of this.listeners.get(event) ?? []) {
      try {
        l(value);
      } catch (e) {
        // An app's listener must not break the connection's bookkeeping.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
}
