/**
 * The operator console in Debian's chromium (playwright-core), against a real PostgreSQL, a real dispatcher
 * and the sandbox provider over mTLS. A person signs in with a one-time link, reads the exact stored
 * arguments and approves them; the operation is dispatched once and the page shows it succeeded. A moved
 * resource shows reapproval_required with no way to approve; hostile arguments stay text (no dialog opens);
 * the requester cannot approve their own request; a change without the CSRF token is refused; a revoked role
 * ends the session; an operation in review is retried from the queue and the provider receives it once.
 */
import t from 'tap';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { consoleEnv } from '../helpers/console.js';
import { gctx } from '../helpers/gate.js';
import { putOut } from '../helpers/review-state.js';

/**
 * Where the screenshots go: `.actionledger/screenshots/` (ignored by git) unless CONSOLE_SCREENSHOTS names a
 * folder. The pictures in docs/ come from `npm run screenshots` (console-overview-browser.test.ts).
 */
const SHOTS = process.env.CONSOLE_SCREENSHOTS ?? join('.actionledger', 'screenshots');

/** In the page: whether nothing is wider than the window, and which elements are (to say why not). */
const FITS = 'document.documentElement.scrollWidth <= window.innerWidth';
const WIDER = `[...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1).slice(0, 5).map((e) => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))`;

const HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>';
const gate = {
  tools: {
    transfer_funds: { approver_roles: ['supervisor'], approval: { mode: 'always' } },
  },
};

t.test('the console in a browser', async (t) => {
  const c = await consoleEnv(t, gate);
  await c.person('sup-1', ['supervisor']);
  await c.person('sam', ['supervisor']);
  await c.person('op-1', ['operator']);
  let dialogs = 0;

  await t.test('a second person sees the exact arguments, approves, and the operation succeeds', async (t) => {
    const held = await c.g.gate.call(
      gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'doc-1' }),
      'update_document',
      {
        document_id: 'DOC-1',
        status: 'reviewed',
      },
    );
    t.match(held, { ok: false, error: 'approval_required' });
    const page = await c.signIn('sup-1');
    page.on('dialog', (d) => {
      dialogs++;
      void d.dismiss();
    });
    t.equal(await page.locator('#approvals tbody tr').count(), 1, 'the pending approval is listed');
    await page.click('#approvals a');
    const shown = JSON.parse(await page.locator('#arguments').innerText()) as unknown;
    t.same(shown, { document_id: 'DOC-1', status: 'reviewed' }, 'the exact stored arguments');
    const view = await c.g.gate.approvals.show(held.request_id ?? '', { tenant_id: 'tenant-a' });
    t.equal(await page.locator('#hash').innerText(), view.envelope_sha256);
    await page.screenshot({ path: join(SHOTS, 'console-approval.png'), fullPage: true });
    await page.click('#approve');
    t.equal(await page.locator('#done').innerText(), 'Approved: the operation is reserved and will be dispatched.');
    const after = await c.g.gate.approvals.show(held.request_id ?? '', { tenant_id: 'tenant-a' });
    t.equal(after.status, 'executed');
    const done = await c.dispatch(after.operation_id ?? '');
    t.equal(done.status, 'succeeded');
    await page.reload();
    t.equal(await page.locator('#operation-status').innerText(), 'succeeded', 'the page shows it succeeded');
    await page.click('#operation-status >> xpath=preceding-sibling::a');
    t.equal(await page.locator('#op-status').innerText(), 'succeeded');
    t.not(await page.locator('#receipt').innerText(), 'none', 'the provider receipt');
    t.equal(await page.locator('#evidence li').count(), 1, 'the authorization evidence of its one send');
    t.match(await page.locator('#checks').innerText(), /None/, 'no readback was needed');
  });

  await t.test('a resource that moved shows reapproval_required and no approve button', async (t) => {
    await c.g.pool.query("UPDATE shop.documents SET version = 8 WHERE doc_id = 'DOC-1'");
    const held = await c.g.gate.call(
      gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'doc-2' }),
      'update_document',
      {
        document_id: 'DOC-1',
        status: 'published',
      },
    );
    await c.g.pool.query("UPDATE shop.documents SET version = 9 WHERE doc_id = 'DOC-1'");
    const page = await c.signIn('sup-1');
    await page.goto(`${c.base}/console/approvals/tenant-a/${held.request_id ?? ''}`);
    t.equal(await page.locator('#freshness').innerText(), 'reapproval_required');
    t.match(await page.locator('main').innerText(), /approved at version 8, now 9/);
    t.equal(await page.locator('#approve').count(), 0, 'approving is not offered');
  });

  await t.test('hostile arguments are text, and no dialog ever opens', async (t) => {
    const held = await c.g.gate.call(gctx({ workflow_step_id: 'xss-1' }), 'transfer_funds', {
      to_account: 'ACC0000000001',
      amount: 5,
      memo: HOSTILE,
    });
    const page = await c.signIn('sup-1');
    page.on('dialog', (d) => {
      dialogs++;
      void d.dismiss();
    });
    await page.goto(`${c.base}/console/approvals/tenant-a/${held.request_id ?? ''}`);
    t.match(await page.locator('#arguments').innerText(), HOSTILE, 'shown as the text it is');
    t.equal(await page.locator('main img, main script').count(), 0, 'no element was made from it');
    await page.goto(`${c.base}/console/audit`).catch(() => undefined);
    t.equal(dialogs, 0, 'no dialog opened');
  });

  await t.test('no self-approval; no change without the CSRF token; a revoked role ends the session', async (t) => {
    const held = await c.g.gate.call(
      gctx({ principal_id: 'sam', role: 'agent', workflow_step_id: 'self-1' }),
      'transfer_funds',
      {
        to_account: 'ACC0000000002',
        amount: 7,
      },
    );
    const url = `${c.base}/console/approvals/tenant-a/${held.request_id ?? ''}`;
    const sam = await c.signIn('sam');
    await sam.goto(url);
    t.match(await sam.locator('#self').innerText(), /self_approval_forbidden: you asked for this yourself/);
    t.equal(await sam.locator('#approve').count(), 0);

    const sup = await c.signIn('sup-1');
    await sup.goto(url);
    const hash = await sup.locator('input[name=envelope_sha256]').inputValue();
    const forged = await sup.request.post(`${url}/approve`, { form: { envelope_sha256: hash } });
    t.equal(forged.status(), 403);
    t.match(await forged.text(), /csrf_token_invalid/);
    t.equal((await c.g.gate.approvals.show(held.request_id ?? '', { tenant_id: 'tenant-a' })).status, 'pending');

    await c.store.revoke('sup-1', 'tenant-a', 'supervisor', 'test');
    const gone = await sup.goto(url);
    t.equal(gone?.status(), 401, 'the session is over');
    t.match(await sup.locator('main').innerText(), /revoked/);
  });

  await t.test('review: retried from the queue, the provider receives it once', async (t) => {
    const r = await c.g.gate.call(gctx({ workflow_step_id: 'rv-1' }), 'issue_refund', {
      order_id: 'O-2',
      amount: 10,
      currency: 'GBP',
    });
    if (!r.ok || r.operation_id === undefined || r.effect_key === undefined) throw new Error(JSON.stringify(r));
    await putOut(c.g, r.operation_id);
    const op = await c.signIn('op-1');
    await op.goto(`${c.base}/console/review`);
    t.match(await op.locator('#review h2').first().innerText(), /final_check:tool_disabled/);
    await op.screenshot({ path: join(SHOTS, 'console-review.png'), fullPage: true });
    await op.fill('#review tbody form:first-of-type input[name=reason]', 'switch lifted; never sent');
    await op.click('#review tbody form:first-of-type button');
    t.match(await op.locator('#done').innerText(), /retry: .* moved from needs_review to pending/);
    const done = await c.dispatch(r.operation_id);
    t.equal(done.status, 'succeeded');
    t.equal(c.e.provider.requestsFor(r.effect_key), 1, 'the provider counted one request');
  });

  await t.test('phone width, the keyboard alone, and a list that updates without a reload', async (t) => {
    const page = await c.signIn('sam');
    await page.setViewportSize({ width: 375, height: 740 });
    const rows = await page.locator('#approvals tbody tr').count();
    const held = await c.g.gate.call(
      gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'doc-3' }),
      'update_document',
      { document_id: 'DOC-1', status: 'reviewed' },
    );
    await page.locator('#approvals tbody tr').nth(rows).waitFor();
    t.pass('the new request appeared without a reload');
    t.ok(await page.evaluate(FITS), 'nothing is wider than a phone', {
      wider: await page.evaluate(WIDER),
      widths: await page.evaluate(
        '[document.documentElement.scrollWidth, document.documentElement.clientWidth, window.innerWidth]',
      ),
    });
    await page.goto(`${c.base}/console/approvals/tenant-a/${held.request_id ?? ''}`);
    t.ok(await page.evaluate(FITS), 'the approval fits a phone too');
    let reached = false;
    for (let i = 0; i < 80 && !reached; i++) {
      await page.keyboard.press('Tab');
      reached = (await page.evaluate("document.activeElement?.id === 'approve'")) === true;
    }
    t.ok(reached, 'the approve button is reached with Tab');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#done');
    t.equal(await page.locator('#done').innerText(), 'Approved: the operation is reserved and will be dispatched.');
  });
  t.equal(dialogs, 0);
  for (const shot of ['console-approval.png', 'console-review.png'])
    t.ok(statSync(join(SHOTS, shot)).size > 10_000, `${shot} saved`);
});
