/**
 * The audit log's group commit (AuditWriter#grouped, the HTTP API's request rows). While another session
 * holds a lock that blocks every insert into gate_audit, the first row's write waits and the rows that arrive
 * meanwhile wait for the next write; a statement-level trigger counts the INSERT statements, so the test sees
 * the grouping itself, not a timing. A row the database refuses (a trigger refuses one outcome) costs only
 * itself: the others of its group are written one by one, and the refused one is counted lost.
 */
import t from 'tap';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { AuditWriter } from '../../gate/index.js';
import { gateFixture } from '../helpers/gate.js';

async function installCounters(g: Awaited<ReturnType<typeof gateFixture>>): Promise<() => Promise<number>> {
  await g.pool.query(`
    CREATE TABLE public.audit_inserts (n int NOT NULL);
    CREATE FUNCTION public.audit_inserts_count() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO public.audit_inserts VALUES (1); RETURN NULL; END $$;
    CREATE TRIGGER audit_inserts AFTER INSERT ON actionledger.gate_audit
      FOR EACH STATEMENT EXECUTE FUNCTION public.audit_inserts_count();
    CREATE FUNCTION public.audit_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.outcome = 'poison' THEN RAISE EXCEPTION 'refused (injected)' USING ERRCODE = '53100'; END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER audit_refuse_poison BEFORE INSERT ON actionledger.gate_audit
      FOR EACH ROW EXECUTE FUNCTION public.audit_refuse_poison();`);
  return async () =>
    (await g.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM public.audit_inserts')).rows[0]?.n ?? 0;
}

function writer(g: Awaited<ReturnType<typeof gateFixture>>): { audit: AuditWriter; metrics: Metrics } {
  const metrics = new Metrics({ defaultMetrics: false });
  const log = createLogger({ level: 'silent', name: 'test' });
  return { audit: new AuditWriter({ config: g.config, pool: g.pool, log, metrics }), metrics };
}

const entry = (i: number, outcome = '200') => ({
  action: 'api' as const,
  outcome,
  context: { tenant_id: 'tenant-a', principal_id: `p-${i}`, trace_id: `req-${i}` },
  detail: { request_id: `req-${i}`, n: i },
});

/** Holds an EXCLUSIVE lock on gate_audit (inserts wait; reads do not) until the returned function runs. */
async function blockInserts(g: Awaited<ReturnType<typeof gateFixture>>): Promise<() => Promise<void>> {
  const client = await g.pool.connect();
  await client.query('BEGIN');
  await client.query('LOCK TABLE actionledger.gate_audit IN EXCLUSIVE MODE');
  return async () => {
    await client.query('COMMIT');
    client.release();
  };
}

/** Waits until the first grouped write is blocked on the lock (a session waits on a relation lock). */
async function untilWaiting(g: Awaited<ReturnType<typeof gateFixture>>): Promise<void> {
  for (;;) {
    const { rows } = await g.pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
       WHERE c.relname = 'gate_audit' AND NOT l.granted`,
    );
    if ((rows[0]?.n ?? 0) > 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

t.test('rows arriving while a write is in flight go in the next write, in arrival order', async (t) => {
  const g = await gateFixture(t);
  const statements = await installCounters(g);
  const { audit } = writer(g);
  const release = await blockInserts(g);
  const first = audit.grouped(entry(0));
  await untilWaiting(g);
  const rest = Array.from({ length: 40 }, (_, i) => audit.grouped(entry(i + 1)));
  await release();
  t.same(await Promise.all([first, ...rest]), Array(41).fill(true), 'every row reported written');
  t.equal(await statements(), 2, 'two INSERT statements: the first row alone, then the 40 that waited');
  const { rows } = await g.pool.query<{ principal_id: string }>(
    `SELECT principal_id, trace_id, detail FROM actionledger.gate_audit WHERE action = 'api' ORDER BY id`,
  );
  t.same(
    rows.map((r) => r.principal_id),
    Array.from({ length: 41 }, (_, i) => `p-${i}`),
    'every row, in the order the rows were given',
  );
  t.same(rows[7], { principal_id: 'p-7', trace_id: 'req-7', detail: { request_id: 'req-7', n: 7 } }, 'columns kept');
});

t.test('one row the database refuses costs only itself: the rest of its group are written', async (t) => {
  const g = await gateFixture(t);
  await installCounters(g);
  const { audit, metrics } = writer(g);
  const release = await blockInserts(g);
  const first = audit.grouped(entry(0));
  await untilWaiting(g);
  const rest = [audit.grouped(entry(1)), audit.grouped(entry(2, 'poison')), audit.grouped(entry(3))];
  await release();
  t.same(await Promise.all([first, ...rest]), [true, true, false, true], 'the refused row is reported not written');
  const { rows } = await g.pool.query<{ principal_id: string }>(
    `SELECT principal_id FROM actionledger.gate_audit WHERE action = 'api' ORDER BY principal_id`,
  );
  t.same(
    rows.map((r) => r.principal_id),
    ['p-0', 'p-1', 'p-3'],
    'its group-mates written',
  );
  const lost = (await metrics.registry.getMetricsAsJSON()).find((m) => m.name === 'actionledger_audit_lost_total');
  t.equal(lost?.values.find((v) => v.labels.action === 'api')?.value, 1, 'the refused row counted lost');
});

t.test('a row about an operation is written as after() writes it (its tenant read from the operation)', async (t) => {
  const g = await gateFixture(t);
  const { audit } = writer(g);
  t.equal(
    await audit.grouped({
      action: 'review:retry',
      outcome: 'done',
      operationId: '00000000-0000-4000-8000-000000000000',
      context: { principal_id: 'op-1' },
    }),
    true,
  );
  const { rows } = await g.pool.query(
    `SELECT principal_id, tenant_id FROM actionledger.gate_audit WHERE action = 'review:retry'`,
  );
  t.same(rows, [{ principal_id: 'op-1', tenant_id: null }], 'an unknown operation leaves the tenant null');
});
