import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    // The integration tests start real Herald processes: one file at a time.
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
});
