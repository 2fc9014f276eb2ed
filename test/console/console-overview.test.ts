/**
 * The overview's numbers over real HTTP and a real PostgreSQL, without a browser: `/console/overview.json` says
 * what `/metrics` says for the same state (read at scrape time as the service reads it), per tenant and only in
 * the tenants the person may read; the favicon answers without a session; the menu offers only the pages the
 * person's roles open; concurrent requests share one reading, read on one connection at a time; the window is
 * exactly the chart's minutes; and the overview's statements walk indexes over a ledger of realistic size (a busy
 * tenant's hour included), never the whole operations table.
 */
import t from 'tap';
import type pg from 'pg';
import { readGateStatus } from '../../gate/index.js';
import { LedgerView } from '../../ledger/index.js';
import { readFleetHealth } from '../../reconciler/health.js';
import { overviewReader, overviewStatements, type Overview } from '../../server/console/overview-data.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { gctx } from '../helpers/gate.js';
import { get, person, post, signIn } from '../helpers/console-http.js';
import { putOut } from '../helpers/review-state.js';

/** The value of one series in a Prometheus exposition (labels as written, in order), or undefined. */
function series(exposition: string, name: string, labels = ''): number | undefined {
  const line = exposition.split('\n').find((l) => l.startsWith(`${name}${labels === '' ? ' ' : `{${labels}} `}`));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

/** /metrics as the service serves it: the ledger's, the gate's and the fleet's gauges read at scrape time. */
function scrapeLikeTheService(f: ApiFixture): void {
  const metrics = f.deps.metrics;
  if (metrics === undefined) throw new Error('no metrics');
  f.deps.beforeScrape = () =>
    metrics.readLedger(async () => ({
      ...(await new LedgerView(f.pool, f.config.schemaQuoted).status()),
      gate: await readGateStatus(f.pool, f.config.schemaQuoted),
      fleet: await readFleetHealth(f.pool, f.config.schema, f.config.schemaQuoted),
    }));
}

async function refund(f: ApiFixture, step: string, amount: number): Promise<{ ok: boolean; id: string }> {
  const r = await f.gate.call(gctx({ workflow_step_id: step, conversation_id: `c-${step}` }), 'issue_refund', {
    order_id: 'O-1',
    amount,
    currency: 'GBP',
  });
  return { ok: r.ok, id: (r.ok ? r.operation_id : r.request_id) ?? '' };
}

const refundCap = { tools: { issue_refund: { limits: { per_conversation: { max_count: 10, max_value: 5000 } } } } };

t.test('overview.json says what /metrics says, for the same state', async (t) => {
  const f = await apiFixture(t, { gate: refundCap });
  scrapeLikeTheService(f);
  await person(f, 'op-1', ['operator']);
  await person(f, 'sup-1', ['supervisor']);
  await person(f, 'aud-b', ['auditor'], 'tenant-b');
  // Three operations waiting, one put in review, one approval waiting, a kill switch, a worker heartbeating.
  const ops = [];
  for (const step of ['o-1', 'o-2', 'o-3', 'o-4']) ops.push(await refund(f, step, 10));
  t.ok(
    ops.every((o) => o.ok),
    'four operations reserved',
  );
  await putOut(f, ops[3]?.id ?? '', { reason: 'final_check:tool_disabled' });
  const waiting = await refund(f, 'a-1', 900);
  t.equal(waiting.ok, false, 'an approval waits');
  await f.gate.engageKillSwitch('tenant-a', 'transfer_funds', 'op-1', 'incident 12');
  await f.pool.query(
    `INSERT INTO ${f.config.schemaQuoted}.workers (worker_id, pid, host, claim_tokens, claims_listed_at)
     VALUES ('w-1', 1, 'test', '{}', now())`,
  );

  const op = await signIn(f, 'op-1');
  const res = await get(f, '/console/overview.json', op.cookie);
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /^application\/json/);
  t.equal(res.headers.get('cache-control'), 'no-store');
  t.equal(res.headers.get('x-content-type-options'), 'nosniff');
  const o = (await res.json()) as Overview;
  const m = await (await fetch(`${f.base}/metrics`)).text();

  t.equal(o.tenant, 'tenant-a');
  t.equal(o.queue.depth, series(m, 'actionledger_outbox_depth'), 'queue depth = actionledger_outbox_depth');
  t.equal(o.queue.depth, 3);
  const age = series(m, 'actionledger_outbox_oldest_age_seconds') ?? -1;
  // Read a moment apart: the same oldest row, seconds older at most.
  t.ok(Math.abs((o.queue.oldest_age_s ?? -100) - age) < 5, 'oldest age = actionledger_outbox_oldest_age_seconds', {
    overview: o.queue.oldest_age_s,
    metrics: age,
  });
  for (const [state, n] of Object.entries(o.open))
    t.equal(n, series(m, 'actionledger_operations', `status="${state}"`) ?? 0, `open ${state} = metrics`);
  t.equal(o.open.needs_review, 1);
  t.same(o.review, [{ reason: 'final_check:tool_disabled', count: 1 }], 'the review backlog by reason');
  const total = Object.values(o.window_totals).reduce((a, b) => a + b, 0);
  const metricTotal = ['pending', 'executing', 'succeeded', 'unknown', 'needs_review', 'compensating']
    .concat(['compensated', 'failed'])
    .reduce((a, s) => a + (series(m, 'actionledger_operations', `status="${s}"`) ?? 0), 0);
  t.equal(total, metricTotal, 'every operation (all made in the window) is counted once');
  t.equal(o.approvals.pending, series(m, 'actionledger_gate_approvals_pending'), 'approvals pending');
  t.equal(o.approvals.overdue, series(m, 'actionledger_gate_approvals_overdue'), 'approvals overdue');
  t.equal(o.approvals.next[0]?.approval_id, waiting.id, 'the waiting approval, with its expiry');
  t.ok((o.approvals.next[0]?.expires_in_s ?? 0) > 0);
  t.equal(o.kill_switches.length, series(m, 'actionledger_gate_kill_switches_engaged'), 'kill switches engaged');
  t.same(
    o.workers.map((w) => w.worker),
    ['w-1'],
  );
  t.ok(series(m, 'actionledger_worker_heartbeat_age_seconds', 'worker="w-1"') !== undefined, 'the same worker');
  t.equal(o.per_minute.length, 15, 'one point a minute of the window');

  // Per tenant: tenant-b's reader sees tenant-b's (empty) numbers and may not ask for tenant-a's.
  const b = await signIn(f, 'aud-b');
  const other = (await (await get(f, '/console/overview.json?tenant=tenant-b', b.cookie)).json()) as Overview;
  t.equal(other.tenant, 'tenant-b');
  t.equal(other.queue.depth, 0, "another tenant's queue is not counted");
  t.equal(other.approvals.pending, 0);
  t.equal(other.kill_switches.length, 0);
  t.equal((await get(f, '/console/overview.json?tenant=tenant-a', b.cookie)).status, 404, 'no role there: absent');
  t.equal((await get(f, '/console/overview.json?minutes=7', op.cookie)).status, 422, 'a window not offered');
  t.equal((await get(f, '/console/overview.json')).status, 401, 'no session');
  t.same(f.undeclared, []);
});

/**
 * Watches the pool's clients: how many hold one of the overview's statements at once (from the first such statement
 * until the client goes back to the pool), the most at any time, and how many times each statement ran.
 */
function watchOverview(f: ApiFixture): { most: () => number; runs: (sql: string) => number } {
  const texts = new Set(Object.values(overviewStatements(f.config.schemaQuoted)));
  const runs = new Map<string, number>();
  const patched = new WeakSet<pg.PoolClient>();
  const holding = new Set<pg.PoolClient>();
  let most = 0;
  f.pool.on('acquire', (client: pg.PoolClient) => {
    if (patched.has(client)) return;
    patched.add(client);
    const query = client.query.bind(client) as (...a: unknown[]) => unknown;
    (client as { query: unknown }).query = (...a: unknown[]) => {
      const first = a[0];
      const text = typeof first === 'string' ? first : (first as { text?: string } | undefined)?.text;
      if (text !== undefined && texts.has(text)) {
        runs.set(text, (runs.get(text) ?? 0) + 1);
        holding.add(client);
        most = Math.max(most, holding.size);
      }
      return query(...a);
    };
  });
  f.pool.on('release', (_err: unknown, client: pg.PoolClient) => holding.delete(client));
  return { most: () => most, runs: (sql) => runs.get(sql) ?? 0 };
}

t.test('concurrent overview requests share one reading, on one connection at a time', async (t) => {
  const f = await apiFixture(t, { gate: refundCap });
  await person(f, 'op-1', ['operator']);
  await person(f, 'aud-b', ['auditor'], 'tenant-b');
  for (const step of ['o-1', 'o-2', 'o-3']) t.ok((await refund(f, step, 10)).ok);
  const op = await signIn(f, 'op-1');
  const b = await signIn(f, 'aud-b');
  const watch = watchOverview(f);
  const perMinute = overviewStatements(f.config.schemaQuoted).perMinute ?? '';

  const [page, other, ...answers] = await Promise.all([
    get(f, '/console/overview', op.cookie),
    get(f, '/console/overview.json?tenant=tenant-b', b.cookie),
    ...Array.from({ length: 8 }, () => get(f, '/console/overview.json', op.cookie)),
  ]);
  const bodies = await Promise.all(answers.map(async (r) => (await r.json()) as Overview));
  t.equal(watch.most(), 1, "the overview's statements never held more than one connection at a time");
  t.equal(watch.runs(perMinute), 2, 'one reading per tenant and window (tenant-a, tenant-b)');
  t.ok(
    bodies.every((o) => JSON.stringify(o) === JSON.stringify(bodies[0])),
    'the eight answers for tenant-a are the same reading',
  );
  t.equal(bodies[0]?.queue.depth, 3);
  const html = await page?.text();
  t.match(html, new RegExp(`id="queue-depth">${bodies[0]?.queue.depth}<`), 'the page shows that reading too');
  t.equal(((await other?.json()) as Overview).queue.depth, 0, "tenant-b's own reading");

  // A reading is kept for a moment, then read again; another window is another reading.
  await get(f, '/console/overview.json', op.cookie);
  t.equal(watch.runs(perMinute), 2, 'asked again at once: the same reading');
  await get(f, '/console/overview.json?minutes=60', op.cookie);
  t.equal(watch.runs(perMinute), 3, 'another window: another reading');

  let clock = 1_000_000;
  const reader = overviewReader(f.pool, f.config, { now: () => clock });
  const first = await reader.read('tenant-a', 15);
  t.equal((await reader.read('tenant-a', 15)).at, first.at, 'within the time a reading is kept: that reading');
  t.equal(watch.runs(perMinute), 4);
  clock += 2_001;
  await reader.read('tenant-a', 15);
  t.equal(watch.runs(perMinute), 5, 'past it: read again');
  t.equal(watch.most(), 1);
});

t.test('the window is the chart: nothing counted before its first minute', async (t) => {
  const f = await apiFixture(t);
  const s = f.config.schemaQuoted;
  const c = await f.pool.connect();
  t.teardown(() => c.release());
  // In one transaction now() stands still: a row a moment before the first whole minute of a 60-minute window
  // (and within 60 minutes of now) is outside the chart, so outside the counts.
  await c.query('BEGIN');
  await c.query(
    `INSERT INTO ${s}.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
       tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
       arguments_json, current_approval_id, current_policy_version, status, created_at, updated_at)
     SELECT gen_random_uuid(), 'k-' || i, 'key-1', 'p-1', 't-' || i, '1', 'issue_refund', 'tenant-a', 'sandbox',
       'https://localhost/v1', 'Idempotency-Key', repeat('a', 64), '{}', 'auto', 'gate-policy-1', 'succeeded', at, at
     FROM (VALUES (1, date_trunc('minute', now()) - interval '59 min' - interval '1 ms'),
                  (2, date_trunc('minute', now()) - interval '59 min'),
                  (3, now())) AS v (i, at)`,
  );
  const { perMinute, latency } = overviewStatements(s);
  const minutes = await c.query<{ minute: Date; n: number }>(perMinute ?? '', ['tenant-a', 60]);
  const { rows: clock } = await c.query<{ first: Date; last: Date }>(
    `SELECT date_trunc('minute', now()) - interval '59 min' AS first, date_trunc('minute', now()) AS last`,
  );
  t.same(
    minutes.rows.map((r) => r.minute.getTime()).sort(),
    [clock[0]?.first.getTime(), clock[0]?.last.getTime()].sort(),
    'the first minute of the window and the current one; the row before the first minute is left out',
  );
  t.equal(
    minutes.rows.reduce((a, r) => a + r.n, 0),
    2,
  );
  const l = await c.query<{ n: number }>(latency ?? '', ['tenant-a', 60]);
  t.equal(l.rows[0]?.n, 2, 'the latency over the same rows');
  await c.query('ROLLBACK');
});

t.test('the landing page, the menu by role, and the favicon without a session', async (t) => {
  const f = await apiFixture(t, { gate: { tools: { issue_refund: { approver_roles: ['supervisor', 'approver'] } } } });
  await person(f, 'op-1', ['operator']);
  await person(f, 'sup-1', ['supervisor']);
  await person(f, 'ap-1', ['approver']);
  const op = await signIn(f, 'op-1');
  const sup = await signIn(f, 'sup-1');
  const landing = await get(f, '/console/', op.cookie);
  t.equal(landing.status, 303);
  t.equal(landing.headers.get('location'), '/console/overview', 'the overview is where the console opens');
  const nav = async (cookie: string) =>
    [...(await (await get(f, '/console/overview', cookie)).text()).matchAll(/<a href="\/console\/([a-z-]+)">/g)]
      .map((x) => x[1])
      .filter(
        (p, i, all) =>
          all.indexOf(p) === i &&
          ['overview', 'approvals', 'operations'].concat(['review', 'kill-switches', 'audit']).includes(p ?? ''),
      );
  t.same(
    await nav(sup.cookie),
    ['overview', 'approvals', 'operations', 'review'],
    'a supervisor: no kill switches, no audit',
  );
  t.same(
    await nav(op.cookie),
    ['overview', 'approvals', 'operations', 'review', 'kill-switches', 'audit'],
    'an operator: every page',
  );
  const ap = await signIn(f, 'ap-1');
  const apLanding = await get(f, '/console/', ap.cookie);
  t.equal(apLanding.headers.get('location'), '/console/approvals', 'an approver who may not read lands on Approvals');
  const apNav = [
    ...(await (await get(f, '/console/approvals', ap.cookie)).text()).matchAll(/<nav[^>]*>([\s\S]*?)<\/nav>/g),
  ]
    .map((m) => [...(m[1] ?? '').matchAll(/href="\/console\/([a-z-]+)"/g)].map((x) => x[1]))
    .flat();
  t.same(apNav, ['approvals'], 'and is offered Approvals only');
  t.equal((await get(f, '/console/overview', ap.cookie)).status, 403, 'the overview needs read');
  for (const path of ['/console/kill-switches', '/console/audit'])
    t.equal((await get(f, path, sup.cookie)).status, 403, `${path}: still refused to a supervisor`);

  const icon = await fetch(`${f.base}/favicon.ico`);
  t.equal(icon.status, 200, 'the favicon without a session');
  t.equal(icon.headers.get('content-type'), 'image/x-icon');
  t.equal(icon.headers.get('set-cookie'), null);
  const bytes = Buffer.from(await icon.arrayBuffer());
  t.same([...bytes.subarray(0, 4)], [0, 0, 1, 0], 'an ICO file');

  const js = await fetch(`${f.base}/console/static/overview.js`);
  t.equal(js.headers.get('content-type'), 'text/javascript; charset=utf-8');
  t.equal(js.headers.get('x-content-type-options'), 'nosniff');
  const uplotPath = /from '([^']+uPlot\.esm\.js)'/.exec(await js.text())?.[1] ?? '';
  const lib = await fetch(`${f.base}${uplotPath}`);
  t.equal(lib.status, 200, 'uPlot from the package, not a CDN');
  t.equal(lib.headers.get('content-type'), 'text/javascript; charset=utf-8');
  t.match(lib.headers.get('cache-control'), /immutable/, 'its versioned path may be cached for good');
  t.equal(lib.headers.get('x-content-type-options'), 'nosniff');
  const css = await fetch(`${f.base}${uplotPath.replace('uPlot.esm.js', 'uPlot.min.css')}`);
  t.equal(css.headers.get('content-type'), 'text/css; charset=utf-8');
  t.equal(css.headers.get('x-content-type-options'), 'nosniff');
  t.match(await css.text(), /\.uplot/);
});

t.test('the overview reads indexes over a large ledger, never the whole operations table', async (t) => {
  const f = await apiFixture(t);
  const s = f.config.schemaQuoted;
  // 200,000 operations over 30 days in four tenants, most finished; a few open, in review, waiting, executing.
  await f.pool.query(
    `INSERT INTO ${s}.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
       tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
       arguments_json, current_approval_id, current_policy_version, status, review_reason, created_at, updated_at)
     SELECT gen_random_uuid(), 'k-' || i, 'key-1', 'p-' || (i % 50), 't-' || i, '1', 'issue_refund',
       'tenant-' || (i % 4), 'sandbox', 'https://localhost/v1', 'Idempotency-Key', repeat('a', 64), '{}',
       'auto', 'gate-policy-1',
       CASE WHEN i % 1000 = 1 THEN 'needs_review' WHEN i % 997 = 0 THEN 'failed' ELSE 'succeeded' END,
       CASE WHEN i % 1000 = 1 THEN 'final_check:tool_disabled' END,
       now() - make_interval(secs => i * 13), now() - make_interval(secs => i * 13 - 2)
     FROM generate_series(1, 200000) AS i`,
  );
  // 50,000 approvals, decided long ago but for 40 waiting.
  await f.pool.query(
    `INSERT INTO ${s}.gate_approvals (approval_id, tenant_id, requester_id, requester_role, account_id,
       conversation_id, trace_id, task_id, workflow_step_id, tool_name, arguments_json, args_sha256, plan_version,
       policy_version, envelope_json, envelope_sha256, status, created_at, expires_at)
     SELECT gen_random_uuid(), 'tenant-' || (i % 4), 'agent-1', 'agent', 'acct-1', 'c-' || i, 'tr', 'task-' || i, '1',
       'issue_refund', '{}', repeat('a', 64), '-', 'gate-policy-1', '{}', repeat('b', 64),
       CASE WHEN i <= 40 THEN 'pending' ELSE 'expired' END,
       now() - make_interval(secs => i * 60), now() - make_interval(secs => i * 60) + interval '1 hour'
     FROM generate_series(1, 50000) AS i`,
  );
  await f.pool.query(`ANALYZE ${s}.operations`);
  await f.pool.query(`ANALYZE ${s}.outbox`);
  await f.pool.query(`ANALYZE ${s}.gate_approvals`);
  for (const [name, sql] of Object.entries(overviewStatements(s))) {
    const params = name === 'workers' ? [3600] : sql.includes('$2') ? ['tenant-1', 15] : ['tenant-1'];
    const { rows } = await f.pool.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${sql}`, params);
    const plan = JSON.stringify(rows[0]?.['QUERY PLAN']);
    const seqOnOperations = /"Node Type":"Seq Scan"[^}]*"Relation Name":"operations"/.test(plan);
    t.notOk(seqOnOperations, `${name}: no sequential scan of the operations table`, { plan });
    t.notMatch(
      plan,
      /"Relation Name":"gate_approvals"[^}]*"Node Type":"Seq Scan"|"Node Type":"Seq Scan"[^}]*"Relation Name":"gate_approvals"/,
      `${name}: nor of the approvals`,
    );
  }
  // And the statements answer: the recent minutes only.
  await person(f, 'op-1', ['operator'], 'tenant-1');
  const op = await signIn(f, 'op-1');
  const o = (await (await get(f, '/console/overview.json?tenant=tenant-1', op.cookie)).json()) as Overview;
  const inWindow = Object.values(o.window_totals).reduce((a, b) => a + b, 0);
  t.ok(inWindow > 0 && inWindow < 100, 'the window holds the last 15 minutes only', { inWindow });
  t.equal(o.open.needs_review, 200, "the tenant's operations in review, whatever their age");
  t.notOk('failed' in o.open, 'failed is an end: not counted whole (rows in it accumulate for good)');
  t.equal(o.window_totals.failed, 0, "but in the window, where the tenant's failed operations of days ago are not");
  t.ok(o.latency.p50_s !== null && Math.abs(o.latency.p50_s - 2) < 0.01, 'p50 from reservation to success');

  // A busy tenant whose 60-minute window is most of its rows: 36,000 operations in the last hour (10 a second),
  // 4,000 before. Its window's statements still walk the tenant's index over the window, not the table.
  await f.pool.query(
    `INSERT INTO ${s}.operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
       tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
       arguments_json, current_approval_id, current_policy_version, status, created_at, updated_at)
     SELECT gen_random_uuid(), 'busy-' || i, 'key-1', 'p-' || (i % 50), 'tb-' || i, '1', 'issue_refund',
       'tenant-busy', 'sandbox', 'https://localhost/v1', 'Idempotency-Key', repeat('a', 64), '{}', 'auto',
       'gate-policy-1', CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'succeeded' END,
       now() - make_interval(secs => i * 0.1), now() - make_interval(secs => i * 0.1 - 1)
     FROM generate_series(1, 40000) AS i`,
  );
  await f.pool.query(`ANALYZE ${s}.operations`);
  const statements = overviewStatements(s);
  for (const name of ['perMinute', 'latency'] as const) {
    const { rows } = await f.pool.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${statements[name]}`, [
      'tenant-busy',
      60,
    ]);
    const plan = JSON.stringify(rows[0]?.['QUERY PLAN']);
    t.notMatch(plan, /"Seq Scan"/, `${name}, a busy tenant's 60 minutes: no sequential scan`, { plan });
    t.match(plan, /operations_tenant_created_idx/, `${name}: the tenant's index over the window`, { plan });
  }
  await person(f, 'op-busy', ['operator'], 'tenant-busy');
  const busy = await signIn(f, 'op-busy');
  const hour = (await (
    await get(f, '/console/overview.json?tenant=tenant-busy&minutes=60', busy.cookie)
  ).json()) as Overview;
  const drawn = hour.per_minute.reduce((a, p) => a + Object.values(p.by_outcome).reduce((x, y) => x + y, 0), 0);
  t.equal(
    Object.values(hour.window_totals).reduce((a, b) => a + b, 0),
    drawn,
    'the totals are what the chart draws',
  );
  t.ok(drawn > 35_000 && drawn <= 36_000, 'the last hour of the busy tenant', { drawn });
});

t.test('after a decision the approval page shows its outcome alone', async (t) => {
  const f = await apiFixture(t);
  await person(f, 'sup-1', ['supervisor']);
  await person(f, 'sup-2', ['supervisor']);
  const notices = (page: string) => [...page.matchAll(/<div class="notice (ok|bad|warn)"/g)].map((m) => m[1]);
  const held = await f.gate.call(
    gctx({ principal_id: 'admin-1', role: 'admin', workflow_step_id: 'del-1' }),
    'delete_customer',
    { customer_id: 'C-1' },
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  const path = `/console/approvals/tenant-a/${held.request_id}`;
  const decide = async (who: string) => {
    const s = await signIn(f, who);
    const page = await (await get(f, path, s.cookie)).text();
    const hash = /name="envelope_sha256" value="([0-9a-f]{64})"/.exec(page)?.[1] ?? '';
    const res = await post(f, `${path}/approve`, s, { csrf: s.csrf, envelope_sha256: hash });
    t.equal(res.status, 303, `${who} approves`);
    return (await get(f, res.headers.get('location') ?? '', s.cookie)).text();
  };
  const first = await decide('sup-1');
  t.match(first, /id="done">Your approval is recorded; more approvers are needed\./);
  t.same(notices(first), ['ok'], 'one notice: the vote is recorded (no "you approved this already" beside it)');
  t.notMatch(first, /id="approve"/, 'and no second vote is offered');
  const again = await get(f, path, (await signIn(f, 'sup-1')).cookie);
  t.match(await again.text(), /you approved this already/, 'opened again later, the page says why it waits');
  const second = await decide('sup-2');
  t.match(second, /id="done">Approved: the operation is reserved and will be dispatched\./);
  t.same(notices(second), ['ok'], 'one notice: approved (no invalid_state_transition: it is executed)');
  t.match(second, /<dd id="status">executed<\/dd>/);
});
