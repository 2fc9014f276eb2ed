import t, { type Test } from 'tap';
import pg from 'pg';
import { ctx, ledgerFixture, testKeyer } from '../helpers/db.js';
import { createPool } from '../../db/db.js';
import { isActionLedgerError } from '../../core/errors.js';
import { Ledger } from '../../ledger/index.js';

const args = { order_id: 'ord-1', amount: 1000, currency: 'EUR' };

async function counts(pool: pg.Pool): Promise<{ ops: number; outbox: number; history: number }> {
  const { rows } = await pool.query<{ ops: string; outbox: string; history: string }>(
    `SELECT (SELECT count(*) FROM actionledger.operations) AS ops,
            (SELECT count(*) FROM actionledger.outbox) AS outbox,
            (SELECT count(*) FROM actionledger.operation_history) AS history`,
  );
  const r = rows[0]!;
  return { ops: Number(r.ops), outbox: Number(r.outbox), history: Number(r.history) };
}

/** A ledger whose pool holds one connection, so every reservation meets the same session. */
async function oneConnectionLedger(t: Test): Promise<{ url: string; pool: pg.Pool; ledger: Ledger }> {
  const { url, config } = await ledgerFixture(t);
  const pool = createPool(url, { max: 1, statementTimeoutMs: 30_000, applicationName: 'test-one-connection' });
  const ledger = new Ledger(config, pool, testKeyer());
  t.teardown(async () => {
    ledger.stop();
    await pool.end();
  });
  return { url, pool, ledger };
}

t.test('20 concurrent reserves of one step from 20 connections: one operation, one outbox row', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  // Twenty distinct clients, each holding its own connection, released together.
  const clients = await Promise.all(Array.from({ length: 20 }, () => pool.connect()));
  const results = await Promise.all(clients.map((client) => ledger.reserve(ctx(), 'issue_refund', args, { client })));
  clients.forEach((c) => c.release());
  const ids = new Set(results.map((r) => r.operation_id));
  const keys = new Set(results.map((r) => r.effect_key));
  t.equal(ids.size, 1, 'every caller got the same operation id');
  t.equal(keys.size, 1, 'every caller got the same effect key');
  t.equal(results.filter((r) => r.created).length, 1, 'exactly one caller created it');
  t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 });
});

t.test('20 concurrent reserves through the pool (own transactions)', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const results = await Promise.all(Array.from({ length: 20 }, () => ledger.reserve(ctx(), 'issue_refund', args)));
  t.equal(new Set(results.map((r) => r.operation_id)).size, 1);
  t.equal(results.filter((r) => r.created).length, 1);
  t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 });
});

t.test('replay returns the same; each changed effect field is refused and changes nothing', async (t) => {
  const { ledger, pool, url } = await ledgerFixture(t);
  const first = await ledger.reserve(ctx(), 'issue_refund', args);
  t.equal(first.created, true);
  t.equal(first.status, 'pending');
  const again = await ledger.reserve(ctx(), 'issue_refund', { currency: 'EUR', amount: 1000.0, order_id: 'ord-1' });
  t.same(
    again,
    { ...first, created: false },
    'same operation, key and status; key order and 1000.0 vs 1000 do not matter',
  );

  const snapshot = async (): Promise<string> =>
    JSON.stringify((await pool.query('SELECT o::text FROM actionledger.operations o')).rows);
  const before = await snapshot();
  const cases: [string, () => Promise<unknown>][] = [
    ['tool', () => ledger.reserve(ctx(), 'send_email', args)],
    ['arguments', () => ledger.reserve(ctx(), 'issue_refund', { ...args, amount: 100000 })],
  ];
  for (const [field, call] of cases) {
    await t.rejects(call(), { code: 'operation_conflict' }, `changed ${field} refused`);
  }
  // Provider and endpoint changes come from today's registry: the same step under a changed route.
  const { Ledger } = await import('../../ledger/index.js');
  const { testConfig, testKeyer, baseToolConfig } = await import('../helpers/db.js');
  for (const [field, change] of [
    ['provider', { provider_id: 'billing-other' }],
    ['endpoint', { endpoint: 'https://localhost:9443/v2/refunds' }],
  ] as const) {
    const moved = new Ledger(
      testConfig(url, { tools: { ...baseToolConfig, issue_refund: { ...baseToolConfig.issue_refund, ...change } } }),
      pool,
      testKeyer(),
    );
    await t.rejects(
      moved.reserve(ctx(), 'issue_refund', args),
      { code: 'operation_conflict', details: { changed: [field] } },
      `changed ${field} refused`,
    );
    moved.stop();
  }
  t.equal(await snapshot(), before, 'the row is byte-for-byte unchanged');
  t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 });
});

t.test('a pending operation records a new approval and policy version; identity and key stay', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const first = await ledger.reserve(ctx(), 'issue_refund', args);
  const again = await ledger.reserve(
    ctx({ approval_id: 'approval-2', policy_version: 'policy-2' }),
    'issue_refund',
    args,
  );
  t.equal(again.operation_id, first.operation_id);
  t.equal(again.effect_key, first.effect_key);
  const { rows } = await pool.query('SELECT current_approval_id, current_policy_version FROM actionledger.operations');
  t.same(rows, [{ current_approval_id: 'approval-2', current_policy_version: 'policy-2' }]);
  const hist = await pool.query(
    'SELECT from_status, to_status, reason FROM actionledger.operation_history ORDER BY id',
  );
  t.same(
    hist.rows.map((r: { reason: string }) => r.reason),
    ['reserved', 'authorization_context_updated'],
  );

  // Once the operation has left pending, a new approval is not recorded.
  await pool.query(`UPDATE actionledger.operations SET status = 'executing', claim_token = gen_random_uuid()`);
  const late = await ledger.reserve(ctx({ approval_id: 'approval-3' }), 'issue_refund', args);
  t.equal(late.status, 'executing');
  const after = await pool.query('SELECT current_approval_id FROM actionledger.operations');
  t.same(after.rows, [{ current_approval_id: 'approval-2' }]);
});

t.test('route not approved, tenant not allowed: refused, nothing written', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  await t.rejects(ledger.reserve(ctx(), 'wire_money', args), { code: 'route_not_approved' });
  await t.rejects(ledger.reserve(ctx({ tenant_id: 'tenant-c' }), 'issue_refund', args), { code: 'route_not_approved' });
  await t.rejects(ledger.reserve(ctx({ tenant_id: 'tenant-b' }), 'send_email', args), { code: 'route_not_approved' });
  t.same(await counts(pool), { ops: 0, outbox: 0, history: 0 });
});

t.test('every bad-argument class is refused with invalid_arguments, nothing written', async (t) => {
  const { ledger, pool } = await ledgerFixture(t, { arguments: { max_bytes: 2048, max_depth: 4 } });
  class Money {
    amount = 1;
  }
  const sparse: unknown[] = [1];
  sparse[3] = 2;
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  const bad: [string, unknown][] = [
    ['array root', [1, 2]],
    ['string root', 'refund'],
    ['null root', null],
    ['NaN', { amount: NaN }],
    ['Infinity', { amount: Infinity }],
    ['undefined', { amount: undefined }],
    ['function', { amount: () => 1 }],
    ['BigInt', { amount: 10n }],
    ['symbol', { amount: Symbol('x') }],
    ['class instance', { amount: new Money() }],
    ['Date', { when: new Date(0) }],
    ['Map', { m: new Map() }],
    ['class instance root', new Money()],
    ['lone surrogate value', { note: 'a\ud800b' }],
    ['lone surrogate key', { ['\udc00']: 1 }],
    ['__proto__ key', JSON.parse('{"__proto__": {"admin": true}}')],
    ['sparse array', { items: sparse }],
    ['cycle', cyclic],
    ['too deep', { a: { b: { c: { d: { e: 1 } } } } }],
    ['too large', { blob: 'x'.repeat(4096) }],
  ];
  for (const [name, value] of bad) {
    try {
      await ledger.reserve(ctx(), 'issue_refund', value);
      t.fail(`${name} was accepted`);
    } catch (err) {
      t.ok(isActionLedgerError(err, 'invalid_arguments'), `${name}: invalid_arguments`);
      t.match((err as Error).message, /arguments /, `${name}: names the problem (${(err as Error).message})`);
    }
  }
  t.same(await counts(pool), { ops: 0, outbox: 0, history: 0 });
});

t.test('bad trusted context is refused with invalid_context', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  await t.rejects(ledger.reserve(ctx({ principal_id: '' }), 'issue_refund', args), {
    code: 'invalid_context',
    details: { fields: ['principal_id'] },
  });
  await t.rejects(ledger.reserve({ ...ctx(), task_id: 7 } as never, 'issue_refund', args), { code: 'invalid_context' });
  await t.rejects(ledger.reserve(ctx({ workflow_step_id: 'a\nb' }), 'issue_refund', args), { code: 'invalid_context' });
  t.same(await counts(pool), { ops: 0, outbox: 0, history: 0 });
});

t.test("the caller's transaction: rolled back leaves nothing, committed leaves both rows", async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  await pool.query('CREATE TABLE public.refund_requests (id text PRIMARY KEY)');
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`INSERT INTO public.refund_requests VALUES ('r1')`);
    const r = await ledger.reserve(ctx(), 'issue_refund', args, { client });
    t.equal(r.created, true);
    await client.query('ROLLBACK');
    t.same(await counts(pool), { ops: 0, outbox: 0, history: 0 }, 'rolled back: nothing');

    // The dispatcher wake-up rides the caller's transaction: delivered on commit, never on rollback.
    const listener = new pg.Client({
      connectionString: (pool as unknown as { options: { connectionString: string } }).options.connectionString,
    });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.channel));
    await listener.query('LISTEN actionledger_outbox');

    await client.query('BEGIN');
    await client.query(`INSERT INTO public.refund_requests VALUES ('r1')`);
    const r2 = await ledger.reserve(ctx(), 'issue_refund', args, { client });
    await new Promise((res) => setTimeout(res, 100));
    t.same(heard, [], 'no wake-up before commit');
    await client.query('COMMIT');
    for (const deadline = Date.now() + 10_000; heard.length === 0 && Date.now() < deadline;)
      await new Promise((res) => setTimeout(res, 10));
    await new Promise((res) => setTimeout(res, 200));
    t.same(heard, ['actionledger_outbox'], 'woken on commit, once');
    await listener.end();
    t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 }, 'committed: ledger and outbox rows');
    const { rows } = await pool.query<{ operation_id: string }>('SELECT operation_id FROM actionledger.outbox');
    t.equal(rows[0]?.operation_id, r2.operation_id);
  } finally {
    client.release();
  }
});

t.test('effect fields are immutable in the database itself, and history is append-only', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const r = await ledger.reserve(ctx(), 'issue_refund', args);
  await t.rejects(
    pool.query(`UPDATE actionledger.operations SET canonical_args_sha256 = repeat('0', 64) WHERE operation_id = $1`, [
      r.operation_id,
    ]),
    /immutable/,
  );
  await t.rejects(
    pool.query(
      `UPDATE actionledger.operations SET provider_endpoint = 'https://evil.example/' WHERE operation_id = $1`,
      [r.operation_id],
    ),
    /immutable/,
  );
  await t.rejects(pool.query(`UPDATE actionledger.operation_history SET reason = 'x'`), /append-only/);
  await t.rejects(pool.query(`DELETE FROM actionledger.operation_history`), /append-only/);
});

t.test('reserveIfNew: a new step is reserved; a step reserved before is null and left exactly as it was', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const first = await ledger.reserveIfNew(ctx(), 'issue_refund', args, { actor: 'api:svc' });
  t.match(first, { ok: true, created: true, status: 'pending' });
  const before = (await pool.query('SELECT * FROM actionledger.operations')).rows;
  const again = await ledger.reserveIfNew(
    ctx({ approval_id: 'another-approval', policy_version: 'another-policy' }),
    'issue_refund',
    args,
  );
  t.equal(again, null, 'the existing step is not replayed');
  t.same(
    (await pool.query('SELECT * FROM actionledger.operations')).rows,
    before,
    'its approval and policy not rebound',
  );
  t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 });
  t.equal(
    await ledger.reserveIfNew(ctx(), 'issue_refund', { ...args, amount: 5 }),
    null,
    'other arguments for the step: null as well (the caller replays, and gets the conflict there)',
  );
});

t.test('reserveIfNew racing an uncommitted reservation of the same step waits for it, then answers null', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const holder = await pool.connect();
  await holder.query('BEGIN');
  await ledger.reserve(ctx(), 'issue_refund', args, { client: holder, notifyOnCommit: false });
  const racing = ledger.reserveIfNew(ctx(), 'issue_refund', args);
  // Commits only once the racing INSERT waits on the holder's transaction (its unique-index conflict).
  for (;;) {
    const { rows } = await pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted`,
    );
    if ((rows[0]?.n ?? 0) > 0) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  await holder.query('COMMIT');
  holder.release();
  t.equal(await racing, null, 'the committed reservation is the one operation');
  t.same(await counts(pool), { ops: 1, outbox: 1, history: 1 });
});

t.test(
  'through the pool the reservation is a named statement, planned once per connection; never on a caller connection',
  async (t) => {
    const { url, pool, ledger } = await oneConnectionLedger(t);
    for (let i = 1; i <= 7; i++) await ledger.reserve(ctx({ task_id: `task-${i}` }), 'issue_refund', args);
    // The pool's one connection: the statement it prepared, and how often each kind of plan was used.
    const { rows } = await pool.query<{ statement: string; plans: string; generic: string }>(
      `SELECT statement, (generic_plans + custom_plans)::text AS plans, generic_plans::text AS generic
     FROM pg_prepared_statements WHERE name LIKE 'al\\_%'`,
    );
    t.equal(rows.length, 1, 'one named statement on the connection');
    t.match(rows[0]!.statement, /INSERT INTO "actionledger"\.operations/);
    t.equal(rows[0]!.plans, '7', 'every reservation ran the named statement');
    t.not(rows[0]!.generic, '0', 'after five custom plans, the generic plan is reused without planning');

    const client = new pg.Client({ connectionString: url });
    await client.connect();
    t.teardown(() => client.end());
    await ledger.reserve(ctx({ task_id: 'task-own' }), 'issue_refund', args, { client });
    const own = await client.query('SELECT name FROM pg_prepared_statements');
    t.equal(own.rowCount, 0, "a caller's own connection is left with no named statement");
  },
);

t.test(
  'a pool connection whose session lost the named statement, or whose cached plan no longer fits, reserves unnamed once',
  async (t) => {
    const { url, pool, ledger } = await oneConnectionLedger(t);
    t.equal((await ledger.reserve(ctx({ task_id: 'before-reset' }), 'issue_refund', args)).created, true);

    // The session forgets its named statements; node-postgres still believes the connection holds it.
    const lent = await pool.connect();
    await lent.query('DISCARD ALL');
    lent.release();
    const afterReset = await ledger.reserve(ctx({ task_id: 'after-reset' }), 'issue_refund', args);
    t.equal(afterReset.created, true, 'reserved, through the unnamed statement');
    t.same(await counts(pool), { ops: 2, outbox: 2, history: 2 }, 'one operation, one outbox row, one history row');

    // Prepare it again on the (new) connection, then change the type of a column the statement returns.
    await ledger.reserve(ctx({ task_id: 'prepared-again' }), 'issue_refund', args);
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    t.teardown(() => admin.end());
    await admin.query('ALTER TABLE actionledger.operations ALTER COLUMN provider_receipt TYPE varchar(400)');
    const afterMigration = await ledger.reserve(ctx({ task_id: 'after-migration' }), 'issue_refund', args);
    t.equal(afterMigration.created, true, 'reserved although the cached plan no longer fits');
    t.same(await counts(pool), { ops: 4, outbox: 4, history: 4 });
  },
);
