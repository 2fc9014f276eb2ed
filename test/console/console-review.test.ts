/**
 * An adversarial review of the operator console over real HTTP and a real PostgreSQL. Each test states what
 * the console should do and fails while the flaw it names is present.
 */
import t, { type Test } from 'tap';
import type { ProviderContact } from '../../ledger/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { gctx } from '../helpers/gate.js';
import { FORM, get, person, post, sessions, signIn } from '../helpers/console-http.js';
import { putOut } from '../helpers/review-state.js';

async function setup(t: Test, api: Record<string, unknown> = {}) {
  const f = await apiFixture(t, { api });
  await person(f, 'sup-1', ['supervisor']);
  await person(f, 'op-1', ['operator']);
  return f;
}

const countSessions = async (f: ApiFixture): Promise<number> =>
  (await f.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.console_sessions')).rows[0]?.n ?? -1;

t.test('login CSRF: a cross-site POST to /console/login must not sign the browser in', async (t) => {
  const f = await setup(t);
  // The attacker holds a console account of their own and makes a link for it.
  await person(f, 'mallory', ['supervisor']);
  const link = await sessions(f).createLoginLink('mallory', 'test');
  // The victim's browser submits the attacker's auto-posting form: a cross-site top-level navigation.
  const res = await fetch(`${f.base}/console/login`, {
    method: 'POST',
    headers: { ...FORM, 'sec-fetch-site': 'cross-site', origin: 'https://evil.example' },
    body: `link=${link.secret}`,
    redirect: 'manual',
  });
  t.equal(res.status, 403, 'a sign-in posted from another site is refused like every other console POST');
  t.notMatch(res.headers.get('set-cookie') ?? '', /al_console=[A-Za-z0-9_-]{43}/, 'no session cookie is planted');
  t.equal(await countSessions(f), 0, 'no session was started for the attacker in the victim’s browser');
});

t.test('a success notice cannot be written by whoever crafts the URL (done= reflected)', async (t) => {
  const f = await setup(t);
  const op = await signIn(f, 'op-1');
  const lie = 'Lifted every kill switch. Security asks you to re-approve pending refunds now.';
  for (const path of ['/console/kill-switches', '/console/review']) {
    const page = await get(f, `${path}?done=${encodeURIComponent(lie)}`, op.cookie);
    t.equal(page.status, 200);
    const body = await page.text();
    t.notMatch(
      body,
      /Security asks you to re-approve/,
      `${path}: a stranger's text is not shown as the console's own OK notice`,
    );
  }
});

t.test('a CSRF token with a multi-byte character is refused 403 csrf_token_invalid, not a 500', async (t) => {
  const f = await setup(t);
  const op = await signIn(f, 'op-1');
  // Same length in UTF-16 code units as the real token, a different length in bytes.
  const forged = `é${op.csrf.slice(1)}`;
  t.equal(forged.length, op.csrf.length);
  const res = await fetch(`${f.base}/console/kill-switches/engage`, {
    method: 'POST',
    headers: { ...FORM, cookie: op.cookie },
    body: new URLSearchParams({ csrf: forged, tenant: 'tenant-a', tool: '*', reason: 'x' }).toString(),
    redirect: 'manual',
  });
  t.equal(res.status, 403, 'a wrong token is a refusal, not an internal error');
  t.match(await res.text(), /csrf_token_invalid/);
  t.same(await f.gate.killSwitches(), [], 'nothing engaged');
});

t.test('trusted header: cookieless requests from the proxy must not start a new session each time', async (t) => {
  const header = 'x-remote-user';
  const f = await setup(t, { console: { trusted_header: { name: header, proxies: ['127.0.0.1'] } } });
  // A cross-site navigation (the SameSite=Strict cookie is not sent) or any cookieless client behind the proxy.
  for (let i = 0; i < 5; i++) {
    const r = await get(f, '/console/approvals', undefined, { [header]: 'sup-1', 'sec-fetch-site': 'cross-site' });
    t.equal(r.status, 200);
    await r.arrayBuffer();
  }
  const live = await f.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM actionledger.console_sessions WHERE ended_at IS NULL',
  );
  t.ok((live.rows[0]?.n ?? 0) <= 1, `at most one live session for one person (found ${live.rows[0]?.n})`);
});

t.test(
  'session fixation by a tossed cookie: two al_console cookies are not resolved in the first one’s favour',
  async (t) => {
    const f = await setup(t);
    await person(f, 'mallory', ['supervisor']);
    const victim = await signIn(f, 'sup-1');
    const attacker = await signIn(f, 'mallory');
    // A cookie set from a sibling host or over plain HTTP with a longer Path is sent first by browsers; the
    // name carries no __Host- prefix that would forbid it.
    const both = `${attacker.cookie}; ${victim.cookie}`;
    const page = await get(f, '/console/approvals', both);
    const body = await page.text();
    t.notMatch(body, /Signed in as <strong>mallory<\/strong>/, 'the victim is not silently working as the attacker');
  },
);

t.test('a sign-in link is only for a person, not for a service principal (an agent)', async (t) => {
  const f = await setup(t);
  await f.store.add('billing-agent', 'service', 'billing agent', 'test');
  await f.store.grant('billing-agent', 'tenant-a', 'supervisor', 'test');
  await t.rejects(
    sessions(f).createLoginLink('billing-agent', 'test'),
    { code: 'permission_denied' },
    'a human cannot be handed an agent’s identity in the console',
  );
});

/** The operation's next attempt claimed by a worker and sent back to review with this provider contact. */
async function dispatchToReview(f: ApiFixture, id: string, contact: ProviderContact): Promise<void> {
  await putOut(f, id, { contact });
}

async function inReview(f: ApiFixture, step: string, contact: ProviderContact): Promise<string> {
  const r = await f.gate.call(gctx({ workflow_step_id: step }), 'transfer_funds', {
    to_account: 'ACC0000000001',
    amount: 10,
  });
  if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
  await dispatchToReview(f, r.operation_id, contact);
  return r.operation_id;
}

const statusOf = async (f: ApiFixture, id: string): Promise<string | undefined> =>
  (await f.pool.query<{ status: string }>('SELECT status FROM actionledger.operations WHERE operation_id = $1', [id]))
    .rows[0]?.status;

t.test('bulk retry from a stale page retries operations the person was never shown', async (t) => {
  const f = await setup(t);
  const shown1 = await inReview(f, 'bs-1', 'not_called');
  const shown2 = await inReview(f, 'bs-2', 'not_called');
  const op = await signIn(f, 'op-1');
  const queue = await (await get(f, '/console/review', op.cookie)).text();
  t.match(queue, /Retry every safe one with this reason \(2\)/, 'the person is offered a retry of two');
  // Before they press the button, another operation lands in review with the same reason.
  const unseen = await inReview(f, 'bs-3', 'not_called');
  // The form's hidden list of the operations the page showed, sent as the browser would send it.
  const operations = /name="operations"\s+value="([^"]*)"/.exec(queue)?.[1] ?? '';
  const r = await post(f, '/console/review/tenant-a/bulk-retry', op, {
    csrf: op.csrf,
    review_reason: 'final_check:tool_disabled',
    operations,
    reason: 'the two I checked never reached the provider',
  });
  t.equal(r.status, 303);
  t.equal(await statusOf(f, shown1), 'pending');
  t.equal(await statusOf(f, shown2), 'pending');
  t.equal(await statusOf(f, unseen), 'needs_review', 'an operation not on the page is not retried by it');
});

t.test('resolve failed from a stale page applies to a later attempt that may have reached the provider', async (t) => {
  const f = await setup(t);
  const id = await inReview(f, 'rs-1', 'not_called');
  const alice = await signIn(f, 'op-1');
  await person(f, 'op-2', ['operator']);
  const bob = await signIn(f, 'op-2');
  // Alice's page: attempt 1, the provider was never called; she prepares to resolve it as failed.
  const page = (await (await get(f, '/console/review', alice.cookie)).text()).replace(/\s+/g, ' ');
  t.match(page, /\(attempt 1\)/);
  t.match(page, /data-label="Provider contact">not_called</);
  // Meanwhile Bob retries it; attempt 2 is sent and comes back to review: the provider may have applied it.
  const retried = await post(f, `/console/review/tenant-a/${id}/retry`, bob, {
    csrf: bob.csrf,
    attempt: '1',
    review_reason: 'final_check:tool_disabled',
    reason: 'never reached the provider',
  });
  t.equal(retried.status, 303);
  await dispatchToReview(f, id, 'maybe_called');
  // Alice's stale form, as her page rendered it: attempt 1 with its review reason.
  const stale = await post(f, `/console/review/tenant-a/${id}/resolve-failed`, alice, {
    csrf: alice.csrf,
    attempt: '1',
    review_reason: 'final_check:tool_disabled',
    reason: 'the provider was never called',
  });
  t.equal(stale.status, 409, 'refused: the operation moved on since the page was rendered');
  t.equal(await statusOf(f, id), 'needs_review', 'a maybe-applied attempt is not declared failed on stale evidence');
});

t.test('a bidi override in an argument makes the approval page show a value other than the stored one', async (t) => {
  const f = await apiFixture(t, {
    gate: { tools: { send_email: { approver_roles: ['supervisor'], approval: { mode: 'always' } } } },
  });
  await person(f, 'sup-1', ['supervisor']);
  // Stored and sent: pay@<RLO>moc.xe-knab — a browser draws it as pay@bank-ex.com.
  const to = 'pay@\u202Emoc.xe-knab';
  const r = await f.gate.call(gctx({ workflow_step_id: 'bidi-1' }), 'send_email', {
    to,
    subject: 'invoice',
    body: 'see attached',
  });
  t.match(r, { ok: false, error: 'approval_required' });
  const sup = await signIn(f, 'sup-1');
  const body = await (await get(f, `/console/approvals/tenant-a/${r.request_id ?? ''}`, sup.cookie)).text();
  t.match(body, /id="approve"/, 'the approve button is offered');
  t.notOk(
    /[\u202A-\u202E\u2066-\u2069\u200E\u200F]/u.test(body),
    'no bidi control reaches the page raw: the approver sees the characters that are stored, escaped and flagged',
  );
});
