/**
 * A headless Chromium driven over stdin/stdout, for the browser tests of the web view
 * (tests/integration/test_web_view.py), which drive the service and ask this process what the
 * page shows at each step.
 *
 *   node --import tsx web/e2e/browser.ts CHROMIUM_EXECUTABLE
 *
 * One JSON request per line on stdin, `{"id": n, "op": …}`; one answer per line on stdout,
 * `{"id": n, "ok": true, "value": …}` or `{"id": n, "ok": false, "error": "…"}`. Operations:
 * `goto {url}`, `wait {expr, timeoutMs?}` (until the page expression is truthy; its value),
 * `eval {expr}` (the page expression's value), `click {selector}`, `fill {selector, value}`, `select {selector, value}` (an option of a select),
 * `press {key}` (a key on the keyboard, to whatever has the focus), `viewport {width, height}`,
 * `scheme {value}` (`light` or `dark`: the system setting the page sees), `upload {selector,
 * path}` (a file for a file input), `download {selector, path}` (click, save the download
 * there; its suggested name), `screenshot {path, full?}`. The page's console and errors go to
 * stderr. Playwright (playwright-core)
 * drives the Chromium it is given; it downloads no browser of its own.
 */
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

interface Request {
  id: number;
  op: string;
  url?: string;
  expr?: string;
  selector?: string;
  value?: string;
  path?: string;
  key?: string;
  width?: number;
  height?: number;
  full?: boolean;
  timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 15_000;

const executablePath = process.argv[2];
if (!executablePath) {
  console.error("usage: node --import tsx web/e2e/browser.ts CHROMIUM_EXECUTABLE");
  process.exit(2);
}
// --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
// bypassCSP: Playwright evaluates the tests' expressions as strings, which the page's
// Content-Security-Policy (no eval) would refuse; the page itself runs under it unchanged.
const page = await browser.newPage({ viewport: { width: 1100, height: 760 }, bypassCSP: true, acceptDownloads: true });
page.on("console", (message) => console.error(`page ${message.type()}: ${message.text()}`));
page.on("pageerror", (error) => console.error(`page error: ${error.message}`));

async function run(request: Request): Promise<unknown> {
  const timeout = request.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  switch (request.op) {
    case "goto":
      await page.goto(request.url ?? "", { timeout });
      return null;
    case "wait": {
      const handle = await page.waitForFunction(request.expr ?? "", undefined, { timeout });
      return await handle.jsonValue();
    }
    case "eval":
      return await page.evaluate(request.expr ?? "");
    case "click":
      await page.click(request.selector ?? "", { timeout });
      return null;
    case "fill":
      await page.fill(request.selector ?? "", request.value ?? "", { timeout });
      return null;
    case "select":
      await page.selectOption(request.selector ?? "", request.value ?? "", { timeout });
      return null;
    case "press":
      await page.keyboard.press(request.key ?? "", { delay: 10 });
      return null;
    case "viewport":
      await page.setViewportSize({ width: request.width ?? 1100, height: request.height ?? 760 });
      return null;
    case "scheme":
      await page.emulateMedia({ colorScheme: request.value === "dark" ? "dark" : "light" });
      return null;
    case "upload":
      await page.setInputFiles(request.selector ?? "", request.path ?? "", { timeout });
      return null;
    case "download": {
      const [download] = await Promise.all([
        page.waitForEvent("download", { timeout }),
        page.click(request.selector ?? "", { timeout }),
      ]);
      await download.saveAs(request.path ?? "download");
      return download.suggestedFilename();
    }
    case "screenshot":
      await page.screenshot({ path: request.path ?? "page.png", fullPage: request.full ?? true });
      return null;
    default:
      throw new Error(`unknown op ${request.op}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const request = JSON.parse(line) as Request;
  let answer: object;
  try {
    answer = { id: request.id, ok: true, value: (await run(request)) ?? null };
  } catch (error) {
    answer = { id: request.id, ok: false, error: String(error) };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
await browser.close();
