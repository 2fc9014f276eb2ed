import t from 'tap';
import pg from 'pg';
import { ctx, createTestDatabase, ledgerFixture, testConfig, testKeyer } from '../helpers/db.js';
import { createPool } from '../../db/db.js';
import { asActionLedgerError } from '../../core/errors.js';
import { createLogger } from '../../core/log.js';
import { migrate, readMigrations } from '../../db/migrate.js';
import { OPERATION_STATUSES, type OperationStatus } from '../../core/types.js';
import { Compensator } from '../../compensator/index.js';
import { LEGAL_TRANSITIONS, Ledger, isLegalTransition, type ProviderContact } from '../../ledger/index.js';
import { Review } from '../../reconciler/index.js';

const args = { order_id: 'ord-1', amount: 1000, currency: 'EUR' };

/**
 * Puts an operation into `status` with its triggers off (a test's forgery), so any move can be tried from it. The
 * bookkeeping the transition trigger would write (`attention`, which a CHECK ties to the status) is forged too.
 */
async function forceStatus(
  client: pg.ClientBase,
  id: string,
  status: OperationStatus,
  contact: ProviderContact = 'maybe_called',
): Promise<void> {
  await client.query('SET session_replication_role = replica');
  await client.query(
    `UPDATE actionledger.operations
     SET status = $2, claim_token = gen_random_uuid(), review_reason = 'forged', provider_contact = $3,
         attention = CASE WHEN $2 IN ('unknown', 'needs_review', 'compensating', 'failed') THEN $2 END
     WHERE operation_id = $1`,
    [id, status, contact],
  );
  // The claim listing the trigger would have kept (migration 0018).
  if (status === 'executing')
    await client.query(
      `INSERT INTO actionledger.operation_claims (operation_id, claimed_by)
       SELECT operation_id, claimed_by FROM actionledger.operations WHERE operation_id = $1
       ON CONFLICT (operation_id) DO NOTHING`,
      [id],
    );
  else await client.query('DELETE FROM actionledger.operation_claims WHERE operation_id = $1', [id]);
  await client.query('SET session_replication_role = DEFAULT');
}

t.test('the database table of legal transitions is the one ledger/transitions.ts declares', async (t) => {
  const { pool } = await ledgerFixture(t);
  const { rows } = await pool.query<{ from_status: string | null; to_status: string; prefix: string | null }>(
    `SELECT from_status, to_status, history_reason_prefix AS prefix FROM actionledger.operation_transitions`,
  );
  const key = (from: string | null, to: string, prefix: string | null | undefined): string =>
    `${from ?? '(reservation)'} -> ${to}${prefix == null ? '' : ` [${prefix}]`}`;
  t.same(
    rows.map((r) => key(r.from_status, r.to_status, r.prefix)).sort(),
    LEGAL_TRANSITIONS.map((l) => key(l.from, l.to, l.reasonPrefix)).sort(),
  );
});

t.test(
  'every illegal status change is refused by the database with illegal_transition; every legal one is accepted',
  async (t) => {
    const { ledger, pool } = await ledgerFixture(t);
    const r = await ledger.reserve(ctx(), 'issue_refund', args);
    const client = await pool.connect();
    t.teardown(() => client.release());
    let legal = 0;
    let illegal = 0;
    for (const from of OPERATION_STATUSES) {
      for (const to of OPERATION_STATUSES) {
        if (from === to) continue;
        const allowed = LEGAL_TRANSITIONS.some((l) => l.from === from && l.to === to);
        await client.query('BEGIN');
        await forceStatus(client, r.operation_id, from);
        const err = await client
          .query(
            `UPDATE actionledger.operations SET status = $2, review_reason = coalesce(review_reason, 'x')
           WHERE operation_id = $1`,
            [r.operation_id, to],
          )
          .then(
            () => undefined,
            (e: unknown) => e,
          );
        await client.query('ROLLBACK');
        if (allowed) {
          legal++;
          t.equal(err, undefined, `${from} -> ${to} is accepted`);
        } else {
          illegal++;
          t.equal((err as { code?: string } | undefined)?.code, 'P0T01', `${from} -> ${to} is refused (P0T01)`);
          t.equal(asActionLedgerError(err).code, 'illegal_transition', `${from} -> ${to} maps to illegal_transition`);
        }
      }
    }
    t.equal(legal + illegal, 56, 'every ordered pair of distinct statuses was tried');
    t.equal(legal, LEGAL_TRANSITIONS.filter((l) => l.from !== null && l.from !== l.to).length);
    const { rows } = await pool.query(`SELECT status FROM actionledger.operations WHERE operation_id = $1`, [
      r.operation_id,
    ]);
    t.same(rows, [{ status: 'pending' }], 'nothing stayed changed');
  },
);

t.test('a release is legal in history only with its released: reason', (t) => {
  t.ok(isLegalTransition('executing', 'pending', 'released:storage_full'));
  t.notOk(isLegalTransition('executing', 'pending', 'claimed'));
  t.notOk(isLegalTransition('executing', 'pending'));
  t.ok(isLegalTransition(null, 'pending'));
  t.notOk(isLegalTransition(null, 'executing'));
  t.end();
});

t.test(
  'provider contact: the claim says maybe_called, and no statement can talk it down outside the rules',
  async (t) => {
    const { ledger, pool } = await ledgerFixture(t);
    const r = await ledger.reserve(ctx(), 'issue_refund', args);
    const contact = async (): Promise<string> =>
      (
        await pool.query<{ provider_contact: string }>(
          `SELECT provider_contact FROM actionledger.operations WHERE operation_id = $1`,
          [r.operation_id],
        )
      ).rows[0]!.provider_contact;
    t.equal(await contact(), 'not_called', 'a reservation has called nothing');
    await pool.query(
      `UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid(), provider_contact = 'not_called'
     WHERE operation_id = $1`,
      [r.operation_id],
    );
    t.equal(await contact(), 'maybe_called', 'a move into executing says maybe_called whatever the statement set');
    await t.rejects(
      pool.query(`UPDATE actionledger.operations SET provider_contact = 'not_called' WHERE operation_id = $1`, [
        r.operation_id,
      ]),
      { code: 'P0T01' },
      'without a move, the fact never becomes less conservative',
    );
    await pool.query(
      `UPDATE actionledger.operations SET status = 'succeeded', provider_contact = 'not_called' WHERE operation_id = $1`,
      [r.operation_id],
    );
    t.equal(await contact(), 'maybe_called', 'succeeded: an effect exists');
    await pool.query(`UPDATE actionledger.operations SET status = 'compensating' WHERE operation_id = $1`, [
      r.operation_id,
    ]);
    await t.rejects(
      pool.query(
        `UPDATE actionledger.operations SET status = 'needs_review', review_reason = 'x', provider_contact = 'not_called'
       WHERE operation_id = $1`,
        [r.operation_id],
      ),
      { code: 'P0T01' },
      'not_called is recorded only by the claim holder, moving from executing',
    );
  },
);

t.test('a reviewed retry reads the recorded provider contact, not the review reason', async (t) => {
  const { ledger, pool, config } = await ledgerFixture(t);
  const log = createLogger({ level: 'silent', name: 'test' });
  const review = new Review(config, pool, new Compensator({ config, pool, ledger, log, actor: 'test' }));
  const reserve = (step: string) => ledger.reserve(ctx({ workflow_step_id: step }), 'issue_refund', args);
  const client = await pool.connect();
  t.teardown(() => client.release());
  const inReview = async (id: string, reason: string, contact: ProviderContact): Promise<void> => {
    await forceStatus(client, id, 'needs_review', contact);
    await client.query(`UPDATE actionledger.operations SET review_reason = $2 WHERE operation_id = $1`, [id, reason]);
  };

  // A reason the pre-dispatch refusal writes, on an operation whose request may have left: refused.
  const lookalike = await reserve('a');
  await inReview(lookalike.operation_id, 'route:route_changed', 'maybe_called');
  await t.rejects(review.retry(lookalike.operation_id, { actor: 'alice', reason: 'looks safe' }), {
    code: 'retry_not_safe',
  });

  // Any reason at all, on an operation the claim holder certified as never sent: allowed.
  const unsent = await reserve('b');
  await inReview(unsent.operation_id, 'provider:provider_no_receipt', 'not_called');
  const retried = await review.retry(unsent.operation_id, { actor: 'alice', reason: 'never sent' });
  t.match(retried, { from: 'needs_review', to: 'pending', attempt: 2 });

  const confirmed = await reserve('c');
  await inReview(confirmed.operation_id, 'readback_mismatch', 'no_effect_confirmed');
  t.match(await review.retry(confirmed.operation_id, { actor: 'alice', reason: 'no effect' }), { to: 'pending' });

  const { rows } = await pool.query<{ operation_id: string; status: string; provider_contact: string }>(
    `SELECT operation_id, status, provider_contact FROM actionledger.operations ORDER BY workflow_step_id`,
  );
  t.same(
    rows.map((r) => [r.status, r.provider_contact]),
    [
      ['needs_review', 'maybe_called'],
      ['pending', 'not_called'],
      ['pending', 'not_called'],
    ],
  );
  const hist = await pool.query<{ reason: string; from_status: string; to_status: string }>(
    `SELECT reason, from_status, to_status FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id`,
    [unsent.operation_id],
  );
  t.same(hist.rows.at(-1), { reason: 'review:retry', from_status: 'needs_review', to_status: 'pending' });
});

t.test('migrating an existing ledger records provider contact conservatively', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const config = testConfig(url);
  const pool = createPool(url, { max: 4, statementTimeoutMs: 30_000, applicationName: 'test' });
  const ledger = new Ledger(config, pool, testKeyer());
  t.teardown(async () => {
    ledger.stop();
    await pool.end();
  });
  const all = readMigrations();
  const client = await pool.connect();
  try {
    await migrate(client, config.schema, config.schemaQuoted, all.slice(0, 6));
    // Today's ledger reserves on the identity with the tenant (a later migration); an index like it lets it
    // write into the old schema, and goes before the migrations run. So does the trace context column, which a
    // later migration adds too (sql/0020_operation_trace_context.sql).
    await client.query(
      'CREATE UNIQUE INDEX test_identity ON actionledger.operations (tenant_id, principal_id, task_id, workflow_step_id)',
    );
    await client.query('ALTER TABLE actionledger.operations ADD COLUMN trace_context text');
    const rows: [string, OperationStatus, string | null][] = [
      ['pending', 'pending', null],
      ['executing', 'executing', null],
      ['refused', 'needs_review', 'final_check:authorization_stale'],
      ['unreachable', 'needs_review', 'provider:provider_unreachable:ECONNREFUSED'],
      ['no-effect', 'needs_review', 'no_effect_confirmed'],
      ['no-receipt', 'needs_review', 'provider:provider_no_receipt'],
      ['exhausted', 'needs_review', 'reconcile_attempts_exhausted'],
      ['succeeded', 'succeeded', null],
    ];
    for (const [step, status, reason] of rows) {
      const r = await ledger.reserve(ctx({ workflow_step_id: step }), 'issue_refund', args);
      await client.query(
        `UPDATE actionledger.operations SET status = $2, review_reason = $3,
           claim_token = CASE WHEN $2 = 'executing' THEN gen_random_uuid() END
         WHERE operation_id = $1`,
        [r.operation_id, status, reason],
      );
    }
    await client.query('DROP INDEX actionledger.test_identity');
    await client.query('ALTER TABLE actionledger.operations DROP COLUMN trace_context');
    await migrate(client, config.schema, config.schemaQuoted, all);
    const { rows: after } = await client.query<{ workflow_step_id: string; provider_contact: string }>(
      `SELECT workflow_step_id, provider_contact FROM actionledger.operations ORDER BY workflow_step_id`,
    );
    t.same(Object.fromEntries(after.map((r) => [r.workflow_step_id, r.provider_contact])), {
      pending: 'not_called',
      executing: 'maybe_called',
      refused: 'not_called',
      unreachable: 'not_called',
      'no-effect': 'no_effect_confirmed',
      'no-receipt': 'maybe_called',
      exhausted: 'maybe_called',
      succeeded: 'maybe_called',
    });
  } finally {
    client.release();
  }
});
