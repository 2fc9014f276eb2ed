/**
 * The ledger's operation identity: (tenant, principal, task, step), every field an NFC identifier. Real
 * PostgreSQL; each refusal is checked to have written nothing.
 */
import t from 'tap';
import type pg from 'pg';
import { ctx, ledgerFixture } from '../helpers/db.js';
import { checkTrustedContext } from '../../ledger/index.js';

const args = { order_id: 'ord-1', amount: 100, currency: 'EUR' };

async function operations(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    `SELECT (SELECT count(*) FROM actionledger.operations)::int + (SELECT count(*) FROM actionledger.outbox)::int
            + (SELECT count(*) FROM actionledger.operation_history)::int AS n`,
  );
  return rows[0]?.n ?? -1;
}

t.test('the same principal, task and step in two tenants are two operations', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const a = await ledger.reserve(ctx(), 'issue_refund', args);
  const b = await ledger.reserve(ctx({ tenant_id: 'tenant-b' }), 'issue_refund', { ...args, amount: 7 });
  t.equal(a.created, true);
  t.equal(b.created, true, "tenant-a's step does not conflict with tenant-b's");
  t.not(a.operation_id, b.operation_id, 'different operation ids');
  t.not(a.effect_key, b.effect_key, 'different effect keys');
  const again = await ledger.reserve(ctx({ tenant_id: 'tenant-b' }), 'issue_refund', { ...args, amount: 7 });
  t.same(again, { ...b, created: false }, 'a replay in the same tenant is the same operation');
  t.equal((await ledger.findStep(pool, ctx()))?.operation_id, a.operation_id, "tenant-a's lookup finds tenant-a's");
  t.equal((await ledger.findStep(pool, ctx({ tenant_id: 'tenant-b' })))?.operation_id, b.operation_id);
  t.equal(await ledger.findStep(pool, ctx({ tenant_id: 'tenant-c' })), undefined, 'no step in a third tenant');
  const before = await operations(pool);
  await t.rejects(
    ledger.reserve(ctx({ tenant_id: 'tenant-b' }), 'issue_refund', args),
    { code: 'operation_conflict', details: { operation_id: b.operation_id, changed: ['arguments'] } },
    'other arguments for the same step in the same tenant are still a conflict, naming the operation of that tenant',
  );
  t.equal(await operations(pool), before, 'the conflict wrote nothing');
});

t.test('composed and decomposed spellings are one identity, stored in NFC', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const composed = 'jos\u00e9';
  const decomposed = 'jose\u0301';
  t.not(composed, decomposed, 'the two spellings differ as strings');
  const first = await ledger.reserve(
    ctx({ principal_id: composed, task_id: `t-${composed}`, workflow_step_id: composed }),
    'issue_refund',
    args,
  );
  const second = await ledger.reserve(
    ctx({ principal_id: decomposed, task_id: `t-${decomposed}`, workflow_step_id: decomposed }),
    'issue_refund',
    args,
  );
  t.equal(second.operation_id, first.operation_id, 'one operation');
  t.equal(second.created, false);
  const { rows } = await pool.query<{ principal_id: string; task_id: string; workflow_step_id: string }>(
    'SELECT principal_id, task_id, workflow_step_id FROM actionledger.operations',
  );
  t.same(rows, [{ principal_id: composed, task_id: `t-${composed}`, workflow_step_id: composed }], 'stored in NFC');
  t.equal(checkTrustedContext(ctx({ tenant_id: 'tenant-\u0041\u030a' })).tenant_id, 'tenant-\u00c5');
});

t.test('identifiers that hide what they say are refused, naming the field; nothing is written', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const bad: [string, string, string][] = [
    ['zero-width space', 'principal_id', 'agent\u200b1'],
    ['right-to-left override', 'task_id', 'task\u202e1'],
    ['byte-order mark', 'workflow_step_id', '\ufeffstep'],
    ['NUL', 'tenant_id', 'tenant\u0000a'],
    ['only whitespace', 'principal_id', '   '],
    ['lone surrogate', 'workflow_step_id', 'step\ud800'],
    ['empty', 'approval_id', ''],
    ['too long', 'policy_version', 'p'.repeat(257)],
    ['line separator', 'task_id', 'a\u2028b'],
  ];
  for (const [name, field, value] of bad) {
    await t.rejects(
      ledger.reserve(ctx({ [field]: value }), 'issue_refund', args),
      { code: 'invalid_context', message: new RegExp(`\\b${field}\\b`), details: { field, fields: [field] } },
      `${name} in ${field}`,
    );
  }
  await t.rejects(
    ledger.reserve(ctx({ task_id: '\u200b', workflow_step_id: '' }), 'issue_refund', args),
    { code: 'invalid_context', details: { field: 'task_id', fields: ['task_id', 'workflow_step_id'] } },
    'the first bad field is named; every bad one is listed',
  );
  const missing = { ...ctx() } as Record<string, string>;
  delete missing.workflow_step_id;
  await t.rejects(ledger.reserve(missing as never, 'issue_refund', args), {
    code: 'invalid_context',
    details: { field: 'workflow_step_id', problem: 'is missing' },
  });
  t.equal(await operations(pool), 0, 'nothing written');
});
