/**
 * `actionledger start` as an operator runs it, with real processes: the embedded PostgreSQL in a temporary
 * data folder, dispatcher workers sending to a sandbox provider over mTLS that answers slowly, and the
 * signals a terminal sends (SIGINT to the whole process group).
 */
import t from 'tap';
import { chmodSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startDispatchKit, type DispatchKit } from '../../sandbox/kit.js';
import { BIN, lastJson, reserveArgs, runCli } from '../helpers/cli.js';
import { createTestDatabase } from '../helpers/db.js';
import { PROVIDER_TOKEN, postmasterPidIn, spawnService, type ServiceProcess } from '../helpers/fleet.js';
import { freePort } from '../helpers/net.js';

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const dir = mkdtempSync(join(tmpdir(), 'al-service-'));
chmodSync(dir, 0o711);
const dataDir = join(dir, 'data');
let kit: DispatchKit;
let httpPort: number;
let pgPort: number;

/** Writes a configuration routing issue_refund to the kit's provider and returns the environment for it. */
function serviceEnv(
  name: string,
  over: { httpPort?: number; pgPort?: number; dataDir?: string } = {},
): NodeJS.ProcessEnv {
  const cfg = {
    http: { host: '127.0.0.1', port: over.httpPort ?? httpPort },
    database: { embedded_port: over.pgPort ?? pgPort },
    dispatcher: {
      ...kit.dispatcherConfig,
      poll_interval_ms: 100,
      heartbeat_interval_ms: 500,
      shutdown_deadline_ms: 30_000,
      concurrency: 4,
    },
    tools: {
      issue_refund: {
        provider_id: 'billing-test',
        endpoint: kit.provider.endpoint,
        allowed_tenants: ['tenant-a'],
        credential_env: 'TEST_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
        readback: { url: `${kit.provider.endpoint}/by-key/{effect_key}` },
      },
    },
  };
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(cfg));
  return {
    ACTIONLEDGER_CONFIG: path,
    ACTIONLEDGER_DATA_DIR: over.dataDir ?? dataDir,
    TEST_BILLING_TOKEN: PROVIDER_TOKEN,
    LOG_LEVEL: 'info',
  };
}

const running = new Set<ServiceProcess>();
function start(args: string[], env: NodeJS.ProcessEnv): ServiceProcess {
  const s = spawnService(BIN, args, env);
  running.add(s);
  void s.exited.then(() => running.delete(s));
  return s;
}

t.before(async () => {
  kit = await startDispatchKit({
    dir,
    token: PROVIDER_TOKEN,
    profile: {
      provider_http_timeout_seconds: 30,
      authorization_http_timeout_seconds: 15,
      maximum_clock_skew_seconds: 10,
    },
  });
  [httpPort, pgPort] = [await freePort(), await freePort()];
});

t.teardown(async () => {
  for (const s of running) process.kill(-s.pid, 'SIGKILL');
  const pid = postmasterPidIn(dataDir);
  if (pid !== undefined && isAlive(pid)) process.kill(pid, 'SIGINT');
  await kit.stop();
});

/** A stack trace or an unhandled rejection in what a process wrote. */
const STACK = /Unhandled|unhandled|\n\s+at .+:\d+:\d+/;

t.test(
  'Ctrl-C (SIGINT to the process group) drains in-flight dispatches, then stops the cluster; exit 0',
  async (t) => {
    // Each receipt drips one byte per 50 ms: a dispatch stays at the provider for about five seconds.
    kit.provider.inject({ kind: 'slowDrip', intervalMs: 50 }, { times: Infinity });
    t.teardown(() => kit.provider.clearFaults());
    const env = serviceEnv('drain');
    const service = start(['--workers', '2'], env);
    await service.waitFor(/actionledger listening/);
    await service.waitFor(/dispatcher running[\s\S]*dispatcher running/);

    const ids: string[] = [];
    const reserves = await Promise.all(
      [1, 2, 3, 4, 5, 6].map((i) =>
        runCli(
          reserveArgs('refund', `{"order_id":"o-${i}","amount":${100 + i},"currency":"EUR"}`, {
            principal: 'agent-7',
            task: `order-${i}`,
          }),
          env,
        ),
      ),
    );
    for (const r of reserves) {
      t.equal(r.code, 0, r.stderr);
      ids.push(String(lastJson(r.stdout).operation_id));
    }
    const deadline = Date.now() + 30_000;
    while (kit.provider.requests().filter((r) => r.method === 'POST').length < ids.length && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    t.equal(
      kit.provider.requests().filter((r) => r.method === 'POST').length,
      ids.length,
      'all six are at the provider when Ctrl-C comes',
    );

    process.kill(-service.pid, 'SIGINT');
    const { code } = await service.exited;
    t.equal(code, 0, 'exit 0');
    t.notMatch(service.stderr(), STACK, 'no stack or unhandled rejection on stderr');
    t.notMatch(service.stdout(), /"level":50/, 'no error line');
    const last = service.lines().at(-1) ?? {};
    t.match(
      last,
      {
        msg: /^actionledger stopped: drained \d+ in-flight operations, 0 left executing; 2\/2 workers exited cleanly/,
        executing_left: 0,
        workers: 2,
        workers_clean: 2,
      },
      'the final line says what was drained',
    );
    // Counted when the stop began: those still at the provider then (how many depends on the machine's pace).
    const drained = Number(/drained (\d+)/.exec(String(last.msg))?.[1]);
    t.ok(
      drained >= 1 && drained === last.in_flight_at_stop,
      `drained ${drained} of ${String(last.in_flight_at_stop)} in flight at the stop`,
    );
    t.equal(postmasterPidIn(dataDir), undefined, 'the cluster was stopped (no postmaster.pid)');
    const password = readFileSync(join(dataDir, 'pg-password'), 'utf8').trim();
    const probe = new pg.Client({
      connectionString: `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${pgPort}/actionledger`,
    });
    await t.rejects(probe.connect(), { code: 'ECONNREFUSED' }, 'nothing answers on the embedded port');
    t.notOk(existsSync(join(dataDir, 'service.pid')), 'the service lock was released');

    // A CLI command starts the cluster for itself (and stops it again): every operation recorded its outcome.
    const status = await runCli(['status', '--json'], env);
    t.match(
      lastJson(status.stdout),
      { ok: true, by_status: { succeeded: 6, executing: 0, pending: 0 } },
      'all six succeeded',
    );
    t.equal(postmasterPidIn(dataDir), undefined, 'the CLI command stopped the cluster it started');
    t.equal(kit.provider.allEffects().length, 6, 'one effect per operation');
  },
);

t.test(
  'the embedded cluster killed -9 is restarted with a few log lines; a second start says already_running; a cluster left by a killed service is adopted and stopped',
  async (t) => {
    const env = serviceEnv('supervise');
    const service = start(['--workers', '0'], env);
    await service.waitFor(/actionledger listening/);
    await service.waitFor(/reconciliation scheduled/);

    const second = await runCli(['start', '--workers', '0'], env);
    t.equal(second.code, 1);
    t.match(
      lastJson(second.stdout),
      { ok: false, error: 'already_running', details: { pid: service.pid, address: `http://127.0.0.1:${httpPort}` } },
      'names the running pid and address',
    );
    t.ok(isAlive(service.pid), 'the running service was left alone');

    const before = service.lines().length;
    const postmaster = postmasterPidIn(dataDir);
    if (postmaster === undefined) throw new Error('no postmaster.pid');
    process.kill(postmaster, 'SIGKILL');
    await service.waitFor(/embedded PostgreSQL restarted/, 60_000);
    let health = 0;
    for (const until = Date.now() + 20_000; health !== 200 && Date.now() < until;) {
      health = (await fetch(`http://127.0.0.1:${httpPort}/healthz`)).status;
      if (health !== 200) await new Promise((r) => setTimeout(r, 200));
    }
    t.equal(health, 200, '/healthz is 200 again');
    // Let pg-boss poll (every 2 s) against the restarted cluster before counting.
    await new Promise((r) => setTimeout(r, 2000));
    const during = service.lines().slice(before);
    const shown = during.map((l) => JSON.stringify(l).slice(0, 200)).join('\n');
    // Each part that noticed says so once per kind of failure and once when it recovers (the orphan watch may see
    // a refused connection and then a server still starting: two kinds), never once per poll.
    const perSource = new Map<string, number>();
    for (const l of during) {
      const key = `${String(l.msg)} ${JSON.stringify(l.code ?? null)}`;
      perSource.set(key, (perSource.get(key) ?? 0) + 1);
    }
    t.ok(during.length <= 12, `the outage took ${during.length} log lines, not a stack per poll:\n${shown}`);
    t.ok(Math.max(...perSource.values()) <= 2, `no line repeats per poll:\n${shown}`);
    t.not(postmasterPidIn(dataDir), postmaster, 'a new postmaster');

    // The service and the watchdog of its restarted postmaster die together, stopping nothing (a killed service
    // alone takes its postmaster with it: embedded-supervisor.test.ts): the cluster stays up, and the next
    // start adopts it.
    const watchdog = Number(service.lines().findLast((l) => l.msg === 'embedded PostgreSQL restarted')?.watchdog_pid);
    t.ok(Number.isInteger(watchdog) && isAlive(watchdog), 'the restarted postmaster has a live watchdog');
    process.kill(watchdog, 'SIGKILL');
    process.kill(-service.pid, 'SIGKILL');
    await service.exited;
    const orphan = postmasterPidIn(dataDir);
    t.ok(orphan !== undefined && isAlive(orphan), 'the cluster outlived the killed service and watchdog');
    const adopter = start(['--workers', '0'], env);
    await adopter.waitFor(/actionledger listening/);
    t.match(adopter.stdout(), /adopted running embedded PostgreSQL/);
    process.kill(-adopter.pid, 'SIGTERM');
    t.equal((await adopter.exited).code, 0);
    t.notMatch(adopter.stderr(), STACK);
    t.ok(orphan !== undefined && !isAlive(orphan), 'the adopter stopped the cluster it adopted');
    t.equal(postmasterPidIn(dataDir), undefined);
  },
);

t.test('a taken HTTP port: port_in_use naming http.port, and nothing left running', async (t) => {
  const blocker: Server = await new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => resolve(s));
  });
  t.teardown(() => void blocker.close());
  const taken = (blocker.address() as { port: number }).port;
  const service = start(['--workers', '1'], serviceEnv('taken', { httpPort: taken }));
  const { code } = await service.exited;
  t.equal(code, 1);
  const refusal = service.lines().find((l) => l.error === 'port_in_use');
  t.match(refusal, { ok: false, error: 'port_in_use', details: { port: taken, setting: 'http.port' } });
  t.match(String(refusal?.message), new RegExp(`port ${taken} \\(http\\.port / PORT\\)`));
  t.match(service.stdout(), /started embedded PostgreSQL/, 'it had started the cluster');
  t.equal(postmasterPidIn(dataDir), undefined, 'and stopped it again');
  t.notOk(existsSync(join(dataDir, 'service.pid')), 'and released the lock');
  t.notMatch(service.stderr(), STACK);
});

t.test(
  'another PostgreSQL on the embedded port (it refuses our password): port_in_use naming database.embedded_port, for start and for CLI commands',
  async (t) => {
    // As for a second checkout on the same machine: its own data folder (so another password), and on the
    // embedded port a cluster that is not its own (the test run's).
    const otherPort = Number(new URL(await createTestDatabase(t)).port);
    const env = serviceEnv('second', {
      dataDir: join(dir, 'second-checkout'),
      httpPort: await freePort(),
      pgPort: otherPort,
    });
    const second = await runCli(['start', '--workers', '0'], env);
    t.equal(second.code, 1);
    t.match(lastJson(second.stdout), {
      ok: false,
      error: 'port_in_use',
      details: { port: otherPort, setting: 'database.embedded_port' },
    });
    t.match(String(lastJson(second.stdout).message), new RegExp(`port ${otherPort} \\(database\\.embedded_port\\)`));
    t.notMatch(second.stderr, STACK);
    const status = await runCli(['status', '--json'], env);
    t.equal(status.code, 1);
    t.match(
      lastJson(status.stdout),
      { ok: false, error: 'port_in_use', message: /database\.embedded_port/ },
      'CLI commands too, not internal',
    );
    t.notOk(
      existsSync(join(dir, 'second-checkout', 'pg', 'PG_VERSION')),
      'no cluster was created for the second checkout',
    );
  },
);
