/**
 * The console's sign-in, sessions and state changes over real HTTP(S) and a real PostgreSQL, without a
 * browser: a sign-in link starts one session even when raced; the cookie's attributes (Secure over TLS); the
 * strict CSP and pages with no inline script or style; sessions that expire, sign out and die with a role
 * revocation; CSRF refusals (no token, a wrong one, another site's request, a repeated field) that change
 * nothing; the trusted-header mode believed only from configured proxies; rejections that need a reason; a
 * role that cannot decide, explained; another tenant's approval as absent; kill switches on configured tools
 * only; a bulk retry that retries only the safe operations; the operations' time filter.
 */
import t, { type Test } from 'tap';
import { Agent, fetch as undiciFetch } from 'undici';
import type { ProviderContact } from '../../ledger/index.js';
import { buildApi } from '../../server/api/app.js';
import { LOGIN_LINK_COMMAND } from '../../server/console/plugin.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { gctx } from '../helpers/gate.js';
import { FORM, get, person, post, redeem, sessions, signIn } from '../helpers/console-http.js';
import { testPki } from '../helpers/sandbox.js';
import { putOut } from '../helpers/review-state.js';

async function waitingRefund(f: ApiFixture, step: string): Promise<string> {
  const r = await f.gate.call(gctx({ workflow_step_id: step }), 'issue_refund', {
    order_id: 'O-1',
    amount: 900,
    currency: 'GBP',
  });
  if (r.ok || r.request_id === undefined) throw new Error(JSON.stringify(r));
  return r.request_id;
}

const refundCap = { tools: { issue_refund: { limits: { per_conversation: { max_count: 10, max_value: 5000 } } } } };

async function setup(t: Test, api: Record<string, unknown> = {}) {
  const f = await apiFixture(t, { gate: refundCap, api });
  await person(f, 'sup-1', ['supervisor']);
  await person(f, 'aud-1', ['auditor']);
  await person(f, 'op-1', ['operator']);
  return f;
}

t.test('a sign-in link starts one session, once, even when raced', async (t) => {
  const f = await setup(t);
  const link = await sessions(f).createLoginLink('sup-1', 'test');
  const shown = await get(f, `/console/login?link=${link.secret}`);
  t.equal(shown.status, 200, 'opening the link only shows a button');
  const bare = await (await get(f, '/console/login')).text();
  t.ok(bare.includes(`<code>${LOGIN_LINK_COMMAND}</code>`), 'without a link: the command that makes one, as it runs');
  const raced = await Promise.all(Array.from({ length: 6 }, () => redeem(f, link.secret)));
  t.same(
    raced.map((r) => r.status).sort(),
    [303, 401, 401, 401, 401, 401],
    'one browser signs in, the others are refused',
  );
  const loser = raced.find((r) => r.status === 401);
  t.match(await loser?.text(), /used already/);
  const { rows } = await f.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.console_sessions');
  t.equal(rows[0]?.n, 1, 'one session');

  const old = await sessions(f).createLoginLink('sup-1', 'test');
  await f.pool.query(
    "UPDATE actionledger.console_login_links SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE link_id = $1",
    [old.link_id],
  );
  const expired = await redeem(f, old.secret);
  t.equal(expired.status, 401);
  t.match(await expired.text(), /expired/);
  t.equal((await redeem(f, 'not-a-link')).status, 401, 'a malformed link');
  await t.rejects(sessions(f).createLoginLink('nobody', 'test'), { code: 'not_found' });
  await f.store.add('roleless', 'person', 'roleless', 'test');
  await t.rejects(sessions(f).createLoginLink('roleless', 'test'), { code: 'permission_denied' });
});

t.test('the cookie, the CSP, and pages with no inline script or style', async (t) => {
  const f = await setup(t);
  const link = await sessions(f).createLoginLink('op-1', 'test');
  const res = await redeem(f, link.secret);
  const cookie = res.headers.get('set-cookie') ?? '';
  t.match(cookie, /^al_console=[A-Za-z0-9_-]{43}; Path=\/console; HttpOnly; SameSite=Strict; Max-Age=\d+$/);
  t.notMatch(cookie, /Secure/, 'plain HTTP on loopback: not Secure');
  const jar = cookie.split(';')[0] ?? '';
  for (const path of [
    '/console/approvals',
    '/console/operations',
    '/console/review',
    '/console/kill-switches',
    '/console/audit',
  ]) {
    const page = await get(f, path, jar);
    t.equal(page.status, 200, path);
    const csp = page.headers.get('content-security-policy') ?? '';
    t.match(csp, /default-src 'self'/, `${path}: CSP`);
    t.notMatch(csp, /unsafe-inline|unsafe-eval/, `${path}: nothing inline allowed`);
    t.equal(page.headers.get('x-content-type-options'), 'nosniff');
    const body = await page.text();
    t.notMatch(body, /<script(?![^>]*\ssrc=)[^>]*>/, `${path}: every script has a src`);
    t.notMatch(body, /<style|\sstyle=|\son[a-z]+=/i, `${path}: no inline style or handler`);
  }
  t.equal((await get(f, '/console/static/console.js')).headers.get('content-type'), 'text/javascript; charset=utf-8');
  t.equal((await get(f, '/console/approvals')).status, 401, 'no cookie: not signed in');

  // Over TLS the cookie is Secure.
  const pki = await testPki();
  const tls = await buildApi(f.deps, { https: { cert: pki.server.cert, key: pki.server.key } });
  await tls.app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => tls.app.close());
  const address = tls.app.server.address();
  const port = address !== null && typeof address === 'object' ? address.port : 0;
  const agent = new Agent({ connect: { ca: pki.ca.cert } });
  t.teardown(() => agent.close());
  const link2 = await sessions(f).createLoginLink('op-1', 'test');
  const secure = await undiciFetch(`https://localhost:${port}/console/login`, {
    method: 'POST',
    headers: FORM,
    body: `link=${link2.secret}`,
    redirect: 'manual',
    dispatcher: agent,
  });
  t.equal(secure.status, 303);
  t.match(secure.headers.get('set-cookie') ?? '', /; HttpOnly; SameSite=Strict; Max-Age=\d+; Secure$/);
  t.match(
    secure.headers.get('set-cookie') ?? '',
    /^__Host-al_console=[A-Za-z0-9_-]{43}; Path=\/;/,
    'over TLS the name carries the __Host- prefix, whose rules (Secure, Path=/, no Domain) it follows',
  );
});

t.test('a new sign-in in a browser ends the session that browser had', async (t) => {
  const f = await setup(t);
  const first = await signIn(f, 'sup-1');
  const link = await sessions(f).createLoginLink('sup-1', 'test');
  const again = await fetch(`${f.base}/console/login`, {
    method: 'POST',
    headers: { ...FORM, cookie: first.cookie },
    body: `link=${link.secret}`,
    redirect: 'manual',
  });
  t.equal(again.status, 303);
  const cookie = (again.headers.get('set-cookie') ?? '').split(';')[0] ?? '';
  t.equal((await get(f, '/console/approvals', cookie)).status, 200, 'the new session works');
  const old = await get(f, '/console/approvals', first.cookie);
  t.equal(old.status, 401, 'the old one has ended');
  t.match(await old.text(), /ended/);
});

t.test('sessions expire, sign out, and end with a role revocation', async (t) => {
  const f = await setup(t);
  const a = await signIn(f, 'sup-1');
  t.equal((await get(f, '/console/approvals', a.cookie)).status, 200);
  await f.pool.query(
    "UPDATE actionledger.console_sessions SET created_at = now() - interval '9 hours', expires_at = now() - interval '1 hour'",
  );
  const expired = await get(f, '/console/approvals', a.cookie);
  t.equal(expired.status, 401);
  t.match(expired.headers.get('set-cookie') ?? '', /Max-Age=0/, 'the cookie is cleared');
  t.match(await expired.text(), /expired/);

  const b = await signIn(f, 'sup-1');
  const noToken = await post(f, '/console/logout', b, {});
  t.equal(noToken.status, 403, 'signing out is a state change too');
  t.equal((await get(f, '/console/approvals', b.cookie)).status, 200, 'and it did not sign out');
  t.equal((await post(f, '/console/logout', b, { csrf: b.csrf })).status, 200);
  const after = await get(f, '/console/approvals', b.cookie);
  t.equal(after.status, 401);
  t.match(await after.text(), /ended/);

  const c = await signIn(f, 'sup-1');
  await f.store.revoke('sup-1', 'tenant-a', 'supervisor', 'security');
  const revoked = await get(f, '/console/approvals', c.cookie);
  t.equal(revoked.status, 401);
  t.match(await revoked.text(), /revoked/);
  const { rows } = await f.pool.query<{ ended_reason: string }>(
    'SELECT ended_reason FROM actionledger.console_sessions ORDER BY created_at',
  );
  t.same(
    rows.map((r) => r.ended_reason),
    ['expired', 'signed_out', 'role_revoked'],
  );
});

t.test('CSRF: no token, a wrong one, another site, a repeated field: refused, nothing changed', async (t) => {
  const f = await setup(t);
  const id = await waitingRefund(f, 'csrf-1');
  const s = await signIn(f, 'sup-1');
  const path = `/console/approvals/tenant-a/${id}/reject`;
  const cases: [string, Record<string, string>, Record<string, string>, number, RegExp][] = [
    ['no token', { reason: 'no' }, {}, 403, /csrf_token_invalid/],
    ['a wrong token', { reason: 'no', csrf: 'x'.repeat(43) }, {}, 403, /csrf_token_invalid/],
    ['another origin', { reason: 'no', csrf: s.csrf }, { origin: 'http://evil.example' }, 403, /csrf_token_invalid/],
    [
      'a cross-site fetch',
      { reason: 'no', csrf: s.csrf },
      { 'sec-fetch-site': 'cross-site' },
      403,
      /csrf_token_invalid/,
    ],
  ];
  for (const [what, fields, headers, status, body] of cases) {
    const r = await post(f, path, s, fields, headers);
    t.equal(r.status, status, what);
    t.match(await r.text(), body, what);
  }
  const repeated = await fetch(`${f.base}${path}`, {
    method: 'POST',
    headers: { ...FORM, cookie: s.cookie },
    body: `csrf=${s.csrf}&reason=a&reason=b`,
    redirect: 'manual',
  });
  t.equal(repeated.status, 422, 'a repeated field');
  const json = await fetch(`${f.base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', cookie: s.cookie },
    body: JSON.stringify({ csrf: s.csrf, reason: 'no' }),
    redirect: 'manual',
  });
  t.equal(json.status, 415, 'the console takes forms only');
  const { rows } = await f.pool.query<{ status: string }>(
    'SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1',
    [id],
  );
  t.equal(rows[0]?.status, 'pending', 'nothing changed');
});

t.test('the trusted header is believed only from a configured proxy', async (t) => {
  const header = 'x-remote-user';
  const trusted = await setup(t, { console: { trusted_header: { name: header, proxies: ['127.0.0.1'] } } });
  const ok = await get(trusted, '/console/approvals', undefined, { [header]: 'sup-1' });
  t.equal(ok.status, 200);
  t.match(await ok.text(), /Signed in as <strong>sup-1<\/strong>/);
  t.match(ok.headers.get('set-cookie') ?? '', /HttpOnly; SameSite=Strict/);
  t.equal((await get(trusted, '/console/approvals', undefined, { [header]: 'nobody' })).status, 401, 'unknown');

  const elsewhere = await setup(t, { console: { trusted_header: { name: header, proxies: ['10.9.8.7'] } } });
  const refused = await get(elsewhere, '/console/approvals', undefined, { [header]: 'sup-1' });
  t.equal(refused.status, 401, 'from a peer that is not a proxy the header is ignored');
  const { rows } = await elsewhere.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM actionledger.console_sessions',
  );
  t.equal(rows[0]?.n, 0, 'and no session was started');
});

t.test('decisions: a reason to reject, a role that cannot decide explained, another tenant absent', async (t) => {
  const f = await setup(t);
  await person(f, 'sup-b', ['supervisor'], 'tenant-b');
  const id = await waitingRefund(f, 'dec-1');
  const held = await f.gate.call(
    gctx({ tenant_id: 'tenant-b', principal_id: 'admin-1', role: 'admin', workflow_step_id: 'dec-b' }),
    'delete_customer',
    { customer_id: 'C-1' },
  );
  const other = held.request_id ?? '';
  t.match(held, { ok: false, error: 'approval_required' });
  const sup = await signIn(f, 'sup-1');
  const empty = await post(f, `/console/approvals/tenant-a/${id}/reject`, sup, { csrf: sup.csrf, reason: '  ' });
  t.equal(empty.status, 422, 'a rejection needs a reason');
  const auditor = await signIn(f, 'aud-1');
  const seen = await get(f, `/console/approvals/tenant-a/${id}`, auditor.cookie);
  const text = (await seen.text()).replace(/\s+/g, ' ');
  t.match(
    text,
    /permission_denied<\/span>: your roles in tenant-a \(auditor\) may not decide issue_refund; it needs one of: supervisor/,
  );
  t.notMatch(text, /id="approve"/, 'no approve button for a role that cannot decide');
  const byAuditor = await post(f, `/console/approvals/tenant-a/${id}/reject`, auditor, {
    csrf: auditor.csrf,
    reason: 'x',
  });
  t.equal(byAuditor.status, 403);
  t.equal((await get(f, `/console/approvals/tenant-a/${other}`, sup.cookie)).status, 404, 'another tenant’s id');
  t.equal((await get(f, `/console/approvals/tenant-b/${other}`, sup.cookie)).status, 404, 'a tenant not held');
  const rejected = await post(f, `/console/approvals/tenant-a/${id}/reject`, sup, {
    csrf: sup.csrf,
    reason: 'the order was already refunded by phone',
  });
  t.equal(rejected.status, 303);
  const { rows } = await f.pool.query<{ status: string; reason: string }>(
    'SELECT status, reason FROM actionledger.gate_approvals WHERE approval_id = $1',
    [id],
  );
  t.same(rows[0], { status: 'rejected', reason: 'the order was already refunded by phone' });
  const audit = await f.pool.query<{ principal_id: string; outcome: string }>(
    "SELECT principal_id, outcome FROM actionledger.gate_audit WHERE action = 'reject' AND subject_id = $1",
    [id],
  );
  t.same(audit.rows, [{ principal_id: 'sup-1', outcome: 'rejected' }], 'decided by the signed-in person');
});

t.test('an approval page shows the gate’s blockers, each as its code and text, and no approve button', async (t) => {
  const f = await setup(t);
  const id = await waitingRefund(f, 'blk-1');
  const sup = await signIn(f, 'sup-1');
  const page = async () =>
    (await (await get(f, `/console/approvals/tenant-a/${id}`, sup.cookie)).text()).replace(/\s+/g, ' ');
  t.match(await page(), /id="approve"/, 'nothing in the way: the approve button is offered');
  await f.gate.engageKillSwitch('tenant-a', 'issue_refund', 'op-1', 'incident 9');
  const switched = await page();
  t.match(switched, /id="freshness">tool_disabled<\/span>: a kill switch holds issue_refund \(incident 9\)\./);
  t.notMatch(switched, /id="approve"/);
  await f.gate.liftKillSwitch('tenant-a', 'issue_refund', 'op-1');
  await f.pool.query(
    `UPDATE actionledger.gate_approvals SET envelope_json = jsonb_set(envelope_json, '{effect}', '"other"')
     WHERE approval_id = $1`,
    [id],
  );
  const tampered = await page();
  t.match(
    tampered,
    /approval_hash_mismatch<\/span>: the stored envelope does not hash to its recorded sha256; it cannot be approved\./,
  );
  t.notMatch(tampered, /id="approve"/);
  const blockers = await f.gate.approvals.blockers(id, {
    tenant_id: 'tenant-a',
    principal_id: 'sup-1',
    roles: ['supervisor'],
  });
  t.same(
    blockers.map((b) => b.code),
    ['approval_hash_mismatch'],
    'the page shows exactly what the gate says',
  );
});

t.test(
  'an approved approval a kill switch holds says why it has not run; a done= its state does not bear out is not shown',
  async (t) => {
    const f = await setup(t);
    const id = await waitingRefund(f, 'held-1');
    const path = `/console/approvals/tenant-a/${id}`;
    const sup = await signIn(f, 'sup-1');
    const page = async (query = '') =>
      (await (await get(f, `${path}${query}`, sup.cookie)).text()).replace(/\s+/g, ' ');
    const hash = /name="envelope_sha256" value="([0-9a-f]{64})"/.exec(await page())?.[1] ?? '';
    const pending = await page('?done=reserved');
    t.notMatch(pending, /id="done"/, 'a pending approval shows no "Approved" notice, whatever the link says');
    t.notMatch(await page('?done=rejected'), /id="done"/);
    await f.gate.engageKillSwitch('tenant-a', 'issue_refund', 'op-1', 'incident 9');
    // The vote the page no longer offers, sent anyway (an old tab): counted, and the execution refused.
    const res = await post(f, `${path}/approve`, sup, { csrf: sup.csrf, envelope_sha256: hash });
    const refused = (await res.text()).replace(/\s+/g, ' ');
    t.equal(res.status, 422);
    t.equal(refused.match(/tool_disabled/g)?.length, 1, 'the refusal is said once, not again as a blocker');
    const later = await page();
    t.match(later, /<dd id="status">approved<\/dd>/);
    t.match(later, /tool_disabled<\/span>: a kill switch holds issue_refund \(incident 9\)/, 'and why it has not run');
    t.notMatch(later, /self_approval_forbidden|permission_denied/, 'nothing about votes: nobody votes on it any more');
    t.notMatch(await page('?done=reserved'), /id="done"/, 'an approved, unexecuted approval is not "reserved"');
    t.notMatch(later, /id="approve"/);
    await f.gate.liftKillSwitch('tenant-a', 'issue_refund', 'op-1');
    t.match(await page(), /this approval is approved already; it waits to be executed/);
  },
);

t.test('kill switches: configured tools only, engaged and lifted with reasons', async (t) => {
  const f = await setup(t);
  const op = await signIn(f, 'op-1');
  const page = await (await get(f, '/console/kill-switches', op.cookie)).text();
  t.match(page, /<select name="tool" required>/, 'the tool is picked from a list');
  t.match(
    page,
    /<option value="" selected disabled>Choose the tool to stop<\/option>/,
    'no tool is picked by default (not every tool)',
  );
  const typo = await post(f, '/console/kill-switches/engage', op, {
    csrf: op.csrf,
    tenant: 'tenant-a',
    tool: 'isue_refund',
    reason: 'typo',
  });
  t.equal(typo.status, 422);
  t.match(await typo.text(), /unknown_tool/);
  t.same(await f.gate.killSwitches(), [], 'a misspelt tool engages nothing');
  const noReason = await post(f, '/console/kill-switches/engage', op, {
    csrf: op.csrf,
    tenant: 'tenant-a',
    tool: 'issue_refund',
    reason: '',
  });
  t.equal(noReason.status, 422);
  const noList = await post(f, '/console/review/tenant-a/bulk-retry', op, {
    csrf: op.csrf,
    review_reason: 'final_check:tool_disabled',
    reason: 'a form that does not say what it showed',
  });
  t.equal(noList.status, 422, 'a bulk retry that names no shown operation is refused');
  const small = await f.gate.call(gctx({ workflow_step_id: 'ks-1' }), 'issue_refund', {
    order_id: 'O-3',
    amount: 10,
    currency: 'GBP',
  });
  t.match(small, { ok: true }, 'a pending operation the switch will hold');
  const asked = await post(f, '/console/kill-switches/engage', op, {
    csrf: op.csrf,
    tenant: 'tenant-a',
    tool: 'issue_refund',
    reason: 'refund provider incident',
  });
  t.equal(asked.status, 200, 'the first post only asks for a confirmation');
  const confirmation = (await asked.text()).replace(/\s+/g, ' ');
  t.match(confirmation, /stops the tool <strong>issue_refund<\/strong> in the tenant <strong>tenant-a<\/strong>/);
  t.match(confirmation, /<strong id="confirm-held">1 pending<\/strong>/, 'how many pending operations it will hold');
  t.same(await f.gate.killSwitches(), [], 'nothing is engaged before the confirmation');
  const engaged = await post(f, '/console/kill-switches/engage', op, {
    csrf: op.csrf,
    tenant: 'tenant-a',
    tool: 'issue_refund',
    reason: 'refund provider incident',
    confirm: 'yes',
  });
  t.equal(engaged.status, 303);
  t.match(await f.gate.killSwitches(), [{ tenant_id: 'tenant-a', tool_name: 'issue_refund', engaged_by: 'op-1' }]);
  const listed = (await (await get(f, '/console/kill-switches', op.cookie)).text()).replace(/\s+/g, ' ');
  t.match(listed, /refund provider incident/);
  t.match(listed, /data-label="Holds">1 pending</, 'what the switch holds');
  const lifted = await post(f, '/console/kill-switches/lift', op, {
    csrf: op.csrf,
    tenant: 'tenant-a',
    tool: 'issue_refund',
    reason: 'incident over',
  });
  t.equal(lifted.status, 303);
  t.same(await f.gate.killSwitches(), []);
  const { rows } = await f.pool.query<{ outcome: string; detail: { reason?: string } }>(
    "SELECT outcome, detail FROM actionledger.gate_audit WHERE action = 'kill_switch' ORDER BY id",
  );
  t.same(
    rows.map((r) => [r.outcome, r.detail.reason]),
    [
      ['engaged', 'refund provider incident'],
      ['lifted', undefined],
      ['lift_reason', 'incident over'],
    ],
  );
  const sup = await signIn(f, 'sup-1');
  t.equal((await get(f, '/console/kill-switches', sup.cookie)).status, 403, 'a role without kill_switch');
});

async function inReview(f: ApiFixture, step: string, contact: ProviderContact): Promise<string> {
  const r = await f.gate.call(gctx({ workflow_step_id: step }), 'transfer_funds', {
    to_account: 'ACC0000000001',
    amount: 10,
  });
  if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
  await putOut(f, r.operation_id, { contact });
  return r.operation_id;
}

t.test('a bulk retry retries the safe operations of one reason and leaves the rest', async (t) => {
  const f = await setup(t);
  const safe1 = await inReview(f, 'b-1', 'not_called');
  const safe2 = await inReview(f, 'b-2', 'no_effect_confirmed');
  const unsafe = await inReview(f, 'b-3', 'maybe_called');
  const op = await signIn(f, 'op-1');
  const queue = await (await get(f, '/console/review', op.cookie)).text();
  t.match(queue, /Retry every safe one with this reason \(2\)/);
  t.equal((queue.match(/>Retry<\/button>/g) ?? []).length, 2, 'retry offered only where safe');
  // The form's hidden list of the operations the page showed, sent as the browser would send it.
  const operations = /name="operations"\s+value="([^"]*)"/.exec(queue)?.[1] ?? '';
  const r = await post(f, '/console/review/tenant-a/bulk-retry', op, {
    csrf: op.csrf,
    review_reason: 'final_check:tool_disabled',
    operations,
    reason: 'the switch was lifted; none of these reached the provider',
  });
  t.equal(r.status, 303);
  t.equal(r.headers.get('location'), '/console/review?tenant=tenant-a&done=bulk_retried', 'a fixed notice code');
  t.match(await (await get(f, r.headers.get('location') ?? '', op.cookie)).text(), /id="done">Bulk retry: /);
  const { rows } = await f.pool.query<{ operation_id: string; status: string }>(
    'SELECT operation_id, status FROM actionledger.operations WHERE operation_id = ANY($1) ORDER BY operation_id',
    [[safe1, safe2, unsafe]],
  );
  t.same(Object.fromEntries(rows.map((x) => [x.operation_id, x.status])), {
    [safe1]: 'pending',
    [safe2]: 'pending',
    [unsafe]: 'needs_review',
  });
  const noReason = await post(f, '/console/review/tenant-a/bulk-retry', op, {
    csrf: op.csrf,
    review_reason: 'final_check:tool_disabled',
    reason: '',
  });
  t.equal(noReason.status, 422);
  const noList = await post(f, '/console/review/tenant-a/bulk-retry', op, {
    csrf: op.csrf,
    review_reason: 'final_check:tool_disabled',
    reason: 'a form that does not say what it showed',
  });
  t.equal(noList.status, 422, 'a bulk retry that names no shown operation is refused');
});

t.test('operations filter by reservation time', async (t) => {
  const f = await setup(t);
  const before = new Date(Date.now() - 60_000).toISOString().slice(0, 16);
  const after = new Date(Date.now() + 3_600_000).toISOString().slice(0, 16);
  await inReview(f, 't-1', 'not_called');
  const op = await signIn(f, 'op-1');
  const count = async (query: string) =>
    ((await (await get(f, `/console/operations?${query}`, op.cookie)).text()).match(/data-label="Reserved"/g) ?? [])
      .length;
  t.equal(await count(''), 1);
  t.equal(await count(`since=${before}`), 1, 'reserved since a minute ago');
  t.equal(await count(`since=${after}`), 0, 'nothing reserved in the future');
  t.equal(await count(`before=${after}`), 1);
  t.equal(await count(`before=${before}`), 0, 'nothing reserved before a minute ago');
  t.equal((await get(f, '/console/operations?since=yesterday', op.cookie)).status, 422);
});
