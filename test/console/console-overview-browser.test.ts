/**
 * The overview and the console's rough edges in Debian's chromium (playwright-core), against a real PostgreSQL,
 * a real dispatcher and the sandbox provider over mTLS: the console opens on the overview, whose chart and
 * counters move when an operation is dispatched while it is open (polled with a deadline); its polls (the chart's
 * and the live regions') wait for the last answer and stop while the page is hidden (on the page's fake clock);
 * after Approve the page says only what happened; money reads in major units with its minor units beside; Approve
 * and Reject look different; the menu offers only what the roles open; a kill switch is chosen, never defaulted,
 * and confirmed with what it stops; the audit log is a table with its JSON on demand, filtered on the server; no request of a
 * page answers 401 (the favicon); the CSP is never violated.
 *
 * With CONSOLE_SCREENSHOTS set (`npm run screenshots` sets docs/img) it saves the pictures of docs/console.md
 * and the README there: the overview, an approval and the review queue, 1280 and 390 pixels wide.
 */
import t from 'tap';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Page, Route } from 'playwright-core';
import { consoleEnv } from '../helpers/console.js';
import { gctx } from '../helpers/gate.js';
import { putOut } from '../helpers/review-state.js';

const SHOTS = process.env.CONSOLE_SCREENSHOTS ?? join('.actionledger', 'screenshots');
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

const gate = {
  tools: {
    transfer_funds: { approver_roles: ['supervisor'], approval: { mode: 'always' } },
  },
};

/** Polls `read` until `ok` holds or the deadline passes; the last value read. */
async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, deadlineMs = 30_000): Promise<T> {
  const end = Date.now() + deadlineMs;
  let v = await read();
  while (!ok(v) && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 250));
    v = await read();
  }
  return v;
}

/** Records the page's CSP violations and its answers of 401. */
function watch(page: Page): { csp: string[]; unauthorized: string[] } {
  const seen = { csp: [] as string[], unauthorized: [] as string[] };
  page.on('console', (m) => {
    if (/Content Security Policy/i.test(m.text())) seen.csp.push(m.text());
  });
  page.on('response', (r) => {
    if (r.status() === 401) seen.unauthorized.push(r.url());
  });
  return seen;
}

t.test('the overview and the console in a browser', async (t) => {
  const c = await consoleEnv(t, gate);
  await c.person('sup-1', ['supervisor']);
  await c.person('op-1', ['operator']);
  mkdirSync(SHOTS, { recursive: true });

  await t.test('the console opens on the overview, which moves when an operation is dispatched', async (t) => {
    const page = await c.signIn('op-1', null, DESKTOP);
    const seen = watch(page);
    t.equal(new URL(page.url()).pathname, '/console/overview', 'the landing page');
    await page.reload();
    const chart = page.locator('#chart');
    const drawn = async () => Number((await chart.getAttribute('data-drawn')) ?? '-1');
    const first = await until(drawn, (n) => n >= 0);
    t.ok(first >= 0, 'the chart is drawn from the JSON endpoint');
    t.equal(await page.locator('#chart canvas').count(), 1, 'by uPlot, on a canvas');
    const succeeded = async () => Number(await page.locator('#window-succeeded').innerText());
    const before = await succeeded();
    const r = await c.g.gate.call(gctx({ workflow_step_id: 'live-1' }), 'issue_refund', {
      order_id: 'O-2',
      amount: 10,
      currency: 'GBP',
    });
    if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
    const done = await c.dispatch(r.operation_id);
    t.equal(done.status, 'succeeded');
    t.equal(await until(succeeded, (n) => n > before), before + 1, 'the counter moved without a reload');
    t.ok((await until(drawn, (n) => n > first)) > first, 'and the chart drew it');
    t.not(await page.locator('#latency-p50').innerText(), 'none', 'a dispatch latency');
    t.same(seen.csp, [], 'no CSP violation (uPlot included)');
    t.same(seen.unauthorized, [], 'nothing on the page answered 401 (the favicon neither)');
  });

  await t.test('the overview polls one request at a time, and not while hidden', async (t) => {
    const page = await c.signIn('op-1', '/console/approvals', DESKTOP);
    // The page's timers run on a fake clock moved by the test; the chart's JSON and the live regions' refreshes
    // are counted, and held unanswered while `hold` is set.
    const asked = { json: 0, live: 0 };
    const held: Route[] = [];
    let hold = true;
    /** The count of `kind` once it reached `n` (or the deadline passed). */
    const reached = (kind: 'json' | 'live', n: number) =>
      until(
        () => Promise.resolve(asked[kind]),
        (v) => v >= n,
      );
    const keep = async (route: Route, kind: 'json' | 'live') => {
      asked[kind] += 1;
      if (hold) held.push(route);
      else await route.continue();
    };
    await page.route(
      (u) => u.pathname === '/console/overview.json',
      (route) => keep(route, 'json'),
    );
    await page.route(
      (u) => u.pathname === '/console/overview',
      async (route, request) =>
        (await request.allHeaders())['x-console-live'] === '1' ? keep(route, 'live') : route.continue(),
    );
    await page.clock.install();
    await page.goto(`${c.base}/console/overview`);
    t.equal(await reached('json', 1), 1, 'the chart asks for its data at once');
    await page.clock.runFor(15_000);
    t.equal(await reached('live', 1), 1, 'the live regions refresh after 4 s');
    await new Promise((r) => setTimeout(r, 500)); // a request the timers started reaches the route by then
    t.same(asked, { json: 1, live: 1 }, '15 s later, while both answers are held: no second request of either');

    hold = false;
    for (const r of held.splice(0)) await r.continue();
    const drawn = await until(
      async () => page.locator('#chart').getAttribute('data-drawn'),
      (v) => v !== null,
    );
    t.not(drawn, null, 'the held answer is drawn');
    await page.clock.runFor(3_100);
    t.equal(await reached('json', 2), 2, 'and the next poll follows it');

    const setHidden = (hidden: boolean) =>
      page.evaluate(`(() => {
        Object.defineProperty(document, 'hidden', { configurable: true, get: () => ${hidden} });
        Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => '${hidden ? 'hidden' : 'visible'}' });
        document.dispatchEvent(new Event('visibilitychange'));
      })()`);
    await setHidden(true);
    const before = { ...asked };
    await page.clock.runFor(60_000);
    await new Promise((r) => setTimeout(r, 500));
    t.same(asked, before, 'a minute hidden: no request');
    await setHidden(false);
    t.equal(await reached('json', before.json + 1), before.json + 1, 'shown again: the chart reads at once');
    t.equal(await reached('live', before.live + 1), before.live + 1, 'and the live regions too');
    await page.context().close();
  });

  await t.test('after Approve the page says only what happened, money in major units', async (t) => {
    const held = await c.g.gate.call(gctx({ workflow_step_id: 'tf-1' }), 'transfer_funds', {
      to_account: 'ACC0000000001',
      amount: 9900,
    });
    t.match(held, { ok: false, error: 'approval_required' });
    const page = await c.signIn('sup-1');
    const row = page.locator('#approvals tbody tr', { hasText: 'transfer_funds' });
    t.match(await row.locator('td[data-label=Amount]').innerText(), /GBP 99\.00 \(9900 minor units\)/);
    await page.goto(`${c.base}/console/approvals/tenant-a/${held.request_id ?? ''}`);
    t.match(await page.locator('#amount').innerText(), /GBP 99\.00 \(9900 minor units\)/);
    const colour = (sel: string) => page.evaluate(`getComputedStyle(document.querySelector('${sel}')).backgroundColor`);
    t.equal(await page.locator('#approve').getAttribute('class'), 'primary', 'Approve is the primary action');
    t.not(await colour('#approve'), await colour('#reject'), 'Reject looks different');
    await page.click('#approve');
    t.equal(await page.locator('#done').innerText(), 'Approved: the operation is reserved and will be dispatched.');
    t.equal(await page.locator('main .notice').count(), 1, 'one notice: what happened');
    t.equal(await page.locator('main .notice.bad, main .notice.warn').count(), 0, 'no contradicting refusal');
    t.equal(await page.locator('#status').innerText(), 'executed');
  });

  await t.test('the menu shows what the roles open', async (t) => {
    const sup = await c.signIn('sup-1');
    const links = (p: Page) => p.locator('header nav a').allInnerTexts();
    t.same(await links(sup), ['Overview', 'Approvals', 'Operations', 'Review']);
    const op = await c.signIn('op-1');
    t.same(await links(op), ['Overview', 'Approvals', 'Operations', 'Review', 'Kill switches', 'Audit']);
  });

  await t.test('a kill switch is chosen, then confirmed with what it stops', async (t) => {
    const r = await c.g.gate.call(gctx({ workflow_step_id: 'ks-1' }), 'issue_refund', {
      order_id: 'O-3',
      amount: 10,
      currency: 'GBP',
    });
    t.match(r, { ok: true }, 'a pending operation it will hold');
    const page = await c.signIn('op-1', '/console/kill-switches');
    t.equal(await page.locator('select[name=tool]').inputValue(), '', 'no tool is chosen by default');
    await page.fill('input[name=reason]', 'refund provider incident');
    await page.click('form[action="/console/kill-switches/engage"] button');
    t.equal(new URL(page.url()).pathname, '/console/kill-switches', 'without a tool the form is not sent');
    await page.selectOption('select[name=tool]', 'issue_refund');
    await page.click('form[action="/console/kill-switches/engage"] button');
    const confirm = (await page.locator('#confirm').innerText()).replace(/\s+/g, ' ');
    t.match(confirm, /stops the tool issue_refund in the tenant tenant-a/);
    t.equal(await page.locator('#confirm-held').innerText(), '1 pending', 'the pending operations it will hold');
    t.same(await c.g.gate.killSwitches(), [], 'nothing engaged yet');
    await page.click('#confirm-engage');
    t.match(await page.locator('#done').innerText(), /kill switch is engaged/);
    t.match(await c.g.gate.killSwitches(), [{ tenant_id: 'tenant-a', tool_name: 'issue_refund' }]);
    await page.fill('#switches input[name=reason]', 'over');
    await page.click('#switches button');
    t.same(await c.g.gate.killSwitches(), [], 'lifted again');
  });

  await t.test('the audit log: a table, filtered on the server, JSON on demand', async (t) => {
    const page = await c.signIn('op-1', '/console/audit');
    const rows = page.locator('#audit tbody tr');
    t.ok((await rows.count()) > 3, 'rows');
    t.equal(await page.locator('#audit details[open]').count(), 0, 'the JSON folded');
    const height = await page.evaluate('document.documentElement.scrollHeight');
    t.ok(Number(height) < 40 * (await rows.count()) + 600, 'about one line a row', { height });
    await page.fill('input[name=action]', 'kill_switch');
    await page.click('form.filters button');
    t.match(page.url(), /[?&]action=kill_switch/, 'the filter is a query parameter');
    const actions = await page.locator('#audit td[data-label=Action]').allInnerTexts();
    t.ok(actions.length > 0 && actions.every((a) => a === 'kill_switch'), 'only those rows', { actions });
    await page.locator('#audit details summary').first().click();
    const json = await page.locator('#audit details[open] pre').innerText();
    t.type(JSON.parse(json), 'object', 'the whole JSON, on demand');
  });

  await t.test('screenshots: the overview, an approval, the review queue', async (t) => {
    const r = await c.g.gate.call(gctx({ workflow_step_id: 'rv-1' }), 'issue_refund', {
      order_id: 'O-4',
      amount: 10,
      currency: 'GBP',
    });
    if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
    await putOut(c.g, r.operation_id);
    const held = await c.g.gate.call(gctx({ workflow_step_id: 'tf-2' }), 'transfer_funds', {
      to_account: 'ACC0000000002',
      amount: 12500,
      memo: 'invoice 2026-114',
    });
    t.match(held, { ok: false, error: 'approval_required' }, 'an approval to show');
    for (const [suffix, viewport] of [
      ['', DESKTOP],
      ['-phone', PHONE],
    ] as const) {
      const page = await c.signIn('op-1', '/console/overview', viewport);
      await until(
        async () => page.locator('#chart').getAttribute('data-drawn'),
        (v) => v !== null,
      );
      await page.screenshot({ path: join(SHOTS, `console-overview${suffix}.png`), fullPage: true });
      const sup = await c.signIn('sup-1', `/console/approvals/tenant-a/${held.request_id ?? ''}`, viewport);
      await sup.screenshot({ path: join(SHOTS, `console-approval${suffix}.png`), fullPage: true });
      await page.goto(`${c.base}/console/review`);
      await page.screenshot({ path: join(SHOTS, `console-review${suffix}.png`), fullPage: true });
      t.ok(
        await page.evaluate('document.documentElement.scrollWidth <= window.innerWidth'),
        `the review queue fits ${viewport.width} px`,
      );
    }
  });
});
