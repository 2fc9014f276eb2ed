/**
 * The bookkeeping bench's schema changes (bench/bookkeeping.ts) do what its table says they do, so its rows
 * measure what they name: the foreign keys to `operations` are gone where it says so, no history row is written
 * where it says so (the reservation's history row is the one looked for), and the state-machine trigger still sets provider contact and attention but lists no claim.
 * The shipped cell's database keeps all of it.
 */
import t from 'tap';
import pg from 'pg';
import { STRIPPED } from '../../bench/bookkeeping.js';
import { ctx, ledgerFixture } from '../helpers/db.js';

interface Seen {
  foreignKeys: number;
  history: number;
  claims: number;
  contact: string;
  legalityChecked: boolean;
}

async function look(change: string | undefined): Promise<Seen> {
  const f = await ledgerFixture(t);
  const c = new pg.Client({ connectionString: f.url });
  await c.connect();
  try {
    if (change !== undefined) await c.query(change);
    const { rows: fk } = await c.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_constraint
       WHERE contype = 'f' AND confrelid = 'actionledger.operations'::regclass
         AND conrelid::regclass::text IN ('actionledger.operation_history', 'actionledger.outbox',
                                          'actionledger.authorization_evidence', 'actionledger.gate_operations')`,
    );
    const r = await f.ledger.reserve(ctx(), 'issue_refund', { amount: 1 });
    await c.query(
      `UPDATE actionledger.operations SET status = 'executing', claimed_by = 'w1', claim_token = gen_random_uuid()
       WHERE operation_id = $1`,
      [r.operation_id],
    );
    const one = async (sql: string): Promise<number> =>
      (await c.query<{ n: number }>(sql, [r.operation_id])).rows[0]?.n ?? -1;
    const history = await one('SELECT count(*)::int AS n FROM actionledger.operation_history WHERE operation_id = $1');
    const claims = await one('SELECT count(*)::int AS n FROM actionledger.operation_claims WHERE operation_id = $1');
    const { rows } = await c.query<{ provider_contact: string }>(
      'SELECT provider_contact FROM actionledger.operations WHERE operation_id = $1',
      [r.operation_id],
    );
    const illegal = await c
      .query(`UPDATE actionledger.operations SET status = 'compensated' WHERE operation_id = $1`, [r.operation_id])
      .then(
        () => false,
        (err: { code?: string }) => err.code === 'P0T01',
      );
    return {
      foreignKeys: fk[0]?.n ?? -1,
      history,
      claims,
      contact: rows[0]?.provider_contact ?? '',
      legalityChecked: illegal,
    };
  } finally {
    await c.end();
  }
}

t.test('shipped: foreign keys, history, claim listing and the legality check all in place', async (t) => {
  t.same(await look(STRIPPED.shipped), {
    foreignKeys: 4,
    history: 1,
    claims: 1,
    contact: 'maybe_called',
    legalityChecked: true,
  });
});

t.test('no foreign-key checks: only the four foreign keys go', async (t) => {
  t.same(await look(STRIPPED['no foreign-key checks']), {
    foreignKeys: 0,
    history: 1,
    claims: 1,
    contact: 'maybe_called',
    legalityChecked: true,
  });
});

t.test('no bookkeeping rows: no foreign keys, no history, no claim listing, no legality check', async (t) => {
  t.same(await look(STRIPPED['no bookkeeping rows']), {
    foreignKeys: 0,
    history: 0,
    claims: 0,
    contact: 'maybe_called',
    legalityChecked: false,
  });
});
