/**
 * The reconciler's orphan rule beyond a dead heartbeat: a live worker's heartbeat lists the claims it holds,
 * and an `executing` row whose live worker no longer lists its claim (in a listing made well after the claim)
 * is taken. A listed claim, a claim younger than the listing's grace, and a worker that lists nothing (NULL:
 * from before the listing existed) are left alone. Real PostgreSQL, the sandbox provider over mTLS.
 */
import t from 'tap';
import { ctx, dispatchEnv } from '../helpers/fleet.js';

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });

t.test(
  'a live worker that no longer lists a claim leaves it to the reconciler; listed and fresh claims stay',
  async (t) => {
    // A minute of heartbeat grace, so the live workers stay live however slow the machine is.
    const e = await dispatchEnv(t, {}, { reconciler: { orphan_after_ms: 60_000 } });
    const listed = await e.ledger.reserve(ctx('listed'), 'issue_refund', args(1));
    const dropped = await e.ledger.reserve(ctx('dropped'), 'issue_refund', args(2));
    const fresh = await e.ledger.reserve(ctx('fresh'), 'issue_refund', args(3));
    const legacy = await e.ledger.reserve(ctx('legacy'), 'issue_refund', args(4));
    // Claimed by hand (10 minutes ago, except `fresh`), never sent: two live workers, one listing, one from before listings.
    await e.pool.query(
      `UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid(),
            claimed_by = CASE WHEN operation_id = $4 THEN 'w-legacy' ELSE 'w-live' END,
            claimed_at = CASE WHEN operation_id = $3 THEN now() ELSE now() - interval '10 minutes' END
     WHERE operation_id = ANY($1::uuid[] || $2::uuid[] || $3::uuid || $4::uuid)`,
      [[listed.operation_id], [dropped.operation_id], fresh.operation_id, legacy.operation_id],
    );
    await e.pool.query(
      `
    INSERT INTO actionledger.workers (worker_id, pid, host, claim_tokens, claims_listed_at)
    SELECT 'w-live', 1, 'h', array_agg(claim_token), now() FROM actionledger.operations WHERE operation_id = $1`,
      [listed.operation_id],
    );
    await e.pool.query("INSERT INTO actionledger.workers (worker_id, pid, host) VALUES ('w-legacy', 2, 'h')");

    const kit = await e.reconciler();
    const summary = await kit.reconciler.pass();
    t.equal(summary.examined, 1, 'one candidate examined');
    const { rows } = await e.pool.query<{ operation_id: string; status: string; review_reason: string | null }>(
      'SELECT operation_id, status, review_reason FROM actionledger.operations',
    );
    const by = new Map(rows.map((r) => [r.operation_id, r]));
    // It has no evidence under its claim, so no request of it ever left: back to the queue, no readback needed.
    t.equal(by.get(dropped.operation_id)?.status, 'pending', 'the unlisted claim was given back to the queue');
    t.equal(summary.released, 1, 'released by the pass');
    const { rows: moved } = await e.pool.query<{ reason: string }>(
      "SELECT reason FROM actionledger.operation_history WHERE operation_id = $1 AND from_status = 'executing'",
      [dropped.operation_id],
    );
    t.same(
      moved.map((m) => m.reason),
      ['released:worker_lost'],
      'as a claim its worker lost, never sent',
    );
    t.equal(by.get(listed.operation_id)?.status, 'executing', 'a listed claim is left to its worker');
    t.equal(by.get(fresh.operation_id)?.status, 'executing', 'a claim newer than the listing grace is left alone');
    t.equal(
      by.get(legacy.operation_id)?.status,
      'executing',
      'a live worker that lists nothing is judged by its heartbeat alone',
    );
    t.equal(e.provider.requestsFor(dropped.effect_key), 0, 'nothing was sent');
  },
);
