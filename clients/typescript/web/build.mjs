// Build the web view into a directory (default: the Python package's
// service/lane/server/web/static, where it is committed and served from). esbuild is pinned in
// package.json and its output depends only on its inputs, so scripts/check-web.sh can rebuild
// and compare. Bundled from the built package (dist/, `npm run build` first) through its
// `exports`, as any bundler would take it.
import { copyFile, mkdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const web = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(web, "../../../service/lane/server/web/static"));
await mkdir(out, { recursive: true });
await build({
  absWorkingDir: web,
  entryPoints: [join(web, "src/main.ts")],
  outfile: join(out, "app.js"),
  tsconfig: join(web, "tsconfig.json"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  legalComments: "none",
  charset: "utf8",
  logLevel: "warning",
});
for (const name of ["index.html", "style.css"]) {
  await copyFile(join(web, name), join(out, name));
}
