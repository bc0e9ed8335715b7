// Removes the previous build, so a renamed or deleted module never ships stale.
import { rmSync } from "node:fs";
rmSync(new URL("../dist", import.meta.url), { recursive: true, force: true });
