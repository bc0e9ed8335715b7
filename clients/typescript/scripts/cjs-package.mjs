// The CommonJS build lives under a package.json of its own saying so: the package's
// root says "type": "module", which would make Node read dist/cjs/*.js as ESM.
import { writeFileSync } from "node:fs";
writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), JSON.stringify({ type: "commonjs" }) + "\n");
