import t from 'tap';
import { spawn } from 'node:child_process';
import { BIN, lastJson, runCli } from '../helpers/cli.js';
import {
  ctx,
  dispatchEnv,
  IN_FLIGHT_WAIT_MS,
  passUntilResolved,
  patchProvider,
  settled,
  type DispatchEnv,
} from '../helpers/fleet.js';
import { nodeCommand } from '../helpers/node-child.js';

type Row = {
  status: string;
  review_reason: string | null;
  provider_receipt: string | null;
  claim_token: string | null;
  attempt: number;
  reconcile_attempts: number;
};

async function row(e: DispatchEnv, id: string): Promise<Row> {
  const { rows } = await e.pool.query<Row>(
    'SELECT status, review_reason, provider_receipt, claim_token, attempt, reconcile_attempts FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0] as Row;
}

async function history(
  e: DispatchEnv,
  id: string,
): Promise<
  {
    from_status: string | null;
    to_status: string;
    actor: string;
    reason: string;
    detail: Record<string, unknown> | null;
  }[]
> {
  const { rows } = await e.pool.query(
    'SELECT from_status, to_status, actor, reason, detail FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [id],
  );
  return rows as never;
}

/** A dispatcher worker process armed to SIGKILL itself at `crashAt`; resolves when it has died. */
function crashingWorker(e: DispatchEnv, crashAt: string): Promise<{ code: number | null; signal: string | null }> {
  const child = spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', '1']), {
    env: { PATH: process.env.PATH, ...e.env, ACTIONLEDGER_CRASH_POINTS_ENABLED: '1', ACTIONLEDGER_CRASH_AT: crashAt },
    stdio: ['ignore', 'ignore', 'ignore'],
  });
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

const readbacks = (e: DispatchEnv, key: string): number =>
  e.provider.requests().filter((r) => r.method === 'GET' && r.path.endsWith(`/by-key/${encodeURIComponent(key)}`))
    .length;

/** Runs passes until one examines the operation (its worker's heartbeat must first go stale). */
async function passUntilExamined(
  kit: Awaited<ReturnType<DispatchEnv['reconciler']>>,
  timeoutMs = 15_000,
): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let passes = 0;
  for (;;) {
    passes++;
    const s = await kit.pass();
    if (s.reconcile.examined > 0) return passes;
    if (Date.now() > deadline) throw new Error('no pass examined the operation');
    await new Promise((r) => setTimeout(r, 200));
  }
}

t.test(
  'worker SIGKILLed after the provider applied the effect: readback marks it succeeded; one request',
  async (t) => {
    const e = await dispatchEnv(t);
    const r = await e.ledger.reserve(ctx('applied-then-killed'), 'issue_refund', {
      order_id: 'o-1',
      amount: 100,
      currency: 'EUR',
    });
    const died = await crashingWorker(e, 'after_response_before_outcome');
    t.equal(died.signal, 'SIGKILL');
    t.equal((await row(e, r.operation_id)).status, 'executing', 'the outcome was never written');
    t.equal(e.provider.effectsFor(r.effect_key), 1, 'the provider applied it');
    const kit = await e.reconciler();
    // The dead worker's last heartbeat is set by hand, so no time the machine takes can make it stale early.
    await e.pool.query("UPDATE actionledger.workers SET heartbeat_at = now() + interval '1 hour'");
    const first = await kit.pass();
    t.equal(first.reconcile.examined, 0, 'a claim whose worker heartbeated recently is not touched yet');
    t.equal((await row(e, r.operation_id)).status, 'executing');
    await e.pool.query("UPDATE actionledger.workers SET heartbeat_at = now() - interval '1 hour'");
    t.equal(await passUntilExamined(kit), 1, 'a stale heartbeat: the next pass examines it');
    const after = await row(e, r.operation_id);
    t.equal(after.status, 'succeeded');
    t.equal(
      after.provider_receipt,
      e.provider.allEffects().find((x) => x.key === r.effect_key)?.operationId,
      'the receipt the provider reports',
    );
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'the provider saw exactly one request');
    const h = await history(e, r.operation_id);
    t.match(h.at(-1), { from_status: 'executing', to_status: 'succeeded', reason: 'readback_applied' });
    t.match(h.at(-1)?.actor, /^reconciler:/);
    const checks = await e.pool.query(
      'SELECT outcome, from_status FROM actionledger.reconciliation_checks WHERE operation_id = $1',
      [r.operation_id],
    );
    t.same(checks.rows, [{ outcome: 'applied', from_status: 'executing' }]);
  },
);

t.test(
  'SIGKILLed before the request left: no effect -> needs_review; a reviewed retry dispatches once with the same key',
  async (t) => {
    const e = await dispatchEnv(t);
    const r = await e.ledger.reserve(ctx('killed-before-send'), 'issue_refund', {
      order_id: 'o-2',
      amount: 200,
      currency: 'EUR',
    });
    const died = await crashingWorker(e, 'after_evidence_commit');
    t.equal(died.signal, 'SIGKILL');
    t.equal(e.provider.requestsFor(r.effect_key), 0);
    const kit = await e.reconciler();
    await passUntilExamined(kit);
    // "No effect" is trusted once a request can no longer be inside the provider: a later pass concludes.
    await passUntilResolved(e.pool, kit, r.operation_id);
    const reviewed = await row(e, r.operation_id);
    t.match(reviewed, { status: 'needs_review', review_reason: 'no_effect_confirmed' });

    await t.rejects(
      kit.review.retry(r.operation_id, { actor: '', reason: 'x' }),
      { code: 'invalid_review' },
      'who did it is required',
    );
    const retried = await kit.review.retry(r.operation_id, {
      actor: 'alice@ops',
      reason: 'provider confirmed no refund was made',
    });
    t.match(retried, { ok: true, from: 'needs_review', to: 'pending', attempt: 2 });
    await t.rejects(
      kit.review.retry(r.operation_id, { actor: 'bob', reason: 'again' }),
      { code: 'invalid_state_transition' },
      'a second retry changes nothing',
    );
    await e.dispatcher(2);
    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'succeeded');
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'dispatched once');
    t.equal(e.provider.effectsFor(r.effect_key), 1, 'the provider ends with one effect');
    const keys = e.provider
      .requests()
      .filter((q) => q.method === 'POST')
      .map((q) => q.key);
    t.same(keys, [r.effect_key], 'with the same effect key');
    const evidence = await e.pool.query(
      'SELECT attempt FROM actionledger.authorization_evidence WHERE operation_id = $1 ORDER BY attempt',
      [r.operation_id],
    );
    t.same(evidence.rows, [{ attempt: 1 }, { attempt: 2 }], 'the retry passed a fresh authorization of its own');
    const h = await history(e, r.operation_id);
    t.match(
      h.find((x) => x.reason === 'review:retry'),
      {
        actor: 'alice@ops',
        from_status: 'needs_review',
        to_status: 'pending',
        detail: { why: 'provider confirmed no refund was made', attempt: 2 },
      },
    );
  },
);

t.test(
  "a live, slow worker's executing row is not touched; a late completion racing the reconciler: one wins",
  async (t) => {
    const e = await dispatchEnv(
      t,
      { authorization_http_timeout_seconds: 10, provider_http_timeout_seconds: 10 },
      { reconciler: { orphan_after_ms: 1000 } },
    );
    const kit = await e.reconciler();

    // 1. Live and slow (waiting for its authorization, holding no row lock): heartbeats keep it alive.
    const slow = await e.ledger.reserve(ctx('slow-auth'), 'issue_refund', {
      order_id: 'o-3',
      amount: 300,
      currency: 'EUR',
    });
    e.authorizer.inject({ kind: 'slow', delayMs: 3000 });
    await e.dispatcher(1);
    while ((await row(e, slow.operation_id)).status !== 'executing') await new Promise((r) => setTimeout(r, 20));
    const claim = (await row(e, slow.operation_id)).claim_token;
    await new Promise((r) => setTimeout(r, 1500)); // older than orphan_after_ms: age alone must not decide
    const s = await kit.pass();
    t.equal(s.reconcile.examined, 0, 'not examined');
    t.match(await row(e, slow.operation_id), { status: 'executing', claim_token: claim });
    t.equal(readbacks(e, slow.effect_key), 0, 'not even read back');
    t.equal((await settled(e.pool, slow.operation_id)).status, 'succeeded', 'the worker finishes it');

    // 2. The worker is recorded stopped while it still holds a claim it has recorded no evidence under: the
    //    reconciler wins and gives the operation back to the queue without a readback (no request of that claim
    //    left); the worker's fenced evidence write then changes nothing and it sends nothing under that claim.
    //    Its authorization is answered only after the pass: the pass cannot lose the row to the worker.
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    t.teardown(() => answer());
    const decide = e.authorizer.decide;
    e.authorizer.decide = async (request) => {
      await answered;
      return decide(request);
    };
    const late = await e.ledger.reserve(ctx('late-worker'), 'issue_refund', {
      order_id: 'o-4',
      amount: 400,
      currency: 'EUR',
    });
    while ((await row(e, late.operation_id)).status !== 'executing') await new Promise((r) => setTimeout(r, 20));
    await e.pool.query('UPDATE actionledger.workers SET stopped_at = now()');
    const won = await kit.pass();
    answer();
    e.authorizer.decide = decide;
    t.equal(won.reconcile.released, 1, 'released, not escalated');
    t.equal(won.reconcile.escalated, 0);
    t.equal(readbacks(e, late.effect_key), 0, 'no readback: nothing of that claim was sent');
    const h = await history(e, late.operation_id);
    const release = h.find((x) => x.from_status === 'executing');
    t.match(release, { to_status: 'pending', reason: 'released:worker_lost' });
    // The operation is claimed again after its backoff and sent once, under the new claim only.
    t.equal((await settled(e.pool, late.operation_id)).status, 'succeeded');
    t.equal(e.provider.requestsFor(late.effect_key), 1, 'one request, under the new claim');
    const { rows: evidence } = await e.pool.query<{ claim_token: string }>(
      'SELECT claim_token FROM actionledger.authorization_evidence WHERE operation_id = $1',
      [late.operation_id],
    );
    t.notOk(
      evidence.some((x) => x.claim_token === (release?.detail as { claim_token?: string } | null)?.claim_token),
      'the late worker recorded no evidence under the claim the reconciler ended',
    );

    // 3. A worker inside its provider call holds the row lock: the reconciler skips it and the worker wins.
    const inCall = await e.ledger.reserve(ctx('in-call'), 'issue_refund', {
      order_id: 'o-5',
      amount: 500,
      currency: 'EUR',
    });
    //    The provider answers only after the pass: the call is still out whatever the timing.
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    let respond!: () => void;
    const responding = new Promise<void>((resolve) => (respond = resolve));
    t.teardown(() => respond());
    patchProvider(e.provider, (orig) => async (req, res) => {
      if (req.method === 'POST' && req.headers['idempotency-key'] === inCall.effect_key) {
        arrive();
        await responding;
      }
      return orig(req, res);
    });
    await arrived;
    await e.pool.query('UPDATE actionledger.workers SET stopped_at = now()');
    const skipped = await kit.pass();
    respond();
    t.equal(skipped.reconcile.examined, 0);
    t.equal(skipped.reconcile.skipped, 1, 'skipped: locked by the dispatcher');
    const done = await settled(e.pool, inCall.operation_id);
    t.equal(done.status, 'succeeded', "the worker's outcome stands");
    t.equal(e.provider.requestsFor(inCall.effect_key), 1);
  },
);

t.test(
  'unknown outcomes: applied -> succeeded; inconclusive backs off and escalates after N; no contract -> review at once',
  async (t) => {
    const e = await dispatchEnv(
      t,
      {},
      { reconciler: { backoff_initial_ms: 60_000, backoff_max_ms: 120_000, max_attempts: 3 } },
    );
    const applied = await e.ledger.reserve(ctx('u-applied'), 'issue_refund', {
      order_id: 'o-6',
      amount: 1,
      currency: 'EUR',
    });
    const vague = await e.ledger.reserve(ctx('u-vague'), 'issue_refund', {
      order_id: 'o-7',
      amount: 2,
      currency: 'EUR',
    });
    e.provider.inject({ kind: 'commitThenReset' }, { when: (k) => k === applied.effect_key });
    e.provider.inject({ kind: 'resetBeforeCommit' }, { when: (k) => k === vague.effect_key });
    e.provider.inject({ kind: 'readbackInconclusive' }, { when: (k) => k === vague.effect_key, times: Infinity });
    await e.dispatcher(2);
    t.equal((await settled(e.pool, applied.operation_id)).status, 'unknown');
    t.equal((await settled(e.pool, vague.operation_id)).status, 'unknown');
    const kit = await e.reconciler();

    const p1 = await kit.pass();
    t.match(p1.reconcile, { examined: 2, succeeded: 1, still_unknown: 1, escalated: 0 });
    t.equal((await row(e, applied.operation_id)).status, 'succeeded');
    t.match(await row(e, vague.operation_id), { status: 'unknown', reconcile_attempts: 1 });
    // The backoffs are long, so no pass can find the row due by accident; the test makes it due by hand.
    const dueIn = async () =>
      (
        await e.pool.query<{ s: number }>(
          'SELECT extract(epoch FROM next_reconcile_at - now())::float8 AS s FROM actionledger.operations WHERE operation_id = $1',
          [vague.operation_id],
        )
      ).rows[0]!.s;
    const makeDue = () =>
      e.pool.query('UPDATE actionledger.operations SET next_reconcile_at = now() WHERE operation_id = $1', [
        vague.operation_id,
      ]);
    const first = await dueIn();
    t.ok(first > 30 && first <= 60, `the first backoff is the initial 60 s (due in ${first} s)`);
    const p2 = await kit.pass();
    t.equal(p2.reconcile.examined, 0, 'backing off: not due yet');
    await makeDue();
    t.equal((await kit.pass()).reconcile.still_unknown, 1);
    t.match(await row(e, vague.operation_id), { status: 'unknown', reconcile_attempts: 2 });
    const second = await dueIn();
    t.ok(second > 90 && second <= 120, `the second backoff doubles, up to the 120 s maximum (due in ${second} s)`);
    await makeDue();
    t.equal((await kit.pass()).reconcile.escalated, 1);
    t.match(await row(e, vague.operation_id), {
      status: 'needs_review',
      review_reason: 'reconcile_attempts_exhausted',
    });
    const last = (await history(e, vague.operation_id)).at(-1);
    t.equal((last?.detail?.checks as unknown[]).length, 3, 'the review carries every check that was tried');
    t.equal(readbacks(e, vague.effect_key), 3);
    t.equal(e.provider.requestsFor(vague.effect_key), 1, 'never re-sent');
    await t.rejects(
      kit.review.retry(vague.operation_id, { actor: 'alice', reason: 'try again' }),
      { code: 'retry_not_safe' },
      'no proof of no effect, no retry',
    );

    const manual = await kit.review.resolveSucceeded(vague.operation_id, {
      actor: 'alice',
      reason: 'found it in the provider dashboard',
      receipt: 'rf_manual_1',
    });
    t.match(manual, { from: 'needs_review', to: 'succeeded' });
    t.equal((await row(e, vague.operation_id)).provider_receipt, 'rf_manual_1');
  },
);

t.test('a provider without a readback contract goes to review at once', async (t) => {
  const e = await dispatchEnv(t, {}, { issueRefund: { readback: null } });
  const r = await e.ledger.reserve(ctx('no-contract'), 'issue_refund', { order_id: 'o-8', amount: 3, currency: 'EUR' });
  e.provider.inject({ kind: 'status', status: 503 }, { when: (k) => k === r.effect_key });
  await e.dispatcher(1);
  t.equal((await settled(e.pool, r.operation_id)).status, 'unknown');
  const kit = await e.reconciler();
  t.equal((await kit.pass()).reconcile.escalated, 1);
  t.match(await row(e, r.operation_id), { status: 'needs_review', review_reason: 'no_readback_contract' });
  t.equal(e.provider.requests().filter((q) => q.method === 'GET').length, 0, 'nothing asked');
});

t.test('two reconciliation passes at once do not double-process', async (t) => {
  const e = await dispatchEnv(t);
  const ops = await Promise.all(
    Array.from({ length: 12 }, (_, i) =>
      e.ledger.reserve(ctx(`twin-${i}`), 'issue_refund', { order_id: `o-t${i}`, amount: i + 1, currency: 'EUR' }),
    ),
  );
  e.provider.inject({ kind: 'commitThenReset' }, { times: 12 });
  await e.dispatcher(4);
  for (const o of ops) t.equal((await settled(e.pool, o.operation_id)).status, 'unknown');
  const [a, b] = await Promise.all([e.reconciler(), e.reconciler()]);
  const [sa, sb] = await Promise.all([a.pass(), b.pass()]);
  t.equal(sa.reconcile.examined + sb.reconcile.examined, 12, 'each operation examined once');
  t.ok(!sa.reconcile.ran || !sb.reconcile.ran, 'the pass lock let one pass run; the other returned at once');
  for (const o of ops) t.equal(readbacks(e, o.effect_key), 1, 'one readback per operation');
  const { rows } = await e.pool.query(`SELECT count(*)::int AS n FROM actionledger.reconciliation_checks`);
  t.equal((rows[0] as { n: number }).n, 12);
  const { rows: states } = await e.pool.query(
    `SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status`,
  );
  t.same(states, [{ status: 'succeeded', n: 12 }]);
});

t.test('reconcile --once: a summary table or --json; exit 3 when a provider cannot be read back', async (t) => {
  const e = await dispatchEnv(t);
  const r = await e.ledger.reserve(ctx('cli'), 'issue_refund', { order_id: 'o-9', amount: 9, currency: 'EUR' });
  e.provider.inject({ kind: 'resetBeforeCommit' }, { when: (k) => k === r.effect_key });
  await e.dispatcher(1);
  t.equal((await settled(e.pool, r.operation_id)).status, 'unknown');
  e.provider.inject({ kind: 'readbackFailing' }, { when: (k) => k === r.effect_key });
  const failing = await runCli(['reconcile', '--once', '--json'], e.env);
  t.equal(failing.code, 3, failing.stderr);
  t.match(lastJson(failing.stdout), {
    ok: false,
    reconcile: { ran: true, examined: 1, still_unknown: 1, provider_errors: 1 },
  });
  await e.pool.query('UPDATE actionledger.operations SET next_reconcile_at = now() WHERE operation_id = $1', [
    r.operation_id,
  ]);
  // A readback's "no effect" is proof once a request can no longer be inside the provider.
  await new Promise((res) => setTimeout(res, IN_FLIGHT_WAIT_MS));
  const table = await runCli(['reconcile', '--once'], e.env);
  t.equal(table.code, 0, table.stderr);
  t.match(table.stdout, /examined\s+succeeded\s+still unknown\s+escalated/);
  t.match(table.stdout, /\n\s+1\s+0\s+0\s+1\s/, 'one examined, escalated: the readback says no effect');
  t.match(await row(e, r.operation_id), { status: 'needs_review', review_reason: 'no_effect_confirmed' });

  const bad = await runCli(['review', 'retry', r.operation_id, '--reason', ' ', '--break-glass', 'carol'], e.env);
  t.equal(bad.code, 1);
  t.match(lastJson(bad.stdout), { ok: false, error: 'invalid_review' });
  const ok = await runCli(
    ['review', 'retry', r.operation_id, '--break-glass', 'carol', '--reason', 'readback says nothing was applied'],
    e.env,
  );
  t.equal(ok.code, 0, ok.stderr);
  t.match(lastJson(ok.stdout), { ok: true, to: 'pending', attempt: 2 });
  t.equal((await settled(e.pool, r.operation_id)).status, 'succeeded');
  const missing = await runCli(
    ['review', 'resolve-failed', '00000000-0000-4000-8000-000000000000', '--break-glass', 'carol', '--reason', 'x'],
    e.env,
  );
  t.match(lastJson(missing.stdout), { ok: false, error: 'not_found' });
  const audit = await e.pool.query(
    `SELECT action, outcome, principal_id, tool_name, subject_id, detail->>'why' AS why FROM actionledger.gate_audit WHERE action LIKE 'review:%' ORDER BY id`,
  );
  t.match(
    audit.rows,
    [
      {
        action: 'review:retry',
        outcome: 'invalid_review',
        principal_id: 'break-glass:carol',
        subject_id: r.operation_id,
      },
      {
        action: 'review:retry',
        outcome: 'ok',
        principal_id: 'break-glass:carol',
        tool_name: 'issue_refund',
        subject_id: r.operation_id,
        why: 'readback says nothing was applied',
      },
      { action: 'review:resolve_failed', outcome: 'not_found', principal_id: 'break-glass:carol', tool_name: null },
    ],
    'every review action, done or refused, is in the audit log',
  );

  const dbDown = await runCli(['reconcile', '--once'], {
    ...e.env,
    DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none',
  });
  t.not(dbDown.code, 0, 'no database: non-zero');
  t.match(lastJson(dbDown.stdout), { ok: false, error: 'database_unavailable' });
});
