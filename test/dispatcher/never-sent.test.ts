/**
 * A claim whose provider request never left the process goes back to the queue when nobody decided against it,
 * and to review only when somebody did or when its release limit is spent (dispatcher/completer.ts `release`).
 * Real parts throughout: the run's PostgreSQL, real dispatchers (`openDispatcher`), the sandbox provider over
 * mTLS counting every request, and, for the first three tests, the built-in authorization service
 * (gate/authorization-service.ts) deciding from PostgreSQL over its own pool, which reaches the database through
 * the in-repo TCP proxy (chaos/tcp-proxy.ts) so that a test can take that database away from it alone.
 *
 * What each test proves, and why it fails without the release mechanism (where an unanswered authorization
 * request was a refusal: `needs_review` with `authorization:authorization_unavailable` at the first failure):
 * - the outage: operations asked about while the authorization service's database is gone end `succeeded`,
 *   none ever in review; before, each one asked during the outage went to review;
 * - the denial: a real decision still goes to review at once, never released; this one holds with or without
 *   the mechanism, and fails against one that releases more than "no decision" (a deny asked again and again);
 * - the kill switch: the service's 503 `tool_disabled` releases the operation, which the claim then leaves
 *   alone until the switch is lifted; before, the service answered a kill switch with a deny (review);
 * - the release limit: exactly `release_limit` releases, then review with the count in its result; a reviewed
 *   retry starts the count again (the retried operation is released once more instead of going straight back
 *   to review, which is what a count left at the limit would do).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { TcpProxy } from '../../chaos/tcp-proxy.js';
import { compileConfig } from '../../config/index.js';
import { createPool, type Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import type { Runtime } from '../../runtime/runtime.js';
import { openDispatcher, type Dispatcher } from '../../dispatcher/index.js';
import { AuthorizationService, type GateResult } from '../../gate/index.js';
import { DispatchFiles } from '../../sandbox/kit.js';
import type { SandboxProvider } from '../../sandbox/provider.js';
import { createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';
import {
  GATE_RESOLVERS,
  auditRows,
  gateFixture,
  gateRoutes,
  gateSection,
  gctx,
  type GateFixture,
} from '../helpers/gate.js';
import { throughPort } from '../helpers/net.js';
import { startProvider, testPki } from '../helpers/sandbox.js';

const TOKEN = 'never-sent-provider-token';
const SERVICE_POOL = 'never-sent-authorizer';

interface Env {
  /** The test's and the dispatchers' pool: straight to the database. */
  pool: Pool;
  provider: SandboxProvider;
  g: GateFixture;
  service: AuthorizationService;
  /** Between the authorization service's pool and the database, and nothing else. */
  proxy: TcpProxy;
  /** Opens and starts a dispatcher asking `service`; stopped at teardown. */
  dispatcher(): Promise<Dispatcher>;
}

/**
 * The gate's fixture on a fresh database, the built-in authorization service on its own pool through a TCP
 * proxy, and dispatchers whose signed profile names that service; `dispatcher` replaces keys of the
 * configuration's `dispatcher` section.
 */
async function builtInEnv(t: Test, dispatcher: Record<string, unknown> = {}): Promise<Env> {
  const dir = mkdtempSync(join(tmpdir(), 'al-never-sent-'));
  const pki = await testPki();
  const provider = await startProvider(t, { token: TOKEN });
  const url = await createTestDatabase(t);
  const pool = createPool(url, { max: 20, statementTimeoutMs: 30_000, applicationName: 'test-never-sent' });
  const db = new URL(url);
  const proxy = new TcpProxy({ host: db.hostname, port: Number(db.port) });
  const servicePool = createPool(throughPort(url, await proxy.listen()), {
    max: 10,
    statementTimeoutMs: 30_000,
    applicationName: SERVICE_POOL,
  });
  const g = await gateFixture(t, { url, pool, endpoint: provider.endpoint });
  const service = new AuthorizationService({
    config: g.config,
    pool: servicePool,
    resolvers: GATE_RESOLVERS,
    tls: { ...pki.server, ca: pki.ca.cert },
  });
  await service.start();

  const files = new DispatchFiles(dir, pki.ca.cert);
  const env: NodeJS.ProcessEnv = {
    DATABASE_URL: url,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: TOKEN,
  };
  const config = compileConfig(
    {
      tools: gateRoutes(provider.endpoint),
      gate: gateSection(),
      dispatcher: {
        poll_interval_ms: 100,
        heartbeat_interval_ms: 500,
        profile: files.profile({
          profile_id: 'never-sent',
          authorization_url: service.authorizeUrl,
          provider_http_timeout_seconds: 2,
        }),
        tls: files.client(pki.client),
        ...dispatcher,
      },
    },
    env,
  );
  const running = new Set<Dispatcher>();
  t.teardown(async () => {
    for (const d of running) await d.stop(5000);
    await service.stop();
    await proxy.close();
    await servicePool.end();
    await pool.end();
  });
  return {
    pool,
    provider,
    g,
    service,
    proxy,
    async dispatcher() {
      const runtime: Runtime = {
        config,
        log: createLogger({ level: 'silent', name: 'test' }),
        metrics: new Metrics({ defaultMetrics: false, ledger: false }),
        pool,
        databaseUrl: url,
        embedded: null,
        effectKeys: { active: 'k1', secrets: new Map() },
        close: () => Promise.resolve(),
      };
      const d = await openDispatcher(runtime, env, { concurrency: 4 });
      running.add(d);
      await d.start();
      return d;
    },
  };
}

interface Reserved {
  operation_id: string;
  effect_key: string;
}

function reserved(r: GateResult): Reserved {
  if (!r.ok || r.operation_id === undefined || r.effect_key === undefined) throw new Error(JSON.stringify(r));
  return { operation_id: r.operation_id, effect_key: r.effect_key };
}

/** A transfer agent-1 asks for through the gate: no approval needed, so the gate reserves it at once. */
async function transfer(g: GateFixture, step: string): Promise<Reserved> {
  return reserved(
    await g.gate.call(gctx({ workflow_step_id: step }), 'transfer_funds', { to_account: 'ACC0000000002', amount: 10 }),
  );
}

/** The operation's history: each row's status it entered and its reason, in order. */
async function history(pool: Pool, operationId: string): Promise<{ to_status: string; reason: string }[]> {
  const { rows } = await pool.query<{ to_status: string; reason: string }>(
    'SELECT to_status, reason FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [operationId],
  );
  return rows;
}

async function releasesOf(pool: Pool, operationId: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    'SELECT dispatch_releases AS n FROM actionledger.operations WHERE operation_id = $1',
    [operationId],
  );
  return rows[0]?.n ?? -1;
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('an authorization outage during a database restart leaves no operation in review', async (t) => {
  // The default release limit (8); a backoff growing from 200 ms to 2 s, so that 8 releases of one operation
  // take at least 100 + 200 + 400 + 800 + 4 x 1,000 = 5,500 ms (each delay is jittered between half and all of
  // its value): longer than the outage below, so no operation can spend its limit inside it.
  const x = await builtInEnv(t, { release_backoff_initial_ms: 200, release_backoff_max_ms: 2000 });
  await x.dispatcher();
  // One operation dispatched first: the environment works, and the service's pool holds open connections
  // that the outage cuts, as a restart does.
  const warm = await transfer(x.g, 'warm-up');
  t.equal((await settled(x.pool, warm.operation_id)).status, 'succeeded', 'dispatched before the outage');

  // The database goes away for the authorization service: every connection it has is cut, and every new one
  // is held unanswered and cut in turn, for 2 s (and at least until the 20 operations below are reserved);
  // the dispatchers' and the gate's own database connections are untouched.
  x.proxy.pause();
  const outageStart = Date.now();
  let reserving = true;
  let resets = 0;
  const cutting = (async () => {
    while (reserving || Date.now() - outageStart < 2_000) {
      x.proxy.resetAll();
      resets++;
      await sleep(20);
    }
  })();
  const ops = await Promise.all(Array.from({ length: 20 }, (_, i) => transfer(x.g, `outage-${i}`)));
  reserving = false;
  await cutting;
  x.proxy.resume();
  t.ok(resets > 0, 'the outage ran');

  for (const op of ops) {
    const row = await settled(x.pool, op.operation_id);
    t.equal(row.status, 'succeeded', `${op.operation_id}: succeeded`);
    t.equal(x.provider.requestsFor(op.effect_key), 1, `${op.operation_id}: exactly one provider request`);
  }
  const ids = ops.map((o) => o.operation_id);
  const { rows } = await x.pool.query<{ to_status: string; reason: string; n: number }>(
    `SELECT to_status, reason, count(*)::int AS n FROM actionledger.operation_history
     WHERE operation_id = ANY($1::uuid[]) GROUP BY 1, 2`,
    [ids],
  );
  t.same(
    rows.filter((r) => r.to_status === 'needs_review'),
    [],
    'no operation ever entered needs_review',
  );
  const released = rows.filter((r) => r.reason.startsWith('released:'));
  t.same(
    released.map((r) => r.reason),
    ['released:authorization_unavailable'],
    'every release was "no authorization decision"',
  );
  t.ok((released[0]?.n ?? 0) >= 1, 'the outage was hit: at least one operation was released');
  const { rows: extra } = await x.pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM actionledger.operations
     WHERE operation_id = ANY($1::uuid[]) AND dispatch_releases > 0`,
    [ids],
  );
  t.ok((extra[0]?.n ?? 0) >= 1, 'and its releases are counted on the operation');
});

t.test('a denial from the built-in service still goes to review at once, never released', async (t) => {
  const x = await builtInEnv(t);
  // The requester's role revoked after the reservation: the service answers 200 deny (role_not_held).
  const revoked = await transfer(x.g, 'revoked');
  await x.g.gate.revokeRole('tenant-a', 'agent-1', 'agent', 'security');
  await x.dispatcher();
  const row = await settled(x.pool, revoked.operation_id);
  t.equal(row.status, 'needs_review');
  t.equal(row.review_reason, 'authorization:authorization_denied');
  t.equal(row.provider_contact, 'not_called');
  t.notOk('releases' in (row.result_json ?? {}), 'no release limit was involved');
  t.same(
    (await history(x.pool, revoked.operation_id)).map((h) => h.reason),
    ['reserved', 'claimed', 'predispatch_refused:authorization:authorization_denied'],
    'claimed once, refused once: no released row',
  );
  t.equal(await releasesOf(x.pool, revoked.operation_id), 0, 'no release counted');
  t.equal(x.provider.requestsFor(revoked.effect_key), 0, 'the provider was never called');
  t.match(
    await auditRows(x.pool, "action = 'authorize' AND subject_id = $1", [revoked.operation_id]),
    [{ outcome: 'deny', detail: { reason: 'role_not_held' } }],
    'the service decided once, against it',
  );
});

t.test('a kill switch engaged between the claim and the decision: released, held, then sent once', async (t) => {
  // release_limit 0: a counted release would send it to review at once; a kill switch's is not counted.
  const x = await builtInEnv(t, { release_limit: 0, release_backoff_initial_ms: 50, release_backoff_max_ms: 100 });
  const op = await transfer(x.g, 'switched');
  // The switch is engaged by the transaction that claims this operation (its first claim only): after the
  // claim, before the service decides. The service then answers 503 tool_disabled.
  await x.pool.query(`
    CREATE TABLE public.switched (done boolean);
    CREATE FUNCTION public.switch_on_claim() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.operation_id = '${op.operation_id}' AND NOT EXISTS (SELECT 1 FROM public.switched) THEN
        INSERT INTO public.switched VALUES (true);
        INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason)
        VALUES ('tenant-a', 'transfer_funds', 'security', 'incident');
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER switch_on_claim AFTER INSERT ON actionledger.operation_history
      FOR EACH ROW WHEN (NEW.reason = 'claimed') EXECUTE FUNCTION public.switch_on_claim();`);
  await x.dispatcher();
  await until('the first claim to end', async () =>
    (await history(x.pool, op.operation_id)).some((h) => h.to_status !== 'executing' && h.reason !== 'reserved'),
  );
  t.same(
    (await history(x.pool, op.operation_id)).map((h) => [h.to_status, h.reason]),
    [
      ['pending', 'reserved'],
      ['executing', 'claimed'],
      ['pending', 'released:tool_disabled'],
    ],
    'released to the queue, not refused',
  );
  t.match(
    await auditRows(x.pool, "action = 'authorize' AND subject_id = $1", [op.operation_id]),
    [{ outcome: 'deferred', detail: { reason: 'kill_switch' } }],
    'the service answered the kill switch as no decision',
  );

  // Once its backoff has passed the operation is claimable but for the switch; another operation reserved
  // after that is claimed and sent, by a claim that saw the switched one first in the queue and left it.
  await until('the backoff to pass', async () => {
    const { rows } = await x.pool.query<{ ready: boolean }>(
      'SELECT available_at <= now() AS ready FROM actionledger.outbox WHERE operation_id = $1',
      [op.operation_id],
    );
    return rows[0]?.ready === true;
  });
  const other = reserved(
    await x.g.gate.call(gctx({ workflow_step_id: 'other-tool' }), 'issue_refund', {
      order_id: 'O-1',
      amount: 10,
      currency: 'GBP',
    }),
  );
  t.equal((await settled(x.pool, other.operation_id)).status, 'succeeded', 'a tool not switched off is sent');
  t.same(
    (await history(x.pool, op.operation_id)).map((h) => [h.to_status, h.reason]),
    [
      ['pending', 'reserved'],
      ['executing', 'claimed'],
      ['pending', 'released:tool_disabled'],
    ],
    'the switched operation waits in the queue, not claimed again while the switch is engaged',
  );
  t.equal(x.provider.requestsFor(op.effect_key), 0, 'nothing sent while engaged');

  t.equal(await x.g.gate.liftKillSwitch('tenant-a', 'transfer_funds', 'security'), true);
  const row = await settled(x.pool, op.operation_id);
  t.equal(row.status, 'succeeded', 'sent once the switch is lifted');
  t.equal(x.provider.requestsFor(op.effect_key), 1, 'exactly one provider request');
  const h = await history(x.pool, op.operation_id);
  t.notOk(
    h.some((r) => r.to_status === 'needs_review'),
    'never in review',
  );
  t.equal(h.filter((r) => r.reason.startsWith('released:')).length, 1, 'released once');
});

t.test('the release limit: released exactly twice, then review; a reviewed retry starts the count again', async (t) => {
  const e = await dispatchEnv(t, {}, { dispatcher: { release_limit: 2 } });
  // The authorizer never answers 200 until told otherwise.
  e.authorizer.inject({ kind: 'status', status: 503 }, { times: Infinity });
  const r = await e.ledger.reserve(ctx('limit'), 'issue_refund', { order_id: 'ord-1', amount: 5, currency: 'EUR' });
  const d = await e.dispatcher();
  const row = await settled(e.pool, r.operation_id);
  t.equal(row.status, 'needs_review');
  t.equal(row.review_reason, 'authorization:authorization_unavailable');
  t.match(row.result_json, {
    stage: 'authorization',
    code: 'authorization_unavailable',
    releases: 2,
    release_limit: 2,
  });
  t.equal(row.provider_contact, 'not_called', 'never sent, so a reviewed retry is safe');
  t.same(
    (await history(e.pool, r.operation_id)).map((h) => [h.to_status, h.reason]),
    [
      ['pending', 'reserved'],
      ['executing', 'claimed'],
      ['pending', 'released:authorization_unavailable'],
      ['executing', 'claimed'],
      ['pending', 'released:authorization_unavailable'],
      ['executing', 'claimed'],
      ['needs_review', 'predispatch_refused:authorization:authorization_unavailable'],
    ],
    'released exactly twice, in review at the third failure',
  );
  t.equal(await releasesOf(e.pool, r.operation_id), 2);
  t.equal(e.provider.requestsFor(r.effect_key), 0, 'the provider was never called');
  await d.stop(5000);

  const kit = await e.reconciler();
  await kit.review.retry(r.operation_id, { actor: 'alice', reason: 'the authorizer is back' });
  t.equal(await releasesOf(e.pool, r.operation_id), 0, 'a reviewed retry resets dispatch_releases');
  // One more unanswered request: a count started again releases it; one left at the limit would send it
  // straight back to review.
  e.authorizer.clearFaults();
  e.authorizer.inject({ kind: 'status', status: 503 }, { times: 1 });
  await e.dispatcher();
  const done = await settled(e.pool, r.operation_id);
  t.equal(done.status, 'succeeded', 'succeeds once the authorizer answers again');
  t.equal(e.provider.requestsFor(r.effect_key), 1, 'exactly one provider request');
  const after = (await history(e.pool, r.operation_id)).slice(7).map((h) => [h.to_status, h.reason]);
  t.same(
    after,
    [
      ['pending', 'review:retry'],
      ['executing', 'claimed'],
      ['pending', 'released:authorization_unavailable'],
      ['executing', 'claimed'],
      ['succeeded', after[4]?.[1]],
    ],
    'after the retry: released once more, then sent',
  );
  t.equal(await releasesOf(e.pool, r.operation_id), 1);
});
