// Copies the repository's licence (Apache-2.0) beside package.json before packing: npm
// ships a LICENSE from the package's folder, and the repository keeps one copy only.
import { copyFileSync } from "node:fs";
copyFileSync(new URL("../../../LICENSE", import.meta.url), new URL("../LICENSE", import.meta.url));
