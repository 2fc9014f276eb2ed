/**
 * "Health tells the truth", on a real listener and a real PostgreSQL: `/readyz` is 503 with the reason while
 * the database refuses writes, and 200 again by itself once a write probe succeeds; a gate call whose write the
 * database refuses is an HTTP 503 with its code and Retry-After, not a 200 refusal; such a failure flips
 * readiness at once, and only a probe's success flips it back. The full-disk case on a real full disk is
 * test/bin/full-disk.test.ts.
 */
import t from 'tap';
import pg from 'pg';
import { createLogger } from '../../core/log.js';
import { WriteProbe } from '../../server/write-probe.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { call as mcpCall, mcpClient, meta } from '../helpers/mcp.js';

const TRANSFER = { to_account: 'ACC0000000002', amount: 25 };

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: process.env.AL_TEST_ADMIN_URL });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

function probeOn(f: ApiFixture, intervalMs: number): WriteProbe {
  const probe = new WriteProbe({
    pool: f.pool,
    schemaQuoted: f.config.schemaQuoted,
    intervalMs,
    log: createLogger({ level: 'silent', name: 'test' }),
    registry: f.deps.metrics!.registry,
  });
  f.deps.writes = probe;
  return probe;
}

/** Polls `/readyz` until `want` holds (bounded); returns the last answer. */
async function readyUntil(f: ApiFixture, want: (r: { status: number; body: Record<string, unknown> }) => boolean) {
  const deadline = Date.now() + 30_000;
  let r = await f.call('GET', '/readyz');
  while (!want(r) && Date.now() < deadline) {
    await new Promise((res) => setTimeout(res, 100));
    r = await f.call('GET', '/readyz');
  }
  return r;
}

t.test('a read-only database: readyz 503 database_read_only, the API 503, back to 200 without a restart', async (t) => {
  const f = await apiFixture(t);
  const agent = await f.token('agent-1', ['agent']);
  const probe = probeOn(f, 200);
  t.teardown(() => probe.stop());
  await probe.start();
  t.match(await f.call('GET', '/readyz'), { status: 200, body: { ok: true } }, 'ready: the first probe wrote');
  t.match((await f.call('GET', '/metrics')).text, /actionledger_database_writable\{reason=""\} 1/);

  const db = (await f.pool.query<{ d: string }>('SELECT current_database() AS d')).rows[0]!.d;
  // New sessions start read-only; the pool's open ones are ended so that it reconnects into the setting.
  const readOnly = async (on: boolean) =>
    admin(async (c) => {
      await c.query(
        `ALTER DATABASE ${db} ${on ? 'SET default_transaction_read_only = on' : 'RESET default_transaction_read_only'}`,
      );
      await c.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1', [db]);
    });
  await readOnly(true);
  t.teardown(() => readOnly(false));

  const refused = await readyUntil(f, (r) => r.body.error === 'database_read_only');
  t.match(
    refused,
    {
      status: 503,
      body: { ok: false, error: 'database_read_only', message: String, details: { sqlstate: '25006', since: String } },
    },
    'not ready, with the reason and the SQLSTATE, with no traffic but the probe',
  );
  t.equal((await f.call('GET', '/healthz')).status, 200, 'liveness is unaffected: a restart would not help');
  t.match((await f.call('GET', '/metrics')).text, /actionledger_database_writable\{reason="database_read_only"\} 0/);

  const call = await f.call('POST', '/v1/calls', {
    token: agent,
    body: { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-ro', workflow_step_id: 's-1' },
  });
  t.equal(call.status, 503, 'the API answers 503, not a 200 refusal');
  t.match(call.body, { ok: false, error: 'database_read_only', message: String, retry_after_s: 1 });
  t.equal(call.headers.get('retry-after'), '1', 'Retry-After: about one probe interval');

  await readOnly(false);
  t.match(
    await readyUntil(f, (r) => r.status === 200),
    { status: 200, body: { ok: true } },
    'ready again by itself once a probe wrote',
  );
  t.match((await f.call('GET', '/metrics')).text, /actionledger_database_writable\{reason=""\} 1/);
  const again = await f.call('POST', '/v1/calls', {
    token: agent,
    body: { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-ro', workflow_step_id: 's-1' },
  });
  t.match(again, { status: 200, body: { ok: true, status: 'reserved' } }, 'the same call goes through now');
});

t.test(
  'a gate call the database refuses is 503 storage_full and flips readiness at once; a probe flips it back',
  async (t) => {
    const f = await apiFixture(t);
    const agent = await f.token('agent-1', ['agent']);
    // A probe that never runs by itself within the test: what changes readiness here is the call, then probe().
    const probe = probeOn(f, 300_000);
    t.teardown(() => probe.stop());
    await probe.start();
    t.equal((await f.call('GET', '/readyz')).status, 200);

    // The reservation's INSERT fails as a full disk fails it (SQLSTATE 53100); the probe's table is untouched.
    await f.pool.query(`
    CREATE FUNCTION actionledger.test_disk_full() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; END $$;
    CREATE TRIGGER test_disk_full BEFORE INSERT ON actionledger.operations
      FOR EACH ROW EXECUTE FUNCTION actionledger.test_disk_full();`);

    // Over MCP: a tool error with the code (the model reads it) and retry_after_s; readiness flips at once.
    const mcp = await mcpClient(t, f.base, agent);
    const overMcp = await mcpCall(mcp, 'transfer_funds', TRANSFER, meta('s-mcp'));
    t.equal(overMcp.isError, true, 'a tool error');
    t.match(overMcp.body, { ok: false, error: 'storage_full', retry_after_s: 300 });
    t.match(
      await f.call('GET', '/readyz'),
      { status: 503, body: { error: 'storage_full' } },
      'not ready: seen over MCP',
    );
    await probe.probe();
    t.equal((await f.call('GET', '/readyz')).status, 200, 'the probe wrote (its table has no such trigger): ready');

    const call = await f.call('POST', '/v1/calls', {
      token: agent,
      body: { tool: 'transfer_funds', arguments: TRANSFER, task_id: 'task-full', workflow_step_id: 's-1' },
    });
    t.equal(call.status, 503);
    t.match(call.body, { ok: false, error: 'storage_full', details: { sqlstate: '53100' }, retry_after_s: 300 });
    t.notMatch(call.text, /could not extend/, 'no server message reaches the caller');
    t.equal(call.headers.get('retry-after'), '300');
    t.match(
      await f.call('GET', '/readyz'),
      { status: 503, body: { error: 'storage_full', details: { sqlstate: '53100' } } },
      'the refused write made the service not ready at once',
    );
    const refusal = await f.call('POST', '/v1/calls', {
      token: agent,
      body: {
        tool: 'transfer_funds',
        arguments: { ...TRANSFER, amount: -1 },
        task_id: 'task-bad',
        workflow_step_id: 's-1',
      },
    });
    t.match(refusal, { status: 200, body: { ok: false, error: 'invalid_arguments' } }, 'a decision is still a 200');

    await f.pool.query('DROP TRIGGER test_disk_full ON actionledger.operations');
    t.equal((await f.call('GET', '/readyz')).status, 503, 'a refused write is undone only by a probe');
    await probe.probe();
    t.match(await f.call('GET', '/readyz'), { status: 200, body: { ok: true } }, 'the probe wrote: ready');
  },
);

t.test('the probe extends the table by a page each time, and commits nothing', async (t) => {
  const f = await apiFixture(t);
  const probe = probeOn(f, 300_000);
  t.teardown(() => probe.stop());
  await probe.start();
  const pages = async () =>
    Number(
      (await f.pool.query<{ n: string }>("SELECT pg_relation_size('actionledger.write_probe') / 8192 AS n")).rows[0]!.n,
    );
  const before = await pages();
  await probe.probe();
  await probe.probe();
  t.equal(await pages(), before + 2, 'each probe wrote a new page: what a full disk refuses');
  t.equal(
    Number((await f.pool.query<{ n: string }>('SELECT count(*) AS n FROM actionledger.write_probe')).rows[0]!.n),
    0,
  );
});
