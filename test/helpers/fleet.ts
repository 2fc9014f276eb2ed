/**
 * A real dispatch environment for tests: a PKI generated for the run, the sandbox provider and authorizer
 * over mTLS on loopback, a signed dispatch profile, a migrated database and a config routing tools to them.
 */
import { spawn } from 'node:child_process';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { compileConfig, type Config } from '../../config/index.js';
import { bindQueries, createPool, prepared, type Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import type { Runtime } from '../../runtime/runtime.js';
import { openDispatcher, type Dispatcher } from '../../dispatcher/index.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { Ledger } from '../../ledger/index.js';
import type { SandboxAuthorizer, SandboxProvider } from '../../sandbox/index.js';
import { startDispatchKit } from '../../sandbox/kit.js';
import { createTestDatabase, TEST_SECRET, testKeyer } from './db.js';
import { Secret } from '../../core/secret.js';
import { openReconciler, type ReconcileKit } from '../../reconciler/index.js';
import { nodeCommand } from './node-child.js';
import { proxyTo, type HoldingProxy } from './net.js';

export const PROVIDER_TOKEN = 'provider-token-for-tests';

export interface DispatchEnv {
  dir: string;
  url: string;
  config: Config;
  configPath: string;
  env: NodeJS.ProcessEnv;
  pool: Pool;
  ledger: Ledger;
  provider: SandboxProvider;
  authorizer: SandboxAuthorizer;
  runtime: Runtime;
  dispatcher(concurrency?: number): Promise<Dispatcher>;
  /** A reconciler (with compensator and review actions) on its own metrics registry. */
  reconciler(): Promise<ReconcileKit>;
}

export const VOID_PATH = '/v1/refund_voids';

export interface DispatchEnvOptions {
  /** False: the provider applies every request, so a duplicate dispatch shows as two effects. */
  honorIdempotencyKey?: boolean;
  /** Replaces keys of `dispatcher` in the config. */
  dispatcher?: Record<string, unknown>;
  /** Replaces keys of `reconciler` in the config. */
  reconciler?: Record<string, unknown>;
  /** Replaces keys of the `issue_refund` tool (null deletes the key). */
  issueRefund?: Record<string, unknown>;
  /** Replaces keys of the `void_refund` tool, issue_refund's declared compensation. */
  voidRefund?: Record<string, unknown>;
  /** The dispatcher's poll interval (default 100 ms). */
  pollIntervalMs?: number;
  /** More top-level configuration sections (e.g. `notifications`), and environment variables beside it. */
  extra?: Record<string, unknown>;
  extraEnv?: Record<string, string>;
}

export async function dispatchEnv(
  t: Test,
  profileOverrides: Record<string, unknown> = {},
  options: DispatchEnvOptions = {},
): Promise<DispatchEnv> {
  const dir = mkdtempSync(join(tmpdir(), 'al-dispatch-'));
  const kit = await startDispatchKit({
    dir,
    token: PROVIDER_TOKEN,
    extraPaths: [VOID_PATH],
    honorIdempotencyKey: options.honorIdempotencyKey ?? true,
    profile: { profile_id: 'test', ...profileOverrides },
  });
  const { provider, authorizer } = kit;
  t.teardown(() => kit.stop());

  const url = await createTestDatabase(t);
  const raw = {
    dispatcher: {
      poll_interval_ms: options.pollIntervalMs ?? 100,
      heartbeat_interval_ms: 500,
      // A never-sent operation comes back within milliseconds, not seconds: tests see the release limit quickly.
      release_backoff_initial_ms: 20,
      release_backoff_max_ms: 100,
      ...kit.dispatcherConfig,
      ...options.dispatcher,
    },
    tools: {
      issue_refund: {
        provider_id: 'billing-test',
        endpoint: provider.endpoint,
        allowed_tenants: ['tenant-a'],
        credential_env: 'TEST_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
        readback: { url: `${provider.endpoint}/by-key/{effect_key}` },
        effects_listing_url: `${provider.url}/v1/effects`,
        compensation: {
          tool: 'void_refund',
          arguments: {
            refund_id: { from: 'receipt' },
            order_id: { from: 'arguments', pointer: '/order_id' },
            amount: { from: 'arguments', pointer: '/amount' },
            reason: { value: 'compensation' },
          },
        },
        ...options.issueRefund,
      },
      void_refund: {
        provider_id: 'billing-test',
        endpoint: provider.endpointFor(VOID_PATH),
        allowed_tenants: ['tenant-a'],
        credential_env: 'TEST_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
        readback: { url: `${provider.endpointFor(VOID_PATH)}/by-key/{effect_key}` },
        effects_listing_url: `${provider.url}/v1/effects`,
        ...options.voidRefund,
      },
    },
    reconciler: {
      orphan_after_ms: 1500,
      backoff_initial_ms: 50,
      backoff_max_ms: 200,
      max_attempts: 3,
      ...options.reconciler,
    },
    ...options.extra,
  };
  for (const tool of Object.values(raw.tools) as Record<string, unknown>[])
    for (const [k, v] of Object.entries(tool)) if (v === null) delete tool[k];
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(raw));
  const env = {
    DATABASE_URL: url,
    ACTIONLEDGER_CONFIG: configPath,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: PROVIDER_TOKEN,
    LOG_LEVEL: 'warn',
    ...options.extraEnv,
  };
  const config = compileConfig(raw, env);
  const pool = createPool(url, { max: 40, statementTimeoutMs: 30_000, applicationName: 'test' });
  const ledger = new Ledger(config, pool, testKeyer());
  const runtime: Runtime = {
    config,
    log: createLogger({ level: 'silent', name: 'test' }),
    metrics: new Metrics({ defaultMetrics: false, ledger: false }),
    pool,
    databaseUrl: url,
    embedded: null,
    effectKeys: { active: 'k1', secrets: new Map([['k1', new Secret(Buffer.from(TEST_SECRET))]]) },
    close: () => Promise.resolve(),
  };
  const started: Dispatcher[] = [];
  const kits: ReconcileKit[] = [];
  t.teardown(async () => {
    for (const d of started) await d.stop(5000);
    for (const k of kits) k.close();
    ledger.stop();
    await pool.end();
  });
  return {
    dir,
    url,
    config,
    configPath,
    env,
    pool,
    ledger,
    provider,
    authorizer,
    runtime,
    async dispatcher(concurrency = 8) {
      const d = await openDispatcher(
        { ...runtime, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
        env,
        { concurrency },
      );
      started.push(d);
      await d.start();
      return d;
    },
    async reconciler() {
      const kit = await openReconciler(
        { ...runtime, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
        env,
      );
      kits.push(kit);
      return kit;
    },
  };
}

/** The application name of a `dispatcherThroughProxy` pool's sessions (in `pg_stat_activity`). */
export const PROXIED_DISPATCHER = 'proxied-dispatcher';

export interface ProxiedDispatcher {
  e: DispatchEnv;
  /** Not yet started. */
  d: Dispatcher;
  proxy: HoldingProxy;
  /** The prepared-statement names of a dispatch batch's evidence, row locks and final check, as on the wire. */
  evidenceName: string;
  lockName: string;
  checkName: string;
}

/**
 * A dispatch environment whose dispatcher has its own pool and claim connection through a `HoldingProxy`.
 * `watchBatch` (default true): the proxy holds each BEGIN's reply until a batch's row locks, final check and
 * savepoint have arrived (or 2 s); `'evidence'`: it holds each evidence statement's reply until BEGIN and those
 * have; false: replies pass at once, and only `holdNextRequests` holds anything.
 * `profile`: the dispatch profile's overrides (default: 30 s timeouts, which no healthy request reaches).
 */
export async function dispatcherThroughProxy(
  t: Test,
  o: { concurrency?: number; profile?: Record<string, unknown>; watchBatch?: boolean | 'evidence' } = {},
): Promise<ProxiedDispatcher> {
  const e = await dispatchEnv(
    t,
    o.profile ?? { provider_http_timeout_seconds: 30, authorization_http_timeout_seconds: 30 },
  );
  const q = bindQueries(dispatcherQueries, e.config.schemaQuoted);
  const evidenceName = prepared(q.evidenceRecordBatch).name;
  const lockName = prepared(q.operationLockForDispatchBatch).name;
  const checkName = prepared(q.operationFinalCheckBatch).name;
  const batch = [lockName, checkName, 'SAVEPOINT outcomes'];
  const { proxy, url } =
    o.watchBatch === 'evidence'
      ? await proxyTo(e.url, ['BEGIN', ...batch], evidenceName)
      : await proxyTo(e.url, o.watchBatch === false ? [] : batch);
  t.teardown(() => proxy.close());
  const pool = createPool(url, { max: 20, statementTimeoutMs: 30_000, applicationName: PROXIED_DISPATCHER });
  const d = await openDispatcher(
    { ...e.runtime, pool, databaseUrl: url, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
    { ...e.env, DATABASE_URL: url },
    { concurrency: o.concurrency ?? 4 },
  );
  t.teardown(async () => {
    await d.stop(5000);
    await pool.end();
  });
  return { e, d, proxy, evidenceName, lockName, checkName };
}

/**
 * Makes the evidence statement that records `operationId` wait, inside that statement (its row lock held), on
 * advisory lock `key`: a test holding the lock keeps that operation's dispatch batch in its opening phase until
 * it lets go.
 */
export async function pauseEvidenceOn(pool: Pool, operationId: string, key: number): Promise<void> {
  await pool.query(`
    CREATE FUNCTION public.pause_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.operation_id = '${operationId}' THEN PERFORM pg_advisory_xact_lock(${key}); END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER pause_evidence BEFORE INSERT ON actionledger.authorization_evidence
      FOR EACH ROW EXECUTE FUNCTION public.pause_evidence();`);
}

/** The operation's status now (undefined when there is no such operation). */
export async function statusOf(pool: Pool, operationId: string): Promise<string | undefined> {
  return (
    await pool.query<{ status: string }>('SELECT status FROM actionledger.operations WHERE operation_id = $1', [
      operationId,
    ])
  ).rows[0]?.status;
}

/** How many evidence rows the operation has (one per claim that recorded a decision). */
export async function evidenceRows(pool: Pool, operationId: string): Promise<number> {
  return (
    (
      await pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM actionledger.authorization_evidence WHERE operation_id = $1',
        [operationId],
      )
    ).rows[0]?.n ?? 0
  );
}

/** Polls until `op` reaches a state outside `executing`/`pending`, or times out. */
export async function settled(
  pool: Pool,
  operationId: string,
  timeoutMs = 15_000,
): Promise<{
  status: string;
  review_reason: string | null;
  provider_receipt: string | null;
  result_json: Record<string, unknown> | null;
  provider_contact: string;
}> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await pool.query(
      'SELECT status, review_reason, provider_receipt, result_json, provider_contact FROM actionledger.operations WHERE operation_id = $1',
      [operationId],
    );
    const row = rows[0] as
      | {
          status: string;
          review_reason: string | null;
          provider_receipt: string | null;
          result_json: Record<string, unknown> | null;
          provider_contact: string;
        }
      | undefined;
    if (row !== undefined && row.status !== 'pending' && row.status !== 'executing') return row;
    if (Date.now() > deadline) throw new Error(`operation ${operationId} still ${row?.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export const ctx = (step: string, over: Record<string, string> = {}) => ({
  tenant_id: 'tenant-a',
  principal_id: 'agent-1',
  task_id: 'task-1',
  workflow_step_id: step,
  approval_id: 'approval-1',
  policy_version: 'policy-1',
  ...over,
});

/** `actionledger start` as a real child process, leader of its own process group (as a terminal runs it). */
export interface ServiceProcess {
  readonly pid: number;
  /** Everything written so far to stdout (the JSON log) and stderr. */
  stdout(): string;
  stderr(): string;
  /** The JSON log lines so far. */
  lines(): Record<string, unknown>[];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Resolves once a log line's text matches; rejects after `timeoutMs` or when the process exits first. */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
  /** SIGKILL to its whole process group (a test's teardown), then its exit; nothing when it is gone already. */
  killGroup(): Promise<void>;
}

export function spawnService(bin: string, args: string[], env: NodeJS.ProcessEnv): ServiceProcess {
  const child = spawn(...nodeCommand([bin, 'start', ...args]), {
    env: { PATH: process.env.PATH, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (err += c.toString()));
  let done = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => {
      done = true;
      resolve({ code, signal });
    }),
  );
  return {
    pid: child.pid ?? -1,
    stdout: () => out,
    stderr: () => err,
    lines: () =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    exited,
    async waitFor(pattern, timeoutMs = 60_000) {
      const deadline = Date.now() + timeoutMs;
      while (!pattern.test(out)) {
        if (done) throw new Error(`service exited before ${String(pattern)}:\n${out}\n${err}`);
        if (Date.now() > deadline) throw new Error(`no ${String(pattern)} within ${timeoutMs} ms:\n${out}\n${err}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async killGroup() {
      try {
        if (!done) process.kill(-(child.pid ?? -1), 'SIGKILL');
      } catch {
        // already gone
      }
      await exited;
    },
  };
}

/** The postmaster pid recorded in an embedded cluster's folder, or undefined when none runs there. */
export function postmasterPidIn(dataDir: string): number | undefined {
  try {
    const pid = Number(readFileSync(join(dataDir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** A request handler of the sandbox provider. */
export type ProviderHandler = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

/** Replaces the sandbox provider's request handler with `fn(its own handler)`: a test answers some requests itself. */
export function patchProvider(provider: SandboxProvider, fn: (orig: ProviderHandler) => ProviderHandler): void {
  const s = provider as unknown as { handle: ProviderHandler };
  s.handle = fn(s.handle.bind(provider));
}

/**
 * How long after an operation entered `unknown` (or its dead worker's claim was found) the reconciler trusts a
 * readback of "no effect" in these environments: twice the dispatch kit's 1 s provider timeout, the reconciler's
 * 1 s margin, and a little more for scheduling. A pass sooner leaves it `unknown` (`reconcile:no_effect_unsettled`).
 */
export const IN_FLIGHT_WAIT_MS = 3_200;

/** Runs reconciliation passes until operation `id` is neither `unknown` nor `executing` (or throws at the timeout). */
export async function passUntilResolved(
  pool: Pool,
  kit: { pass(): Promise<unknown> },
  id: string,
  timeoutMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await kit.pass();
    const status = await statusOf(pool, id);
    if (status !== 'unknown' && status !== 'executing') return;
    if (Date.now() > deadline) throw new Error(`operation ${id} still ${status}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
