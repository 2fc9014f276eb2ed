/**
 * Review policies (reconciler/review-policy.ts) in a real dispatch environment: the sandbox provider and
 * authorizer over mTLS, a real PostgreSQL. A policy retries an operation the readback proved has no effect in
 * the pass that found it (once a request can no longer be inside the provider), audited with the policy as actor, and the retried operation is dispatched once more
 * with a fresh authorization and ends with one effect; it stops after max_retries and says so in `review
 * list`; it never touches an unproven outcome or a decision, and its retry checks the provider contact and its
 * count again under the row lock.
 */
import t from 'tap';
import { bindQueries } from '../../db/db.js';
import type { ProviderContact } from '../../ledger/index.js';
import { listInReview } from '../../reconciler/index.js';
import { policyGuard } from '../../reconciler/review-policy.js';
import { policyQueries } from '../../reconciler/policy-queries.js';
import { lastJson, runCli } from '../helpers/cli.js';
import { ctx, dispatchEnv, IN_FLIGHT_WAIT_MS, settled, type DispatchEnv } from '../helpers/fleet.js';
import { putOut } from '../helpers/review-state.js';

const ACTOR = 'policy:retry-no-effect (authorized_by alice@example.com)';

function policy(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name: 'retry-no-effect',
    tools: ['issue_refund'],
    reasons: ['no_effect_confirmed'],
    max_retries: 1,
    authorized_by: 'alice@example.com',
    authorized_at: '2026-12-01',
    note: 'readback proves no refund was made: dispatch again',
    ...over,
  };
}

type Row = { status: string; review_reason: string | null; attempt: number; provider_contact: string };

async function row(e: DispatchEnv, id: string): Promise<Row> {
  const { rows } = await e.pool.query<Row>(
    'SELECT status, review_reason, attempt, provider_contact FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0] as Row;
}

async function retriesInHistory(
  e: DispatchEnv,
  id: string,
): Promise<{ actor: string; detail: Record<string, unknown> }[]> {
  const { rows } = await e.pool.query(
    "SELECT actor, detail FROM actionledger.operation_history WHERE operation_id = $1 AND reason = 'review:retry' ORDER BY id",
    [id],
  );
  return rows as never;
}

/** Polls until the operation is in `status` (a dispatcher working on it meanwhile). */
async function until(e: DispatchEnv, id: string, status: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while ((await row(e, id)).status !== status) {
    if (Date.now() > deadline) throw new Error(`operation ${id} never reached ${status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

t.test(
  'a policy retries no_effect_confirmed in the pass that found it, audited as the policy; dispatched again: one effect',
  async (t) => {
    const e = await dispatchEnv(t, {}, { extra: { review_policies: [policy()] } });
    const r = await e.ledger.reserve(ctx('policy-retry'), 'issue_refund', {
      order_id: 'o-p1',
      amount: 100,
      currency: 'EUR',
    });
    // The connection is reset before the provider applies anything: unknown, and the readback says no effect.
    e.provider.inject({ kind: 'resetBeforeCommit' }, { when: (k) => k === r.effect_key });
    await e.dispatcher(2);
    t.equal((await settled(e.pool, r.operation_id)).status, 'unknown');
    t.equal(e.provider.effectsFor(r.effect_key), 0);

    const kit = await e.reconciler();
    // A readback's "no effect" is proof once a request can no longer be inside the provider.
    await new Promise((r) => setTimeout(r, IN_FLIGHT_WAIT_MS));
    const s = await kit.pass();
    t.match(s.reconcile, { escalated: 1, policy_retried: 1 }, 'to review and out again in one pass');
    const h = await retriesInHistory(e, r.operation_id);
    t.equal(h.length, 1, 'one retry');
    const signed = e.config.reviewPolicies[0];
    t.match(h[0], {
      actor: ACTOR,
      detail: {
        review_policy: 'retry-no-effect',
        policy_sha256: signed?.sha256,
        authorized_by: 'alice@example.com',
        authorized_at: '2026-12-01',
        policy_reason: 'no_effect_confirmed',
        policy_retry: 1,
        policy_max_retries: 1,
        previous_review_reason: 'no_effect_confirmed',
        provider_contact: 'no_effect_confirmed',
        attempt: 2,
      },
    });
    t.match(h[0]?.detail.why, /authorized ahead of time by alice@example\.com/);

    const done = await settled(e.pool, r.operation_id);
    t.equal(done.status, 'succeeded', 'the retried attempt is dispatched and succeeds');
    t.equal(e.provider.effectsFor(r.effect_key), 1, 'the provider ends with one effect');
    const keys = e.provider
      .requests()
      .filter((q) => q.method === 'POST')
      .map((q) => q.key);
    t.same(keys, [r.effect_key, r.effect_key], 'both attempts with the same effect key');
    const evidence = await e.pool.query(
      'SELECT attempt FROM actionledger.authorization_evidence WHERE operation_id = $1 ORDER BY attempt',
      [r.operation_id],
    );
    t.same(evidence.rows, [{ attempt: 1 }, { attempt: 2 }], 'the retry passed a fresh authorization of its own');

    const audit = await e.pool.query(
      `SELECT outcome, principal_id, subject_id, detail FROM actionledger.gate_audit WHERE action = 'review:retry'`,
    );
    t.match(audit.rows, [
      {
        outcome: 'ok',
        principal_id: ACTOR,
        subject_id: r.operation_id,
        detail: { review_policy: 'retry-no-effect', policy_sha256: signed?.sha256, authorized_by: 'alice@example.com' },
      },
    ]);
    const counted = await kit.metrics.policyRetries.get();
    t.match(counted.values, [{ labels: { policy: 'retry-no-effect', reason: 'no_effect_confirmed' }, value: 1 }]);
  },
);

t.test('max_retries is honored: the operation then waits for a person, and review list says why', async (t) => {
  const e = await dispatchEnv(t, {}, { extra: { review_policies: [policy({ max_retries: 2 })] } });
  const r = await e.ledger.reserve(ctx('policy-spent'), 'issue_refund', {
    order_id: 'o-p2',
    amount: 200,
    currency: 'EUR',
  });
  // Every attempt is reset before the provider applies it: each readback proves no effect again.
  e.provider.inject({ kind: 'resetBeforeCommit' }, { when: (k) => k === r.effect_key, times: Infinity });
  await e.dispatcher(2);
  const kit = await e.reconciler();
  for (let attempt = 1; attempt <= 3; attempt++) {
    await until(e, r.operation_id, 'unknown');
    t.equal((await row(e, r.operation_id)).attempt, attempt);
    await new Promise((r) => setTimeout(r, IN_FLIGHT_WAIT_MS));
    const s = await kit.pass();
    t.equal(s.reconcile.policy_retried, attempt <= 2 ? 1 : 0, `pass after attempt ${attempt}`);
  }
  t.match(await row(e, r.operation_id), { status: 'needs_review', review_reason: 'no_effect_confirmed', attempt: 3 });
  t.same(
    (await retriesInHistory(e, r.operation_id)).map((h) => h.detail.policy_retry),
    [1, 2],
    'two retries by the policy, no third',
  );
  t.equal((await kit.pass()).reconcile.policy_retried, 0, 'a later pass leaves it alone');
  t.equal(e.provider.effectsFor(r.effect_key), 0);

  const listed = await listInReview(e.config, e.pool);
  t.match(listed.operations, [
    {
      operation_id: r.operation_id,
      retry_safe: true,
      policy: {
        name: 'retry-no-effect',
        authorized_by: 'alice@example.com',
        retries: 2,
        max_retries: 2,
        state: 'spent',
        why: 'policy retries spent (2 of 2): waits for a person',
      },
    },
  ]);
  const cli = await runCli(['review', 'list'], e.env);
  t.equal(cli.code, 0, cli.stderr);
  t.match(cli.stdout, /review policies:\n/);
  t.match(
    cli.stdout,
    new RegExp(
      `${r.operation_id} +retry-no-effect \\(authorized_by alice@example\\.com\\) +2 of 2 +policy retries spent`,
    ),
  );
  const json = await runCli(['review', 'list', '--json'], e.env);
  t.match(lastJson(json.stdout), { operations: [{ policy: { state: 'spent' } }] });

  // Asked under the row lock anyway (a runner that selected it before the count grew): refused, unchanged.
  const signed = e.config.reviewPolicies[0];
  if (signed === undefined) throw new Error('no policy compiled');
  await t.rejects(
    kit.review.retryGuarded(
      r.operation_id,
      {
        actor: signed.actor,
        reason: 'selected before the count grew',
        expect: { attempt: 3, reviewReason: 'no_effect_confirmed' },
      },
      policyGuard(signed, 'no_effect_confirmed', bindQueries(policyQueries, e.config.schemaQuoted)),
    ),
    { code: 'review_policy_refused', details: { why: 'retries_spent', retries: 2, max_retries: 2 } },
  );
  t.match(await row(e, r.operation_id), { status: 'needs_review', attempt: 3 });
  // A person may still retry it: the policy's limit binds the policy, not the reviewer.
  t.match(await kit.review.retry(r.operation_id, { actor: 'bob', reason: 'provider says try once more' }), {
    to: 'pending',
  });
});

t.test(
  'it never touches an unproven outcome, a decision, an uncovered tool, or a contact that proves nothing',
  async (t) => {
    const e = await dispatchEnv(
      t,
      {},
      {
        extra: {
          review_policies: [
            policy({
              reasons: ['no_effect_confirmed', 'provider_unreachable', 'authorization_unavailable', 'internal'],
            }),
          ],
        },
      },
    );
    // Each put where a dispatcher or reconciler would leave it, through the ledger's fenced transitions.
    const put = async (
      step: string,
      to: 'needs_review' | 'unknown',
      reason: string | null,
      contact: ProviderContact,
      tool = 'issue_refund',
    ): Promise<string> => {
      const r = await e.ledger.reserve(ctx(step), tool, { order_id: step, amount: 1, currency: 'EUR' });
      await putOut(e, r.operation_id, { to, reason, contact });
      return r.operation_id;
    };
    const covered = {
      noEffect: await put('no-effect', 'needs_review', 'no_effect_confirmed', 'no_effect_confirmed'),
      unreachable: await put('unreachable', 'needs_review', 'provider:provider_unreachable:econnrefused', 'not_called'),
      authorizerDown: await put('authz-down', 'needs_review', 'authorization:authorization_unavailable', 'not_called'),
      internal: await put('internal', 'needs_review', 'internal:XX000', 'not_called'),
    };
    const untouched = {
      unknown: await put('unknown', 'unknown', null, 'maybe_called'),
      denied: await put('denied', 'needs_review', 'authorization:authorization_denied', 'not_called'),
      killSwitch: await put('kill-switch', 'needs_review', 'final_check:tool_disabled', 'not_called'),
      revoked: await put('revoked', 'needs_review', 'final_check:role_revoked', 'not_called'),
      mismatch: await put('mismatch', 'needs_review', 'readback_mismatch', 'maybe_called'),
      exhausted: await put('exhausted', 'needs_review', 'reconcile_attempts_exhausted', 'maybe_called'),
      noContract: await put('no-contract', 'needs_review', 'no_readback_contract', 'maybe_called'),
      noReceipt: await put('no-receipt', 'needs_review', 'provider:provider_no_receipt', 'maybe_called'),
      notProven: await put('not-proven', 'needs_review', 'no_effect_confirmed', 'maybe_called'),
      unreachableMaybe: await put(
        'unreachable-maybe',
        'needs_review',
        'provider:provider_unreachable:x',
        'maybe_called',
      ),
      otherTool: await put('other-tool', 'needs_review', 'no_effect_confirmed', 'no_effect_confirmed', 'void_refund'),
    };
    const before = new Map<string, Row>();
    for (const id of Object.values(untouched)) before.set(id, await row(e, id));

    const kit = await e.reconciler();
    const s = await kit.pass();
    t.equal(s.reconcile.policy_retried, 4, 'the four covered operations, and only those');
    for (const [name, id] of Object.entries(covered)) {
      t.match(await row(e, id), { status: 'pending', attempt: 2 }, `${name}: retried`);
      t.match(await retriesInHistory(e, id), [{ actor: ACTOR }], `${name}: by the policy`);
    }
    for (const [name, id] of Object.entries(untouched)) {
      t.same(await row(e, id), before.get(id), `${name}: unchanged`);
      t.same(await retriesInHistory(e, id), [], `${name}: no retry in its history`);
    }
    t.equal((await kit.pass()).reconcile.policy_retried, 0, 'a second pass finds nothing more');

    // A contact that proves nothing is refused under the row lock too, whatever the selection thought.
    const signed = e.config.reviewPolicies[0];
    if (signed === undefined) throw new Error('no policy compiled');
    const guard = policyGuard(signed, 'no_effect_confirmed', bindQueries(policyQueries, e.config.schemaQuoted));
    await t.rejects(
      kit.review.retryGuarded(
        untouched.notProven,
        { actor: signed.actor, reason: 'forced', expect: { attempt: 1, reviewReason: 'no_effect_confirmed' } },
        guard,
      ),
      { code: 'retry_not_safe' },
    );
    await t.rejects(
      kit.review.retryGuarded(
        untouched.denied,
        {
          actor: signed.actor,
          reason: 'forced',
          expect: { attempt: 1, reviewReason: 'authorization:authorization_denied' },
        },
        guard,
      ),
      { code: 'review_policy_refused', details: { why: 'not_covered' } },
    );
    for (const id of [untouched.notProven, untouched.denied]) t.same(await row(e, id), before.get(id));
  },
);
