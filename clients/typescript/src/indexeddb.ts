// The outbox in IndexedDB, so that unsent messages survive a reload or a closed tab.
// One object store keyed by `cmid`. `indexedDB` is injectable (tests use a fake).

import type { OutboxEntry, OutboxStorage } from "./outbox.js";

const STORE = "outbox";

function request<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

export class IndexedDbOutboxStorage implements OutboxStorage {
  private db: Promise<IDBDatabase> | null = null;

  /** `name`: the database, one per signed-in device (`herald-outbox-<user>-<device>`). */
  constructor(
    private readonly name: string,
    private readonly factory: IDBFactory = globalThis.indexedDB,
  ) {}

  private open(): Promise<IDBDatabase> {
    if (!this.db) {
      const req = this.factory.open(this.name, 1);
      req.onupgradeneeded = () => {
        if (!req.result.objectStoreNames.contains(STORE)) req.result.createObjectStore(STORE, { keyPath: "cmid" });
      };
      this.db = request(req);
    }
    return this.db;
  }

  private async store(mode: IDBTransactionMode): Promise<IDBObjectStore> {
    return (await this.open()).transaction(STORE, mode).objectStore(STORE);
  }

  async load(): Promise<OutboxEntry[]> {
    return request((await this.store("readonly")).getAll()) as Promise<OutboxEntry[]>;
  }

  async put(entry: OutboxEntry): Promise<void> {
    await request((await this.store("readwrite")).put(entry));
  }

  async delete(cmid: string): Promise<void> {
    await request((await this.store("readwrite")).delete(cmid));
  }

  /** Closes the database (tests, sign-out). */
  async close(): Promise<void> {
    if (this.db) (await this.db).close();
    this.db = null;
  }
}
