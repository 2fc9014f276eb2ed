/**
 * The events are written by the database, in the transaction of the change they report: an operation moved to
 * review (with its reason), a compensation escalated, a kill switch; a rolled-back change writes none, and a
 * status change that is not a move into review writes nothing on the operations' hot path.
 */
import t from 'tap';
import { ctx, ledgerFixture } from '../helpers/db.js';

t.test('review, escalation and kill-switch events follow their change, and a rollback takes them back', async (t) => {
  const fx = await ledgerFixture(t);
  const events = async () =>
    (
      await fx.pool.query<{ event_type: string; subject_id: string; payload: Record<string, unknown> }>(
        'SELECT event_type, subject_id, payload FROM actionledger.notification_events ORDER BY created_at, event_type',
      )
    ).rows;
  const move = (id: string, sets: string) =>
    fx.pool.query(`UPDATE actionledger.operations SET ${sets} WHERE operation_id = $1`, [id]);

  const a = await fx.ledger.reserve(ctx({ workflow_step_id: 'review-me' }), 'issue_refund', {
    order_id: 'o-1',
    amount: 1,
    currency: 'EUR',
  });
  await move(a.operation_id, "status = 'executing', claim_token = gen_random_uuid()");
  await move(a.operation_id, "status = 'succeeded', claim_token = NULL, provider_receipt = 'r-1'");
  t.same(await events(), [], 'pending -> executing -> succeeded writes no event');
  await move(a.operation_id, "status = 'compensating'");
  await move(a.operation_id, "status = 'needs_review', review_reason = 'compensation:provider_rejected'");

  const b = await fx.ledger.reserve(ctx({ workflow_step_id: 'stuck' }), 'issue_refund', {
    order_id: 'o-2',
    amount: 2,
    currency: 'EUR',
  });
  await move(b.operation_id, "status = 'executing', claim_token = gen_random_uuid()");
  await move(b.operation_id, "status = 'needs_review', review_reason = 'authorization_denied'");

  const rolledBack = await fx.pool.connect();
  try {
    await rolledBack.query('BEGIN');
    await rolledBack.query(
      "INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-a', '*', 'op', 'oops')",
    );
    await rolledBack.query('ROLLBACK');
  } finally {
    rolledBack.release();
  }

  const got = await events();
  t.same(
    got.map((e) => [e.event_type, e.subject_id, e.payload.reason, e.payload.previous_status]),
    [
      ['compensation.escalated', a.operation_id, 'compensation:provider_rejected', 'compensating'],
      ['operation.review', b.operation_id, 'authorization_denied', 'executing'],
    ],
    'one event per move into review, with its reason; nothing from the rolled-back kill switch',
  );
  t.equal(got[1]?.payload.tool, 'issue_refund');
  t.equal(got[1]?.payload.workflow_step_id, 'stuck');
});
