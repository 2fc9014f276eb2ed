/**
 * The dispatcher's pre-dispatch refusals, each through a real Dispatcher (openDispatcher, real PostgreSQL, the
 * sandbox provider and authorizer over mTLS): the operation ends needs_review with `${stage}:${code}`, the
 * refusal is counted, and the provider never receives a POST. A failure that decided nothing (no authorization
 * decision came, the provider's TLS handshake failed) first releases the operation to the queue as often as the
 * release limit allows, each release in its history. Each group also dispatches one unchanged
 * operation first, so a refusal cannot come from a broken environment.
 */
import t, { type Test } from 'tap';
import { canonicalJson, sha256Hex } from '../../core/json.js';
import { issueServerCert, SandboxAuthorizer, SandboxProvider, type PemPair } from '../../sandbox/index.js';
import { ctx, settled } from '../helpers/fleet.js';
import {
  predispatchEnv,
  PREDISPATCH_RELEASE_LIMIT,
  PREDISPATCH_TOKEN,
  type OpenedDispatcher,
  type OpenOptions,
  type PredispatchEnv,
  type RawTools,
} from '../helpers/predispatch-env.js';

const REFUSALS = 'actionledger_predispatch_refusals_total';
const OUTCOMES = 'actionledger_dispatch_outcomes_total';
const args = { order_id: 'ord-1', amount: 1250, currency: 'EUR' };

interface Reserved {
  operation_id: string;
  effect_key: string;
}

const posts = (p: SandboxProvider): number => p.requests().filter((q) => q.method === 'POST').length;

/** Opens a dispatcher under `options`, waits until `r` settles, hands the row to `check`, stops the dispatcher. */
async function dispatchOnce(
  e: PredispatchEnv,
  options: OpenOptions,
  r: Reserved,
  check: (d: OpenedDispatcher, row: Awaited<ReturnType<typeof settled>>) => Promise<void>,
): Promise<void> {
  const d = await e.open(options);
  try {
    await check(d, await settled(e.pool, r.operation_id));
  } finally {
    await d.stop();
  }
}

/**
 * Dispatches the pending operation `r` under `options` and expects a refusal at `stage` with `code`: needs_review,
 * counted, no POST at the provider, no evidence; and, unless `askedAuthorizer`, no authorization request either.
 */
async function expectRefused(
  t: Test,
  e: PredispatchEnv,
  name: string,
  r: Reserved,
  options: OpenOptions,
  stage: string,
  code: string,
  askedAuthorizer = false,
  result: Record<string, unknown> = {},
  releases = 0,
): Promise<void> {
  const postsBefore = posts(e.provider);
  await dispatchOnce(e, options, r, async (d, row) => {
    t.equal(row.status, 'needs_review', `${name}: needs_review`);
    t.equal(row.review_reason, `${stage}:${code}`, `${name}: review reason ${stage}:${code}`);
    t.match(
      row.result_json,
      { ...result, stage, code, ...(releases === 0 ? {} : { releases, release_limit: releases }) },
      `${name}: result names stage and code`,
    );
    t.equal(row.provider_receipt, null, `${name}: no receipt`);
    t.equal(e.provider.requestsFor(r.effect_key), 0, `${name}: no POST with this effect key`);
    t.equal(posts(e.provider), postsBefore, `${name}: no POST at all reached the provider`);
    t.equal(await d.counter(REFUSALS, { stage, code }), 1, `${name}: refusal counted as ${stage}/${code}`);
    t.equal(await d.counterTotal(REFUSALS), 1, `${name}: and no other refusal`);
    t.equal(
      await d.counterTotal(OUTCOMES),
      releases,
      releases === 0 ? `${name}: no provider outcome counted` : `${name}: each release counted, nothing else`,
    );
  });
  const asked = e.authorizer.requests().filter((a) => a.request?.operation_id === r.operation_id).length;
  if (!askedAuthorizer) t.equal(asked, 0, `${name}: refused before asking the authorizer`);
  const hist = await e.pool.query<{ to_status: string; reason: string }>(
    'SELECT to_status, reason FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [r.operation_id],
  );
  t.same(
    hist.rows.map((h) => [h.to_status, h.reason]),
    [
      ['pending', 'reserved'],
      ['executing', 'claimed'],
      ...Array.from({ length: releases }, () => [
        ['pending', `released:${code}`],
        ['executing', 'claimed'],
      ]).flat(),
      ['needs_review', `predispatch_refused:${stage}:${code}`],
    ],
    `${name}: history`,
  );
  const ev = await e.pool.query('SELECT 1 FROM actionledger.authorization_evidence WHERE operation_id = $1', [
    r.operation_id,
  ]);
  t.equal(ev.rowCount, 0, `${name}: no authorization evidence recorded`);
}

/** The control: under `tools` as reserved, the operation succeeds with exactly one POST. */
async function expectDispatched(
  t: Test,
  e: PredispatchEnv,
  options: OpenOptions,
  r: Reserved,
  provider: SandboxProvider = e.provider,
): Promise<void> {
  await dispatchOnce(e, options, r, async (d, row) => {
    t.equal(row.status, 'succeeded', 'control: succeeded');
    t.equal(provider.requestsFor(r.effect_key), 1, 'control: one POST');
    t.equal(await d.counterTotal(REFUSALS), 0, 'control: no refusal');
  });
}

t.test('route_changed: the registry changed between reservation and dispatch', async (t) => {
  const e = await predispatchEnv(t);
  const tools: RawTools = { issue_refund: e.route() };
  const ledger = e.ledger(tools);
  await expectDispatched(t, e, { tools }, await ledger.reserve(ctx('control'), 'issue_refund', args));

  const cases: [string, RawTools][] = [
    ['another endpoint', { issue_refund: e.route({ endpoint: `${e.provider.url}/v2/refunds` }) }],
    ['another provider id', { issue_refund: e.route({ provider_id: 'billing-elsewhere' }) }],
    [
      'another idempotency header',
      { issue_refund: e.route({ idempotency: { mechanism: 'header', name: 'X-Request-Key' } }) },
    ],
    ['the tenant removed from allowed_tenants', { issue_refund: e.route({ allowed_tenants: ['tenant-b'] }) }],
    ['the tool removed from the registry', { send_email: e.route() }],
  ];
  for (const [i, [name, changed]] of cases.entries()) {
    const r = await ledger.reserve(ctx(`route-${i}`), 'issue_refund', args);
    await expectRefused(t, e, name, r, { tools: changed }, 'route', 'route_changed');
  }
});

t.test('args_hash_mismatch: stored arguments or their hash corrupted in the database', async (t) => {
  const e = await predispatchEnv(t);
  const tools: RawTools = { issue_refund: e.route() };
  const ledger = e.ledger(tools);
  const control = await ledger.reserve(ctx('control'), 'issue_refund', args);
  await expectDispatched(t, e, { tools }, control);
  await t.rejects(
    e.pool.query(
      `UPDATE actionledger.operations SET arguments_json = jsonb_set(arguments_json, '{amount}', '999999') WHERE operation_id = $1`,
      [control.operation_id],
    ),
    { message: /immutable/ },
    'the immutability trigger refuses a plain change (the corruption below disables it)',
  );

  const otherHash = sha256Hex(canonicalJson({ ...args, amount: 999999 }));
  const cases: [string, string, (id: string) => unknown[]][] = [
    [
      'arguments changed, hash kept',
      `UPDATE actionledger.operations SET arguments_json = jsonb_set(arguments_json, '{amount}', '999999') WHERE operation_id = $1`,
      (id) => [id],
    ],
    [
      'an argument added, hash kept',
      `UPDATE actionledger.operations SET arguments_json = arguments_json || '{"note": "injected"}' WHERE operation_id = $1`,
      (id) => [id],
    ],
    [
      'hash changed, arguments kept',
      'UPDATE actionledger.operations SET canonical_args_sha256 = $2 WHERE operation_id = $1',
      (id) => [id, otherHash],
    ],
  ];
  for (const [i, [name, sql, params]] of cases.entries()) {
    const r = await ledger.reserve(ctx(`args-${i}`), 'issue_refund', args);
    t.equal(await e.corrupt(sql, params(r.operation_id)), 1, `${name}: row corrupted`);
    await expectRefused(t, e, name, r, { tools }, 'arguments', 'args_hash_mismatch');
  }
});

t.test('credential_missing: the route names a credential variable the dispatcher does not have', async (t) => {
  const e = await predispatchEnv(t);
  const tools: RawTools = { issue_refund: e.route() };
  const ledger = e.ledger(tools);
  await expectDispatched(t, e, { tools }, await ledger.reserve(ctx('control'), 'issue_refund', args));

  const { TEST_BILLING_TOKEN: _unset, ...withoutToken } = e.env;
  const cases: [string, OpenOptions][] = [
    ['variable not set', { tools, env: withoutToken }],
    ['variable set but empty', { tools, env: { ...e.env, TEST_BILLING_TOKEN: '' } }],
    [
      'route names another, unset variable',
      { tools: { issue_refund: e.route({ credential_env: 'TEST_UNSET_PROVIDER_TOKEN' }) } },
    ],
  ];
  for (const [i, [name, options]] of cases.entries()) {
    const r = await ledger.reserve(ctx(`cred-${i}`), 'issue_refund', args);
    await expectRefused(t, e, name, r, options, 'credential', 'credential_missing');
  }
});

/** A started sandbox server with its own certificate and client trust, stopped at teardown. */
async function authorizerWith(t: Test, cert: PemPair, clientCa: string, urlHost: string): Promise<SandboxAuthorizer> {
  const a = new SandboxAuthorizer({ tls: { ...cert, ca: clientCa }, urlHost });
  t.teardown(() => a.stop());
  await a.start();
  return a;
}
async function providerWith(t: Test, cert: PemPair, clientCa: string, urlHost: string): Promise<SandboxProvider> {
  const p = new SandboxProvider({ tls: { ...cert, ca: clientCa }, urlHost, token: PREDISPATCH_TOKEN });
  t.teardown(() => p.stop());
  await p.start();
  return p;
}

t.test(
  'authorizer over mTLS: wrong host name or an untrusted client certificate: needs_review, provider never called',
  async (t) => {
    const e = await predispatchEnv(t);
    const tools: RawTools = { issue_refund: e.route() };
    const ledger = e.ledger(tools);
    await expectDispatched(t, e, { tools }, await ledger.reserve(ctx('control'), 'issue_refund', args));

    const localhostOnly = await issueServerCert(e.pki.ca, { hosts: ['localhost'] });
    const loopbackIpOnly = await issueServerCert(e.pki.ca, { hosts: ['127.0.0.1'] });
    const byIp = await authorizerWith(t, localhostOnly, e.pki.ca.cert, '127.0.0.1');
    const byName = await authorizerWith(t, loopbackIpOnly, e.pki.ca.cert, 'localhost');
    const cases: [string, OpenOptions, SandboxAuthorizer][] = [
      ['certificate for localhost, URL with 127.0.0.1', { tools, authorizationUrl: byIp.authorizeUrl }, byIp],
      ['certificate for 127.0.0.1, URL with localhost', { tools, authorizationUrl: byName.authorizeUrl }, byName],
      ['client certificate from another CA', { tools, client: e.pki.otherClient }, e.authorizer],
    ];
    for (const [i, [name, options, authorizer]] of cases.entries()) {
      const r = await ledger.reserve(ctx(`tls-${i}`), 'issue_refund', args);
      // No decision came: released to the queue, asked again, and in review only once the limit is spent.
      await expectRefused(
        t,
        e,
        name,
        r,
        options,
        'authorization',
        'authorization_unavailable',
        true,
        { transport: 'tls' },
        PREDISPATCH_RELEASE_LIMIT,
      );
      t.equal(
        authorizer.requests().filter((a) => a.request?.operation_id === r.operation_id).length,
        0,
        `${name}: the authorizer's HTTP layer never saw the request`,
      );
    }
  },
);

t.test(
  'provider over mTLS: wrong host name or an untrusted client certificate: needs_review, nothing reached the provider',
  async (t) => {
    const e = await predispatchEnv(t);
    const localhostOnly = await issueServerCert(e.pki.ca, { hosts: ['localhost'] });
    const cases: [string, SandboxProvider][] = [
      [
        'certificate for localhost, endpoint with 127.0.0.1',
        await providerWith(t, localhostOnly, e.pki.ca.cert, '127.0.0.1'),
      ],
      [
        'provider trusts another CA for client certificates',
        await providerWith(t, e.pki.server, e.pki.otherCa.cert, 'localhost'),
      ],
    ];
    // The control: the same kind of provider with good certificates and trust, reached through its own tool.
    const good = await providerWith(t, e.pki.server, e.pki.ca.cert, 'localhost');
    const tools: RawTools = { issue_refund: e.route({ endpoint: good.endpoint }) };
    cases.forEach(([, p], i) => (tools[`refund_${i}`] = e.route({ endpoint: p.endpoint })));
    const ledger = e.ledger(tools);
    await expectDispatched(t, e, { tools }, await ledger.reserve(ctx('control'), 'issue_refund', args), good);

    for (const [i, [name, provider]] of cases.entries()) {
      const r = await ledger.reserve(ctx(`ptls-${i}`), `refund_${i}`, args);
      // Nothing reached the provider: released to the queue, tried again, in review once the limit is spent.
      await dispatchOnce(e, { tools }, r, async (d, row) => {
        t.equal(row.status, 'needs_review', `${name}: needs_review`);
        t.equal(row.review_reason, 'provider:provider_unreachable', `${name}: not sent`);
        t.match(row.result_json, { transport: 'tls', releases: PREDISPATCH_RELEASE_LIMIT }, `${name}: tls, releases`);
        t.equal(row.provider_contact, 'not_called', `${name}: a reviewed retry is safe`);
        t.equal(provider.requests().length, 0, `${name}: the provider's HTTP layer never saw a request`);
        t.equal(
          await d.counter(OUTCOMES, { tool: `refund_${i}`, outcome: 'released' }),
          PREDISPATCH_RELEASE_LIMIT,
          `${name}: each release counted`,
        );
      });
      const ev = await e.pool.query('SELECT 1 FROM actionledger.authorization_evidence WHERE operation_id = $1', [
        r.operation_id,
      ]);
      t.equal(ev.rowCount, 1 + PREDISPATCH_RELEASE_LIMIT, `${name}: authorized and evidenced before each attempt`);
    }
  },
);
