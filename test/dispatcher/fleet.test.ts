import t from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { BIN } from '../helpers/cli.js';
import { TcpProxy } from '../../chaos/tcp-proxy.js';
import { dispatcherPoolFloor } from '../../dispatcher/index.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';
import { throughPort } from '../helpers/net.js';
import { nodeCommand } from '../helpers/node-child.js';

function worker(env: NodeJS.ProcessEnv, concurrency: number): ChildProcess {
  return spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', String(concurrency)]), {
    env: { PATH: process.env.PATH, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
}

async function stopAll(children: ChildProcess[]): Promise<(number | null)[]> {
  return Promise.all(
    children.map(
      (c) =>
        new Promise<number | null>((resolve) => {
          if (c.exitCode !== null || c.signalCode !== null) return resolve(c.exitCode);
          c.once('exit', (code) => resolve(code));
          c.kill('SIGTERM');
        }),
    ),
  );
}

// 400 operations keep every worker claiming against the others (8 x 4 in flight at once) for several rounds of
// claims; the bench (bench/fleet.ts) drives larger fleets for their rate.
t.test('8 worker processes, 400 operations: every effect key reaches the provider exactly once', async (t) => {
  // Generous timeouts: 8 workers, the provider and the authorizer share two cores with this test.
  const e = await dispatchEnv(t, { provider_http_timeout_seconds: 30, authorization_http_timeout_seconds: 30 });
  const reservations = [];
  for (let i = 0; i < 400; i += 100) {
    reservations.push(
      ...(await Promise.all(
        Array.from({ length: 100 }, (_, j) =>
          e.ledger.reserve(ctx(`step-${i + j}`), 'issue_refund', {
            order_id: `o-${i + j}`,
            amount: 1 + j,
            currency: 'EUR',
          }),
        ),
      )),
    );
  }
  const children = Array.from({ length: 8 }, () => worker(e.env, 4));
  const deadline = Date.now() + 120_000;
  for (;;) {
    const { rows } = await e.pool.query(
      `SELECT count(*)::int AS n FROM actionledger.operations WHERE status IN ('pending', 'executing')`,
    );
    if ((rows[0] as { n: number }).n === 0 || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  const codes = await stopAll(children);
  t.same(codes, Array(8).fill(0), 'every worker exits 0 on SIGTERM');
  const { rows } = await e.pool.query(`SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status`);
  t.same(rows, [{ status: 'succeeded', n: 400 }]);
  const perKey = new Map<string, number>();
  for (const q of e.provider.requests()) if (q.key !== undefined) perKey.set(q.key, (perKey.get(q.key) ?? 0) + 1);
  t.equal(perKey.size, 400, 'every key reached the provider');
  t.equal([...perKey.values()].filter((n) => n !== 1).length, 0, 'none more than once');
  t.ok(reservations.every((r) => perKey.get(r.effect_key) === 1));
  const claimers = await e.pool.query('SELECT count(DISTINCT claimed_by)::int AS n FROM actionledger.operations');
  t.ok((claimers.rows[0] as { n: number }).n > 1, 'the work was spread over several workers');
});

t.test('a worker process opens its pool floor at start and keeps it open while idle', async (t) => {
  const e = await dispatchEnv(t);
  const floor = dispatcherPoolFloor(8);
  const sessions = async (): Promise<number> => {
    const { rows } = await e.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'actionledger:dispatcher' AND datname = current_database()",
    );
    return rows[0]!.n;
  };
  const child = worker(e.env, 8);
  t.teardown(() => stopAll([child]).then(() => undefined));
  const deadline = Date.now() + 30_000;
  while ((await sessions()) < floor && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  // The floor, and any the worker's other parts (audit, notifications) opened meanwhile.
  t.ok((await sessions()) >= floor, `${floor} pool connections open once it runs`);
  // pg-pool closes an idle connection above the pool's min after 10 s.
  await new Promise((r) => setTimeout(r, 11_000));
  const idle = await sessions();
  t.ok(idle >= floor, `at least ${floor} still open after 11 s with nothing to do (${idle})`);
  const op = await e.ledger.reserve(ctx('after-idle'), 'issue_refund', { order_id: 'o-1', amount: 1, currency: 'EUR' });
  t.equal((await settled(e.pool, op.operation_id)).status, 'succeeded', 'and it dispatches');
  t.same(await stopAll([child]), [0], 'exits 0 on SIGTERM');
});

t.test('a SIGTERM while the worker is starting stops it once started, exit 0', async (t) => {
  const e = await dispatchEnv(t);
  const db = new URL(e.url);
  const proxy = new TcpProxy({ host: db.hostname, port: Number(db.port) });
  const port = await proxy.listen();
  t.teardown(() => proxy.close());
  // The worker's database traffic is held: its start waits on its first connection (to register the worker).
  proxy.pause();
  const child = worker({ ...e.env, ACTIONLEDGER_WORKER_DATABASE_URL: throughPort(e.url, port) }, 2);
  t.teardown(() => stopAll([child]).then(() => undefined));
  const exited = new Promise<[number | null, string | null]>((resolve) =>
    child.once('exit', (code, signal) => resolve([code, signal])),
  );
  const deadline = Date.now() + 30_000;
  while (proxy.stats.connections === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  t.ok(proxy.stats.connections > 0, 'the worker is connecting, inside its start');
  child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 300));
  proxy.resume();
  t.same(await exited, [0, null], 'it finished starting, stopped and exited 0 (not killed by the signal)');
  const { rows } = await e.pool.query<{ stopped: boolean }>(
    'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers',
  );
  t.same(rows, [{ stopped: true }], 'its row says it stopped');
});

t.test('a worker SIGKILLed mid-dispatch: its row stays executing and no other worker dispatches it', async (t) => {
  const e = await dispatchEnv(t, { provider_http_timeout_seconds: 30 });
  const r = await e.ledger.reserve(ctx('killed'), 'issue_refund', { order_id: 'o-k', amount: 5, currency: 'EUR' });
  e.provider.inject({ kind: 'timeout' }, { when: (k) => k === r.effect_key, times: Infinity });
  const first = worker(e.env, 2);
  const deadline = Date.now() + 30_000;
  while (e.provider.requestsFor(r.effect_key) === 0 && Date.now() < deadline)
    await new Promise((res) => setTimeout(res, 50));
  t.equal(e.provider.requestsFor(r.effect_key), 1, 'the request reached the provider');
  first.kill('SIGKILL');
  await new Promise((res) => first.once('exit', res));
  const second = worker(e.env, 2);
  const other = await e.ledger.reserve(ctx('after'), 'issue_refund', { order_id: 'o-a', amount: 6, currency: 'EUR' });
  t.equal(
    (await settled(e.pool, other.operation_id)).status,
    'succeeded',
    'the second worker is running and dispatching',
  );
  const { rows } = await e.pool.query('SELECT status FROM actionledger.operations WHERE operation_id = $1', [
    r.operation_id,
  ]);
  t.equal((rows[0] as { status: string }).status, 'executing', 'left executing for the reconciler');
  t.equal(e.provider.requestsFor(r.effect_key), 1, 'never dispatched again');
  await stopAll([second]);
});

t.test('an unsigned or altered profile refuses to start', async (t) => {
  const { writeFileSync, readFileSync } = await import('node:fs');
  const e = await dispatchEnv(t);
  const path = `${e.dir}/profile.json`;
  writeFileSync(
    path,
    readFileSync(path, 'utf8').replace('"maximum_clock_skew_seconds":2', '"maximum_clock_skew_seconds":3'),
  );
  const child = worker(e.env, 1);
  let err = '';
  child.stderr?.on('data', (c: Buffer) => (err += c.toString()));
  let out = '';
  child.stdout?.on('data', (c: Buffer) => (out += c.toString()));
  const code = await new Promise<number | null>((res) => child.once('exit', res));
  t.equal(code, 1, 'refused to start');
  const tls = worker({ ...e.env, NODE_TLS_REJECT_UNAUTHORIZED: '0' }, 1);
  t.equal(
    await new Promise<number | null>((res) => tls.once('exit', res)),
    1,
    'NODE_TLS_REJECT_UNAUTHORIZED=0 refuses to start',
  );
});
