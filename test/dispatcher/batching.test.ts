/**
 * The dispatcher's batches (dispatcher/batcher.ts): operations in flight together share a dispatch batch (its
 * evidence statement and its transaction), yet each keeps its own fate. Real PostgreSQL, the sandbox provider and
 * authorizer over mTLS, a real Dispatcher.
 */
import t from 'tap';
import type { Test } from 'tap';
import { bindQueries, createPool, type Pool } from '../../db/db.js';
import { Metrics } from '../../core/metrics.js';
import { openDispatcher } from '../../dispatcher/index.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import {
  ctx,
  dispatchEnv,
  dispatcherThroughProxy,
  evidenceRows,
  pauseEvidenceOn,
  settled,
  statusOf,
  type DispatchEnv,
} from '../helpers/fleet.js';
import { gateFixture } from '../helpers/gate.js';

/**
 * Timeouts no healthy request reaches even on a loaded machine: where every request is meant to succeed, a
 * provider call cut at the kit's 1 s would turn into an unknown outcome and fail the test for the wrong reason.
 */
const ROOMY = { provider_http_timeout_seconds: 30, authorization_http_timeout_seconds: 30 };

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });

interface Bucketed {
  values: { labels: Record<string, string>; value: number; metricName?: string }[];
}

async function batchStats(metrics: Metrics, stage: string): Promise<{ batches: number; operations: number }> {
  const m = (await metrics.registry.getSingleMetric('actionledger_dispatch_batch_operations')?.get()) as
    Bucketed | undefined;
  const pick = (suffix: string) =>
    m?.values.find(
      (v) => v.metricName === `actionledger_dispatch_batch_operations_${suffix}` && v.labels.stage === stage,
    )?.value ?? 0;
  return { batches: pick('count'), operations: pick('sum') };
}

t.test('operations in flight together share batches, and each is sent exactly once', async (t) => {
  const e = await dispatchEnv(t, ROOMY);
  const reserved = [];
  for (let i = 0; i < 24; i++) reserved.push(await e.ledger.reserve(ctx(`batch-${i}`), 'issue_refund', args(i)));
  // Every authorization is answered once all 24 have been asked: the answers arrive together, so batches are
  // shared by construction, however the claims and requests were spread in time.
  let asked = 0;
  let answerAll!: () => void;
  const allAsked = new Promise<void>((resolve) => (answerAll = resolve));
  t.teardown(() => answerAll());
  const decide = e.authorizer.decide;
  e.authorizer.decide = async (request) => {
    if (++asked === 24) answerAll();
    await allAsked;
    return decide(request);
  };
  const metrics = new Metrics({ defaultMetrics: false, ledger: false });
  const d = await openDispatcher({ ...e.runtime, metrics }, e.env, { concurrency: 24 });
  t.teardown(() => d.stop(5000));
  await d.start();
  for (const r of reserved) {
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'succeeded', r.operation_id);
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'one request for its key');
  }
  const dispatch = await batchStats(metrics, 'dispatch');
  t.equal(dispatch.operations, 24, 'every operation went through a dispatch batch');
  t.ok(dispatch.batches < 24, `some batch held more than one operation (${dispatch.batches} batches)`);
  const ev = await e.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.authorization_evidence');
  t.equal(ev.rows[0]?.n, 24, 'one evidence row each');
});

/** The history rows of `id` that moved it out of `executing`, with their reason and detail. */
async function releases(
  pool: Pool,
  id: string,
): Promise<{ to_status: string; reason: string; detail: Record<string, unknown> }[]> {
  const { rows } = await pool.query<{ to_status: string; reason: string; detail: Record<string, unknown> }>(
    "SELECT to_status, reason, detail FROM actionledger.operation_history WHERE operation_id = $1 AND from_status = 'executing' ORDER BY id",
    [id],
  );
  return rows;
}

t.test(
  'a batch-mate whose policy rotated after its evidence was recorded is stopped at the final check and asked about afresh; the others are sent',
  async (t) => {
    const e = await dispatchEnv(t, ROOMY);
    // Rotates the policy of the marked operations inside the very statement that records their evidence: the
    // evidence commits under the old version, so only the dispatch batch's final check can catch it.
    await e.pool.query(`
    CREATE TABLE public.rotate_after_evidence (operation_id uuid PRIMARY KEY);
    CREATE FUNCTION public.rotate_after_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE actionledger.operations SET current_policy_version = 'policy-2'
      WHERE operation_id = NEW.operation_id AND operation_id IN (SELECT operation_id FROM public.rotate_after_evidence);
      RETURN NEW;
    END $$;
    CREATE TRIGGER rotate_after_evidence AFTER INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.rotate_after_evidence();`);
    const reserved = [];
    for (let i = 0; i < 12; i++) reserved.push(await e.ledger.reserve(ctx(`rotate-${i}`), 'issue_refund', args(i)));
    const rotated = reserved.filter((_, i) => i % 3 === 1);
    for (const r of rotated)
      await e.pool.query('INSERT INTO public.rotate_after_evidence VALUES ($1)', [r.operation_id]);
    await e.dispatcher(12);
    for (const r of reserved) {
      const done = await settled(e.pool, r.operation_id);
      if (rotated.includes(r)) {
        // Its first decision was for the old policy: stopped at the final check and given back to the queue, then
        // authorized afresh under the new policy (the sandbox authorizer allows it) and sent once.
        const out = await releases(e.pool, r.operation_id);
        t.match(out[0], {
          to_status: 'pending',
          reason: 'released:authorization_stale',
          detail: { stage: 'final_check' },
        });
        t.equal(done.status, 'succeeded', 'rotated: sent under a fresh decision');
        t.equal(e.provider.requestsFor(r.effect_key), 1, 'rotated: sent once');
        const { rows: ev } = await e.pool.query<{ policy_version: string }>(
          'SELECT policy_version FROM actionledger.authorization_evidence WHERE operation_id = $1 ORDER BY recorded_at',
          [r.operation_id],
        );
        t.same(
          ev.map((x) => x.policy_version),
          ['policy-1', 'policy-2'],
          'rotated: the send rests on a decision for the new policy',
        );
      } else {
        t.equal(done.status, 'succeeded', 'unchanged: succeeded');
        t.equal(e.provider.requestsFor(r.effect_key), 1, 'unchanged: sent once');
      }
    }
  },
);

t.test('a revocation issued while a batch is at the provider waits for its outcome', async (t) => {
  const e = await dispatchEnv(t);
  const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(1));
  const mate = await e.ledger.reserve(ctx('mate'), 'issue_refund', args(2));
  // The slow one is applied and never answered: the client times out after the profile's 1 s.
  e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
  await e.dispatcher(4);
  const deadline = Date.now() + 10_000;
  while (e.provider.requestsFor(slow.effect_key) === 0 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 10));
  t.equal(e.provider.requestsFor(slow.effect_key), 1, 'the request reached the provider');
  // A revocation (the policy rotated) issued now must not commit while the request is out.
  const revoked = await e.pool.query<{ status: string }>(
    "UPDATE actionledger.operations SET current_policy_version = 'policy-2' WHERE operation_id = $1 RETURNING status",
    [slow.operation_id],
  );
  t.equal(revoked.rows[0]?.status, 'unknown', 'the revocation waited until the outcome had committed');
  t.equal((await settled(e.pool, slow.operation_id)).status, 'unknown');
  t.equal((await settled(e.pool, mate.operation_id)).status, 'succeeded', 'its batch-mate succeeded');
  t.equal(e.provider.requestsFor(mate.effect_key), 1);
});

// A dispatch batch's locks and sends when a batch-mate fails, a row is held elsewhere, or a switch is engaged.

async function untilSent(e: DispatchEnv, key: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (e.provider.requestsFor(key) === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
}

t.test(
  "one batch-mate's failed outcome write does not release the others' locks while their requests are out",
  async (t) => {
    // The provider's timeout stays the profile's 1 s: the slow request is cut by it.
    const { e, d, proxy } = await dispatcherThroughProxy(t, { concurrency: 16, profile: {}, watchBatch: false });
    const mates = [];
    for (let i = 1; i <= 6; i++) mates.push(await e.ledger.reserve(ctx(`mate-${i}`), 'issue_refund', args(i)));
    const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(0));
    for (let i = 7; i <= 12; i++) mates.push(await e.ledger.reserve(ctx(`mate-${i}`), 'issue_refund', args(i)));
    // The slow operation's outcome write fails once with a deadlock (as a gate counter trigger can): the batch
    // statement fails, and must be redone under the same locks.
    await e.pool.query(`
    CREATE SEQUENCE public.poison_seq;
    CREATE FUNCTION public.poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.operation_id = '${slow.operation_id}' AND NEW.status NOT IN ('pending', 'executing') AND nextval('public.poison_seq') = 1 THEN
        RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = '40P01';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER poison BEFORE UPDATE ON actionledger.operations FOR EACH ROW EXECUTE FUNCTION public.poison();`);
    e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
    // The slow operation shares its dispatch batch with mates whatever the timing: its authorization is answered
    // only once the first dispatch batch (mates only) is held at the proxy, and that batch is let go only once
    // every operation's decision has been answered, so the rest queue behind it (13 of 16 slots taken: one
    // opening at a time) and open together.
    let answerSlow!: () => void;
    const slowAnswered = new Promise<void>((resolve) => (answerSlow = resolve));
    let answered = 0;
    const decide = e.authorizer.decide;
    e.authorizer.decide = async (request) => {
      if (request.operation_id === slow.operation_id) await slowAnswered;
      const decision = await decide(request);
      answered++;
      return decision;
    };
    t.teardown(() => answerSlow());
    const firstBatch = proxy.holdNextRequests();
    await d.start();
    await firstBatch.arrived;
    answerSlow();
    const deadline = Date.now() + 10_000;
    while (answered < 13 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    t.equal(answered, 13, 'every decision was answered while the first batch is held');
    t.equal(e.provider.requests().length, 0, 'nothing was sent yet');
    // A margin for the answers to reach the dispatcher and queue for a dispatch batch.
    await new Promise((r) => setTimeout(r, 200));
    t.equal(await evidenceRows(e.pool, slow.operation_id), 0, "the slow one's evidence waits for the next batch");
    firstBatch.release();
    await untilSent(e, slow.effect_key);
    await new Promise((r) => setTimeout(r, 100));
    const { rows: open } = await e.pool.query<{ operation_id: string }>(
      "SELECT operation_id FROM actionledger.operations WHERE status = 'executing'",
    );
    const sentUncommitted = mates.filter(
      (m) => e.provider.requestsFor(m.effect_key) === 1 && open.some((o) => o.operation_id === m.operation_id),
    );
    t.ok(sentUncommitted.length > 0, `the slow operation has batch-mates at the provider (${sentUncommitted.length})`);
    const revoked = await Promise.all(
      sentUncommitted.map((m) =>
        e.pool
          .query<{ status: string }>(
            "UPDATE actionledger.operations SET current_policy_version = 'policy-2' WHERE operation_id = $1 RETURNING status",
            [m.operation_id],
          )
          .then((r) => r.rows[0]?.status),
      ),
    );
    t.same(
      revoked.filter((s) => s === 'executing'),
      [],
      'every revocation waited for its outcome',
    );
    for (const m of mates) t.equal((await settled(e.pool, m.operation_id)).status, 'succeeded');
    t.equal(
      (await settled(e.pool, slow.operation_id)).status,
      'unknown',
      'the slow one: unknown, written after the deadlock',
    );
  },
);

t.test(
  "a batch-mate whose evidence is refused is written to review at once, while the batch's requests are out",
  async (t) => {
    // 30 s timeouts: the hanging request stays out for the whole test.
    const { e, d, proxy } = await dispatcherThroughProxy(t, { concurrency: 4, watchBatch: false });
    const plug = await e.ledger.reserve(ctx('plug'), 'issue_refund', args(0));
    const hanging = await e.ledger.reserve(ctx('hanging'), 'issue_refund', args(1));
    const stale = await e.ledger.reserve(ctx('stale'), 'issue_refund', args(2));
    e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === hanging.effect_key });
    // The plug's batch is held at the proxy while the other two are answered, so they queue behind it (3 of 4
    // slots taken: one opening at a time) and open together. The stale one's policy rotates before its answer:
    // its evidence is refused in that batch.
    let answerRest!: () => void;
    const restAnswered = new Promise<void>((resolve) => (answerRest = resolve));
    t.teardown(() => answerRest());
    let answered = 0;
    const decide = e.authorizer.decide;
    e.authorizer.decide = async (request) => {
      if (request.operation_id !== plug.operation_id) await restAnswered;
      if (request.operation_id === stale.operation_id)
        await e.pool.query(
          "UPDATE actionledger.operations SET current_policy_version = 'policy-2' WHERE operation_id = $1",
          [stale.operation_id],
        );
      const decision = await decide(request);
      if (request.operation_id !== plug.operation_id) answered++;
      return decision;
    };
    const first = proxy.holdNextRequests();
    await d.start();
    await first.arrived;
    answerRest();
    const deadline = Date.now() + 10_000;
    while (answered < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    await new Promise((r) => setTimeout(r, 200));
    first.release();
    await untilSent(e, hanging.effect_key);
    // Its decision was for the old policy: refused at its evidence and given back to the queue at once.
    const deadline2 = Date.now() + 10_000;
    while ((await releases(e.pool, stale.operation_id)).length === 0 && Date.now() < deadline2)
      await new Promise((r) => setTimeout(r, 10));
    t.match((await releases(e.pool, stale.operation_id))[0], {
      to_status: 'pending',
      reason: 'released:authorization_stale',
      detail: { stage: 'evidence' },
    });
    t.equal(e.provider.requestsFor(stale.effect_key), 0, 'never sent under that decision');
    t.equal(
      await statusOf(e.pool, hanging.operation_id),
      'executing',
      "written while its batch-mate's request is still out: the batch never locked its row",
    );
    t.equal((await settled(e.pool, plug.operation_id)).status, 'succeeded');
    // Drop the hanging socket now (its request ends unknown), so the teardown's drain does not wait 30 s.
    await e.provider.stop();
  },
);

t.test('the dispatch lock skips a row another session holds instead of waiting for it', async (t) => {
  const e = await dispatchEnv(t, ROOMY);
  const q = bindQueries(dispatcherQueries, '"actionledger"');
  const a = await e.ledger.reserve(ctx('a'), 'issue_refund', args(1));
  const b = await e.ledger.reserve(ctx('b'), 'issue_refund', args(2));
  const both = [a.operation_id, b.operation_id];
  // Claimed by hand, with evidence valid for a minute.
  await e.pool.query(
    "UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid(), claimed_by = 'w', claimed_at = now() WHERE operation_id = ANY($1)",
    [both],
  );
  await e.pool.query(
    `INSERT INTO actionledger.authorization_evidence (operation_id, attempt, claim_token, approval_id, policy_version, args_sha256, decision_sha256, authorized_at, expires_at)
     SELECT operation_id, attempt, claim_token, current_approval_id, current_policy_version, canonical_args_sha256, 'x', now(), now() + interval '1 minute'
     FROM actionledger.operations WHERE operation_id = ANY($1)`,
    [both],
  );
  const { rows: ops } = await e.pool.query<{ operation_id: string; claim_token: string }>(
    'SELECT operation_id, claim_token FROM actionledger.operations WHERE operation_id = ANY($1) ORDER BY operation_id',
    [both],
  );
  const holder = await e.pool.connect();
  const batch = await e.pool.connect();
  t.teardown(() => {
    holder.release();
    batch.release();
  });
  // Someone holds the second row (a reviewer, a revocation in progress): the batch takes the first and goes on.
  await holder.query('BEGIN');
  await holder.query('SELECT 1 FROM actionledger.operations WHERE operation_id = $1 FOR UPDATE', [
    ops[1]!.operation_id,
  ]);
  await batch.query('BEGIN');
  const ids = ops.map((o) => o.operation_id);
  const tokens = ops.map((o) => o.claim_token);
  const { rows: locked } = await batch.query<{ operation_id: string; claim_token: string; locked: boolean }>(
    q.operationLockForDispatchBatch,
    [ids, tokens],
  );
  await batch.query('ROLLBACK');
  await holder.query('ROLLBACK');
  t.same(
    locked.sort((x, y) => (x.operation_id < y.operation_id ? -1 : 1)),
    [
      { ...ops[0]!, locked: true },
      { ...ops[1]!, locked: false },
    ],
    'the free row is locked; the held one is reported as still claimed but not locked',
  );
});

t.test(
  "a batch's statements answer by claim: an earlier claim of the same operation gets no evidence, lock or check",
  async (t) => {
    // A worker that lost a claim to the reconciler may claim the operation again while its first claim still
    // waits for a batch: the two items can meet in one batch, and only the current claim may be answered.
    const e = await dispatchEnv(t, ROOMY);
    const q = bindQueries(dispatcherQueries, '"actionledger"');
    const op = await e.ledger.reserve(ctx('reclaimed'), 'issue_refund', args(3));
    const { rows } = await e.pool.query<{
      claim_token: string;
      attempt: number;
      approval: string;
      policy: string;
      sha: string;
    }>(
      `UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid(), claimed_by = 'w', claimed_at = now()
       WHERE operation_id = $1
       RETURNING claim_token, attempt, current_approval_id AS approval, current_policy_version AS policy, canonical_args_sha256 AS sha`,
      [op.operation_id],
    );
    const now = rows[0]!;
    const earlier = '00000000-0000-4000-8000-000000000001';
    const id = op.operation_id;
    const at = new Date().toISOString();
    const until = new Date(Date.now() + 30_000).toISOString();
    const { rows: evidence } = await e.pool.query<{ claim_token: string; locked: boolean; recorded: boolean }>(
      q.evidenceRecordBatch,
      [
        [id, id],
        [earlier, now.claim_token],
        [now.attempt, now.attempt],
        [now.approval, now.approval],
        [now.policy, now.policy],
        [now.sha, now.sha],
        ['d1', 'd2'],
        [at, at],
        [until, until],
        60_000,
        60_000,
        5_000,
      ],
    );
    t.same(
      evidence.map((r) => [r.claim_token, r.locked, r.recorded]),
      [[now.claim_token, true, true]],
      'one answer, for the current claim',
    );
    const { rows: recorded } = await e.pool.query<{ claim_token: string }>(
      'SELECT claim_token FROM actionledger.authorization_evidence WHERE operation_id = $1',
      [id],
    );
    t.same(
      recorded.map((r) => r.claim_token),
      [now.claim_token],
      'no evidence recorded under the earlier claim',
    );
    const batch = await e.pool.connect();
    t.teardown(() => batch.release());
    await batch.query('BEGIN');
    const { rows: locked } = await batch.query<{ claim_token: string; locked: boolean }>(
      q.operationLockForDispatchBatch,
      [
        [id, id],
        [earlier, now.claim_token],
      ],
    );
    const { rows: checked } = await batch.query<{ claim_token: string }>(q.operationFinalCheckBatch, [
      [id, id],
      [earlier, now.claim_token],
      60_000,
    ]);
    await batch.query('ROLLBACK');
    t.same(
      locked.map((r) => [r.claim_token, r.locked]),
      [[now.claim_token, true]],
      'the lock answers for the current claim only',
    );
    t.same(
      checked.map((r) => r.claim_token),
      [now.claim_token],
      'so does the final check',
    );
  },
);

t.test(
  'a kill switch engaged after the decision was recorded stops the send at the final check; the operation waits in the queue',
  async (t) => {
    const e = await dispatchEnv(t);
    const op = await e.ledger.reserve(ctx('ks'), 'issue_refund', args(7));
    await e.pool.query(`
    CREATE FUNCTION public.kill_after_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-a', '*', 'oncall', 'incident') ON CONFLICT DO NOTHING;
      RETURN NEW;
    END $$;
    CREATE TRIGGER kill_after_evidence AFTER INSERT ON actionledger.authorization_evidence FOR EACH ROW EXECUTE FUNCTION public.kill_after_evidence();`);
    await e.dispatcher(2);
    const deadline = Date.now() + 10_000;
    while ((await releases(e.pool, op.operation_id)).length === 0 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    t.match(await releases(e.pool, op.operation_id), [
      { to_status: 'pending', reason: 'released:tool_disabled', detail: { stage: 'final_check', releases: 0 } },
    ]);
    // Held in the queue while the switch is engaged: never claimed, never sent, never in review.
    await new Promise((r) => setTimeout(r, 1500));
    t.equal(await statusOf(e.pool, op.operation_id), 'pending', 'waits in the queue');
    t.equal(e.provider.requestsFor(op.effect_key), 0, 'nothing sent under an engaged kill switch');
    await e.pool.query('DROP TRIGGER kill_after_evidence ON actionledger.authorization_evidence');
    await e.pool.query('DELETE FROM actionledger.gate_kill_switches');
    e.ledger.wake();
    t.equal((await settled(e.pool, op.operation_id)).status, 'succeeded', 'dispatched once the switch is lifted');
    t.equal(e.provider.requestsFor(op.effect_key), 1, 'sent once');
  },
);

t.test(
  'engaging a kill switch takes effect at once, then waits for the requests already at the provider',
  async (t) => {
    const e = await dispatchEnv(t, { provider_http_timeout_seconds: 3 });
    const g = await gateFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint });
    const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(1));
    e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
    await e.dispatcher(8);
    await untilSent(e, slow.effect_key);
    t.equal(e.provider.requestsFor(slow.effect_key), 1, 'the request is out');
    const engaging = g.gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'incident');
    // Once the switch has committed (a loaded machine may take a while), it waits for the slow request.
    for (let i = 0; i < 300; i++) {
      const { rows } = await e.pool.query('SELECT 1 FROM actionledger.gate_kill_switches');
      if (rows.length > 0) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    // Reserved while the switch waits for the slow request: held, never sent.
    const late = await e.ledger.reserve(ctx('late'), 'issue_refund', args(2));
    const waited = await engaging;
    t.same(
      waited,
      { pending_held: 0, executing: 1, still_in_flight: 0 },
      'it waited for the one covered request at the provider',
    );
    const { rows } = await e.pool.query<{ operation_id: string; status: string }>(
      'SELECT operation_id, status FROM actionledger.operations WHERE operation_id = ANY($1)',
      [[slow.operation_id, late.operation_id]],
    );
    const status = new Map(rows.map((r) => [r.operation_id, r.status]));
    t.equal(status.get(slow.operation_id), 'unknown', 'the switch returned only after the outcome was recorded');
    await new Promise((r) => setTimeout(r, 500));
    t.equal(e.provider.requestsFor(late.effect_key), 0, 'an operation reserved meanwhile is not sent');
    t.equal(
      (
        await e.pool.query<{ status: string }>('SELECT status FROM actionledger.operations WHERE operation_id = $1', [
          late.operation_id,
        ])
      ).rows[0]?.status,
      'pending',
      'it is held',
    );
  },
);

t.test(
  'a provider hanging longer than the statement timeout does not stop a kill switch from being engaged',
  async (t) => {
    const e = await dispatchEnv(t, { provider_http_timeout_seconds: 4 });
    const gatePool = createPool(e.url, { max: 4, statementTimeoutMs: 1000, applicationName: 'gate-short' });
    t.teardown(() => gatePool.end());
    const g = await gateFixture(t, { url: e.url, pool: gatePool, endpoint: e.provider.endpoint });
    const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(1));
    e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
    await e.dispatcher(8);
    await untilSent(e, slow.effect_key);
    const waited = await g.gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'incident');
    t.same(
      waited,
      { pending_held: 0, executing: 1, still_in_flight: 1 },
      'engaged, and it says one request was still out',
    );
    const engaged = await e.pool.query('SELECT 1 FROM actionledger.gate_kill_switches');
    t.equal(engaged.rowCount, 1, 'the switch is engaged');
    const after = await e.ledger.reserve(ctx('after'), 'issue_refund', args(2));
    await new Promise((r) => setTimeout(r, 500));
    t.equal(e.provider.requestsFor(after.effect_key), 0, 'nothing covered is sent afterwards');
    t.equal((await settled(e.pool, slow.operation_id)).status, 'unknown');
  },
);

t.test(
  'a batch connection lost while its requests are out neither crashes the worker nor loses the outcome',
  async (t) => {
    // The hanging request is cut after 3 s: time enough, on a loaded machine, to find the batch still open.
    const e = await dispatchEnv(t, { provider_http_timeout_seconds: 3 });
    const slow = await e.ledger.reserve(ctx('slow'), 'issue_refund', args(0));
    e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
    let uncaught: Error | null = null;
    const onUncaught = (err: Error): void => {
      uncaught = err;
    };
    process.on('uncaughtException', onUncaught);
    t.teardown(() => process.off('uncaughtException', onUncaught));
    await e.dispatcher(4);
    await untilSent(e, slow.effect_key);
    const killed = await e.pool.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()",
    );
    t.equal(killed.rowCount, 1, "the batch's connection was terminated");
    const done = await settled(e.pool, slow.operation_id);
    t.equal(uncaught, null, 'no uncaught exception');
    t.equal(done.status, 'unknown', 'the outcome was written again on another connection');
  },
);

t.test(
  "a provider that hangs holds only its own batch-mates: another provider's operations succeed while its request is out",
  async (t) => {
    // Two providers (two provider ids; the sandbox serves both paths). Every request to the first is applied
    // and never answered, within a 30 s client timeout that outlasts the test.
    const e = await dispatchEnv(t, ROOMY, { voidRefund: { provider_id: 'voids-test' } });
    const hanging: Awaited<ReturnType<typeof e.ledger.reserve>>[] = [];
    const healthy = [];
    for (let i = 0; i < 6; i++) {
      hanging.push(await e.ledger.reserve(ctx(`hang-${i}`), 'issue_refund', args(i)));
      healthy.push(
        await e.ledger.reserve(ctx(`void-${i}`), 'void_refund', { refund_id: `re-${i}`, order_id: `ord-${i}` }),
      );
    }
    e.provider.inject(
      { kind: 'timeout', commit: true },
      { times: Infinity, when: (k) => hanging.some((h) => h.effect_key === k) },
    );
    await e.dispatcher(12);
    for (const h of hanging) await untilSent(e, h.effect_key);
    for (const r of healthy) {
      t.equal((await settled(e.pool, r.operation_id)).status, 'succeeded', 'the healthy provider: succeeded');
      t.equal(e.provider.requestsFor(r.effect_key), 1, 'sent once');
    }
    const { rows } = await e.pool.query<{ status: string }>(
      'SELECT status FROM actionledger.operations WHERE operation_id = ANY($1::uuid[])',
      [hanging.map((h) => h.operation_id)],
    );
    t.same(
      rows.map((r) => r.status),
      Array(6).fill('executing'),
      'meanwhile every request to the hanging provider is still out',
    );
    // Drop the hanging sockets now (the requests end unknown), so the teardown's drain does not wait out the
    // 30 s client timeout.
    await e.provider.stop();
  },
);

/**
 * Reserves one operation whose evidence statement will wait on an advisory lock the test holds (so its dispatch
 * batch stays in its opening phase); `letGo` releases the lock (and runs at teardown).
 */
async function holdEvidence(t: Test, e: DispatchEnv): Promise<{ stuck: Reserved; letGo: () => Promise<void> }> {
  const stuck = await e.ledger.reserve(ctx('stuck'), 'issue_refund', args(1));
  await pauseEvidenceOn(e.pool, stuck.operation_id, 4242);
  const holder = await e.pool.connect();
  let held = true;
  const letGo = async () => {
    if (!held) return;
    held = false;
    await holder.query('SELECT pg_advisory_unlock(4242)');
    holder.release();
  };
  t.teardown(letGo);
  await holder.query('SELECT pg_advisory_lock(4242)');
  return { stuck, letGo };
}

/** Polls (up to 10 s) until a session waits on an advisory lock; returns how many do. */
async function evidenceWaiting(pool: Pool): Promise<number> {
  const deadline = Date.now() + 10_000;
  let waiting = 0;
  while (waiting === 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 10));
    const { rows } = await pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    );
    waiting = rows[0]!.n;
  }
  return waiting;
}

/**
 * One operation's evidence statement waits on an advisory lock the test holds, so its dispatch batch stays in
 * its opening phase; then a second operation is reserved. With `concurrency` 4 the two take half the slots and
 * a second dispatch batch may open; with 2 they take every slot and it may not.
 */
async function nextBehindStuckEvidence(
  t: Test,
  concurrency: number,
  whileStuck: (e: DispatchEnv, stuck: Reserved, next: Reserved, asked: Set<string>) => Promise<void>,
): Promise<void> {
  const e = await dispatchEnv(t, ROOMY);
  const asked = recordAsked(e);
  const { stuck, letGo } = await holdEvidence(t, e);
  await e.dispatcher(concurrency);
  t.equal(await evidenceWaiting(e.pool), 1, "the first operation's dispatch batch waits on the lock");
  const next = await e.ledger.reserve(ctx('next'), 'issue_refund', args(2));
  await whileStuck(e, stuck, next, asked);
  t.equal(e.provider.requestsFor(stuck.effect_key), 0, 'the first is unsent while its evidence waits');
  await letGo();
  for (const op of [stuck, next]) {
    t.equal((await settled(e.pool, op.operation_id)).status, 'succeeded', 'let go, both succeed');
    t.equal(e.provider.requestsFor(op.effect_key), 1, 'each sent once');
  }
}

type Reserved = { operation_id: string; effect_key: string };

t.test(
  'an evidence statement that waits on a lock does not hold the next operation while most slots are free: two batches open at once',
  (t) =>
    nextBehindStuckEvidence(t, 4, async (e, stuck, next) => {
      const done = await settled(e.pool, next.operation_id);
      t.equal(done.status, 'succeeded', 'the next operation succeeded through a second dispatch batch meanwhile');
      t.equal(e.provider.requestsFor(next.effect_key), 1, 'sent once');
      t.equal(await statusOf(e.pool, stuck.operation_id), 'executing', 'while the first one still waits');
    }),
);

/** Records the operations the sandbox authorizer is asked about, from now on (whatever it decides). */
function recordAsked(e: DispatchEnv): Set<string> {
  const asked = new Set<string>();
  const decide = e.authorizer.decide;
  e.authorizer.decide = (req) => {
    asked.add(req.operation_id);
    return decide(req);
  };
  return asked;
}

async function askedAbout(asked: Set<string>, operationId: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!asked.has(operationId) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
}

t.test('with every slot taken, one dispatch batch opens at a time: the next operation waits its turn', (t) =>
  nextBehindStuckEvidence(t, 2, async (e, _stuck, next, asked) => {
    // It is claimed (both slots taken) and authorized; its evidence waits for the open batch.
    await askedAbout(asked, next.operation_id);
    t.equal(await statusOf(e.pool, next.operation_id), 'executing', 'the next operation is claimed');
    await new Promise((r) => setTimeout(r, 500));
    t.equal(
      await evidenceRows(e.pool, next.operation_id),
      0,
      'no evidence recorded for it while the one batch is open',
    );
    t.equal(await statusOf(e.pool, next.operation_id), 'executing', 'still executing');
    t.equal(e.provider.requestsFor(next.effect_key), 0, 'and unsent');
  }),
);

t.test('a slot that frees lets a waiting operation open a second dispatch batch at once', async (t) => {
  const e = await dispatchEnv(t, ROOMY);
  const { stuck, letGo } = await holdEvidence(t, e);
  // The denied operation's answer waits for the test: until then it holds a slot.
  let answer!: () => void;
  const answered = new Promise<void>((r) => (answer = r));
  const denied = await e.ledger.reserve(ctx('denied'), 'issue_refund', args(2));
  e.authorizer.decide = async (req) => {
    if (req.operation_id !== denied.operation_id) return 'allow';
    await answered;
    return 'deny';
  };
  const asked = recordAsked(e);
  await e.dispatcher(4);
  await askedAbout(asked, denied.operation_id);
  t.equal(await evidenceWaiting(e.pool), 1, "the first operation's dispatch batch waits on the lock");
  // Three of four slots taken: one opening, and it is busy.
  const next = await e.ledger.reserve(ctx('next'), 'issue_refund', args(3));
  await askedAbout(asked, next.operation_id);
  await new Promise((r) => setTimeout(r, 500));
  t.equal(e.provider.requestsFor(next.effect_key), 0, 'with three of four slots taken, the next one waits');
  answer();
  t.equal((await settled(e.pool, denied.operation_id)).status, 'needs_review', 'the denied one frees its slot');
  t.equal(
    (await settled(e.pool, next.operation_id)).status,
    'succeeded',
    'the waiting one opened a second dispatch batch as the slot freed',
  );
  t.equal(e.provider.requestsFor(next.effect_key), 1, 'sent once');
  t.equal(await statusOf(e.pool, stuck.operation_id), 'executing', 'while the first one still waits');
  await letGo();
  t.equal((await settled(e.pool, stuck.operation_id)).status, 'succeeded', 'let go, it succeeds');
  t.equal(e.provider.requestsFor(stuck.effect_key), 1, 'sent once');
});
