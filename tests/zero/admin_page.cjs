'use strict';
// The browser half of test_admin_page.py: drives Debian's headless Chromium over the DevTools
// protocol with npm puppeteer-core (which never downloads a browser of its own).
//
//   node admin_page.cjs PUPPETEER_CORE_DIR
//
// Reads one JSON command a line on stdin, answers each with one JSON line on stdout
// ({"ok": true, "value": ...} or {"ok": false, "error": "..."}), in order. Every command has a
// timeout (its "timeout" in ms, else 30 s), so the driver never hangs on the page. Commands:
//   launch     {chromium, userDataDir}     start the browser and open one page
//   goto       {url}                       load a URL (until the load event)
//   eval       {expr}                      the JSON value of a JS expression in the page
//   wait       {expr, timeout}             wait until the expression is truthy; its value
//   click      {selector}                  click an element
//   type       {selector, text}            type into an input (keystrokes, so oninput fires)
//   clear      {selector}                  empty an input and fire its input event
//   screenshot {path}                      a full-page PNG
//   events     {}                          what the page did so far: console errors, page
//                                          errors, dialogs (all accepted), POST responses,
//                                          failed requests
//   close      {}                          close the browser, then exit
// Nothing else goes to stdout; diagnostics go to stderr.

const path = require('path');
const readline = require('readline');
const { pathToFileURL } = require('url');

const puppeteerDir = process.argv[2];
if (!puppeteerDir) {
  process.stderr.write('usage: node admin_page.cjs PUPPETEER_CORE_DIR\n');
  process.exit(2);
}

const DEFAULT_TIMEOUT = 30000;
let browser = null;
let page = null;
const events = { consoleErrors: [], pageErrors: [], dialogs: [], posts: [], requestsFailed: [] };

function log(msg) {
  process.stderr.write(`[admin_page.cjs ${new Date().toISOString()}] ${msg}\n`);
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no result after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function needPage() {
  if (!page) throw new Error('no page: send launch first');
  return page;
}

async function launch(cmd) {
  const mod = await import(pathToFileURL(path.join(puppeteerDir, 'lib', 'puppeteer', 'puppeteer-core.js')).href);
  const puppeteer = mod.default || mod;
  browser = await puppeteer.launch({
    executablePath: cmd.chromium,
    headless: true,
    userDataDir: cmd.userDataDir,
    // Without the background-networking flags Chromium's own outbound connections fail (and
    // log) on a closed network; as root Chromium needs --no-sandbox.
    args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync',
           '--window-size=1280,900'],
    defaultViewport: { width: 1280, height: 900 },
    protocolTimeout: DEFAULT_TIMEOUT,
    handleSIGINT: false,
    handleSIGTERM: false,
    handleSIGHUP: false,
  });
  page = await browser.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') {
      const loc = m.location() || {};
      events.consoleErrors.push({ text: m.text(), url: loc.url || '', time: Date.now() });
    }
  });
  page.on('pageerror', (e) => events.pageErrors.push({ text: String((e && e.stack) || e), time: Date.now() }));
  page.on('dialog', async (d) => {
    events.dialogs.push({ type: d.type(), message: d.message(), time: Date.now() });
    try {
      await d.accept();
    } catch (e) {
      log(`dialog accept failed: ${e}`);
    }
  });
  page.on('requestfailed', (r) => {
    const f = r.failure();
    events.requestsFailed.push({ url: r.url(), method: r.method(), error: f ? f.errorText : '', time: Date.now() });
  });
  page.on('response', async (r) => {
    if (r.request().method() !== 'POST') return;
    const entry = { url: r.url(), status: r.status(), body: null, time: Date.now() };
    events.posts.push(entry);
    try {
      entry.body = await r.text();
    } catch (e) {
      entry.body = `(unreadable: ${e})`;
    }
  });
  return { version: await browser.version() };
}

async function run(cmd) {
  const ms = cmd.timeout || DEFAULT_TIMEOUT;
  switch (cmd.cmd) {
    case 'launch':
      return launch(cmd);
    case 'goto': {
      const res = await needPage().goto(cmd.url, { waitUntil: 'load', timeout: ms });
      return { status: res ? res.status() : null };
    }
    case 'eval':
      return needPage().evaluate(cmd.expr);
    case 'wait': {
      const handle = await needPage().waitForFunction(cmd.expr, { timeout: ms, polling: 50 });
      const value = await handle.jsonValue();
      await handle.dispose();
      return value;
    }
    case 'click':
      await needPage().click(cmd.selector);
      return true;
    case 'type':
      await needPage().type(cmd.selector, cmd.text);
      return true;
    case 'clear':
      await needPage().$eval(cmd.selector, (el) => {
        el.value = '';
        el.dispatchEvent(new Event('input', { bubbles: true }));
      });
      return true;
    case 'screenshot':
      await needPage().screenshot({ path: cmd.path, fullPage: true, type: 'png' });
      return cmd.path;
    case 'events':
      return events;
    case 'close':
      if (browser) await browser.close();
      browser = null;
      page = null;
      return true;
    default:
      throw new Error(`unknown command ${JSON.stringify(cmd.cmd)}`);
  }
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let cmd;
    let answer;
    try {
      cmd = JSON.parse(line);
      const ms = (cmd.timeout || DEFAULT_TIMEOUT) + 2000;  // the command's own wait, then this
      const value = await withTimeout(run(cmd), ms, cmd.cmd);
      answer = { ok: true, value: value === undefined ? null : value };
    } catch (e) {
      answer = { ok: false, error: String((e && e.message) || e) };
      log(`${line.slice(0, 200)} failed: ${answer.error}`);
    }
    process.stdout.write(JSON.stringify(answer) + '\n');
    if (cmd && cmd.cmd === 'close') break;
  }
  if (browser) {
    try {
      await withTimeout(browser.close(), 10000, 'close at end of input');
    } catch (e) {
      log(`closing the browser failed: ${e}`);
    }
  }
  process.exit(0);
}

main().catch((e) => {
  log(`fatal: ${(e && e.stack) || e}`);
  process.exit(1);
});
