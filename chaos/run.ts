/**
 * `npm run chaos -- --seed S --ops N --workers W`: the fault-injection run.
 *
 * A real fleet of W `actionledger dispatcher` processes against an embedded PostgreSQL (behind a TCP proxy
 * that delays, pauses and resets connections, mid-COMMIT included, and restarted once mid-run), the sandbox
 * authorizer and a provider that does NOT honour idempotency keys (so a duplicate dispatch would show as two
 * effects), all on loopback over mTLS. Workers and `reconcile --once` runs are SIGKILLed at named crash points
 * and restarted, and some reconcile runs are SIGKILLed while a readback of their pass hangs. An agent reserves
 * part of the operations through the gate while an operator engages and lifts kill switches and revokes and
 * restores the agent's role (chaos/gate-faults.ts). Then faults stop, a reviewer retries what was provably not
 * applied, the fleet drains, the reconciler runs until nothing changes, and the checker prints the invariants
 * table; the last line is `invariants: N violated`, and the exit code is 1 when N > 0.
 *
 * Every random choice (faults per operation, crash points, fault schedule) comes from the seed printed first.
 * The same seed makes the same choices; the interleaving of processes is the machine's.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { compileConfig, quoteSchemaName } from '../config/index.js';
import { createPool } from '../db/db.js';
import { openEmbeddedDatabase, type EmbeddedDatabase } from '../embedded/embedded.js';
import { createLogger } from '../core/log.js';
import { Metrics } from '../core/metrics.js';
import { migrate } from '../db/migrate.js';
import type { Runtime } from '../runtime/runtime.js';
import { Secret } from '../core/secret.js';
import { CRASH_POINTS } from '../core/crash-points.js';
import { EffectKeyer } from '../ledger/effect-key.js';
import { Gate } from '../gate/index.js';
import { Ledger } from '../ledger/reserve.js';
import type { ProviderContact } from '../ledger/index.js';
import { openReconciler, retryIsSafe } from '../reconciler/index.js';
import { startDispatchKit } from '../sandbox/kit.js';
import { checkInvariants } from './checker.js';
import { DELIBERATE_REVIEW_REASONS, FaultPlan } from './faults.js';
import { AGENT, GateFaults } from './gate-faults.js';
import { reconcileRuns, type ReconcileRunStats } from './reconcile-runs.js';
import { Rng } from './rng.js';
import { TcpProxy } from './tcp-proxy.js';

const BIN = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'bin', 'actionledger.js');
const SECRET = 'chaos-effect-key-secret-0123456789abcdef';
const TOKEN = 'chaos-provider-token';
const DISPATCH_POINTS = CRASH_POINTS.filter((p) => !p.startsWith('reconcile_'));
const AGENT_LANES = 4; // the agent's concurrent calls (an agent's parallel tool calls)
async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const say = (line: string): void => void process.stdout.write(`${line}\n`);

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      seed: { type: 'string' },
      ops: { type: 'string', default: '1000' },
      workers: { type: 'string', default: '4' },
      concurrency: { type: 'string', default: '4' },
      'no-pg-restart': { type: 'boolean' },
      'deadline-s': { type: 'string', default: '600' },
      /** Append the workers' error logs (pino JSON, level error) to this file. */
      'worker-log': { type: 'string' },
    },
  });
  const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(values.seed);
  const N = Number(values.ops);
  const W = Number(values.workers);
  const C = Number(values.concurrency);
  const deadline = Date.now() + Number(values['deadline-s']) * 1000;
  if (![seed, N, W, C].every((n) => Number.isInteger(n) && n >= 0) || N < 1 || W < 1 || C < 1) {
    process.stderr.write(
      'usage: chaos --seed S --ops N --workers W [--concurrency C] [--no-pg-restart] [--deadline-s S]\n',
    );
    return 2;
  }
  say(`seed: ${seed}`);
  say(`operations: ${N}, workers: ${W} x ${C}`);
  const rng = new Rng(seed);

  // PostgreSQL, its proxy, the PKI, the provider and the authorizer.
  const dir = mkdtempSync(join(tmpdir(), 'al-chaos-'));
  chmodSync(dir, 0o711);
  const pgPort = await freePort();
  let db: EmbeddedDatabase = await openEmbeddedDatabase({ dataDir: join(dir, 'pg'), port: pgPort });
  const url = db.url;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await migrate(admin, 'actionledger', quoteSchemaName('actionledger'));
  await admin.end();
  const proxy = new TcpProxy({ host: '127.0.0.1', port: pgPort });
  const proxyPort = await proxy.listen();
  const proxiedUrl = url.replace(`:${pgPort}/`, `:${proxyPort}/`);

  const sandbox = await startDispatchKit({
    dir,
    token: TOKEN,
    honorIdempotencyKey: false,
    profileKey: 'ed25519',
    profile: { profile_id: 'chaos', authorization_http_timeout_seconds: 3 },
  });
  const { provider, authorizer } = sandbox;
  // Readbacks go through a relay of their own, so a reconcile run can be caught (and killed) in the middle of one.
  const providerUrl = new URL(provider.endpoint);
  const relay = new TcpProxy({ host: '127.0.0.1', port: Number(providerUrl.port) });
  const relayPort = await relay.listen();
  const readbackBase = `${providerUrl.protocol}//${providerUrl.hostname}:${relayPort}${providerUrl.pathname}`;
  const raw = {
    database: { pool_max: 8, statement_timeout_ms: 10_000 },
    tools: {
      issue_refund: {
        provider_id: 'chaos-billing',
        endpoint: provider.endpoint,
        allowed_tenants: ['tenant-a', 'tenant-b'],
        credential_env: 'CHAOS_BILLING_TOKEN',
        idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
        definitive_failure_statuses: [400, 422],
        readback: { url: `${readbackBase}/by-key/{effect_key}` },
      },
    },
    gate: {
      tools: {
        issue_refund: {
          schema: {
            type: 'object',
            additionalProperties: false,
            required: ['order_id', 'amount', 'currency'],
            properties: { order_id: { type: 'string' }, amount: { type: 'number' }, currency: { type: 'string' } },
          },
          roles: [AGENT.role],
        },
      },
    },
    dispatcher: {
      poll_interval_ms: 200,
      heartbeat_interval_ms: 300,
      batch_size: 8,
      shutdown_deadline_ms: 5000,
      // Released claims come back within seconds: the run is minutes long, not hours.
      release_backoff_initial_ms: 200,
      release_backoff_max_ms: 3000,
      ...sandbox.dispatcherConfig,
    },
    // A reviewed retry given ahead of time: what the provider's readback proves it never applied is dispatched
    // again, with a fresh authorization, as a person would retry it (the reconcile runs apply it).
    review_policies: [
      {
        name: 'chaos-retry-no-effect',
        tools: ['issue_refund'],
        reasons: ['no_effect_confirmed'],
        max_retries: 3,
        authorized_by: 'chaos-operator',
        authorized_at: '2026-12-04',
      },
    ],
    reconciler: {
      orphan_after_ms: 1500,
      backoff_initial_ms: 100,
      backoff_max_ms: 400,
      max_attempts: 6,
      concurrency: 4,
    },
  };
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(raw));
  const workerLog = values['worker-log'] === undefined ? 'ignore' : openSync(values['worker-log'], 'a');
  const baseEnv = {
    ACTIONLEDGER_CONFIG: configPath,
    ACTIONLEDGER_EFFECT_KEY_SECRET: SECRET,
    CHAOS_BILLING_TOKEN: TOKEN,
    LOG_LEVEL: workerLog === 'ignore' ? 'fatal' : 'error',
  };
  const config = compileConfig(raw, { ...baseEnv, DATABASE_URL: url });
  const pool = createPool(url, { max: 12, statementTimeoutMs: 30_000, applicationName: 'chaos' });
  const secrets = { active: 'k1', secrets: new Map([['k1', new Secret(Buffer.from(SECRET))]]) };
  const ledger = new Ledger(config, pool, new EffectKeyer(secrets));

  // Reserve all but the agent's share up front (two tenants, so a tenant's kill switch holds part of the
  // queue), and choose each operation's faults from the seed; the agent's operations get theirs, from a
  // generator of their own, as its calls are accepted during the fault phase.
  const G = Math.floor(N / 6);
  const reservedIds: string[] = [];
  const faults = new FaultPlan();
  for (let i = 0; i < N - G; i += 50) {
    const batch = await Promise.all(
      Array.from({ length: Math.min(50, N - G - i) }, (_, j) =>
        ledger.reserve(
          {
            tenant_id: (i + j) % 2 === 0 ? 'tenant-a' : 'tenant-b',
            principal_id: 'chaos',
            task_id: `task-${i + j}`,
            workflow_step_id: '1',
            approval_id: 'approval-1',
            policy_version: 'policy-1',
          },
          'issue_refund',
          { order_id: `o-${i + j}`, amount: 1 + ((i + j) % 997), currency: 'EUR' },
        ),
      ),
    );
    for (const r of batch) {
      reservedIds.push(r.operation_id);
      faults.choose(r.effect_key, rng);
    }
  }
  faults.install(provider, authorizer);
  say(`faults chosen: ${faults.summary()}`);

  // The fleet, with crash points; every worker that dies is restarted while the fault phase lasts.
  const stats = { workerCrashes: 0, workerStops: 0, pgRestarts: 0, proxyFaults: 0 };
  let phase: 'faults' | 'drain' | 'done' = 'faults';
  const live = new Set<ChildProcess>();
  const spawnWorker = (withCrash: boolean): void => {
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, ...baseEnv, DATABASE_URL: proxiedUrl };
    // Most workers crash at the Nth time a named point is reached; the others are stopped with SIGTERM after a
    // few seconds (a graceful stop under the same faults), so the fleet keeps cycling: a worker that never
    // crashed would otherwise live to the end of the fault phase.
    const crashes = withCrash && rng.chance(0.6);
    if (crashes) {
      env.ACTIONLEDGER_CRASH_POINTS_ENABLED = '1';
      env.ACTIONLEDGER_CRASH_AT = `${rng.pick(DISPATCH_POINTS)}:${rng.int(1, 40)}`;
    }
    const child = spawn(process.execPath, [BIN, 'dispatcher', '--concurrency', String(C)], {
      env,
      stdio: ['ignore', workerLog, workerLog],
    });
    live.add(child);
    const stopAfter =
      withCrash && !crashes ? setTimeout(() => child.kill('SIGTERM'), rng.int(3_000, 10_000)) : undefined;
    child.once('exit', (_code, signal) => {
      clearTimeout(stopAfter);
      live.delete(child);
      if (signal === 'SIGKILL') stats.workerCrashes++;
      if (signal === null && stopAfter !== undefined) stats.workerStops++;
      if (phase === 'faults' && Date.now() < deadline) setTimeout(() => spawnWorker(true), rng.int(100, 500));
    });
  };
  for (let i = 0; i < W; i++) spawnWorker(true);

  const count = async (sql: string): Promise<number> => {
    for (;;) {
      try {
        const { rows } = await pool.query<{ n: number }>(sql);
        return rows[0]?.n ?? 0;
      } catch {
        await sleep(200); // the database may be restarting
      }
    }
  };
  // The operations still waiting to be claimed: their outbox rows (no status index to count them by).
  const waiting = (): Promise<number> => count(`SELECT count(*)::int AS n FROM actionledger.outbox`);

  // Reconciliation runs as separate processes during the fault phase, some of them SIGKILLed mid-pass.
  const reconcileStats: ReconcileRunStats = { runs: 0, killed: 0, killedMidPass: 0 };
  const reconcileLoop = reconcileRuns({
    bin: BIN,
    env: { PATH: process.env.PATH, ...baseEnv, DATABASE_URL: proxiedUrl },
    rng: new Rng(seed ^ 0x165667b1),
    relay,
    active: () => phase === 'faults',
    stats: reconcileStats,
  });

  // The gate: an agent's calls, and an operator's kill switches and role revocations, while everything else goes on.
  // Its connections go through the proxy too, so its commits are cut and its calls repeated like the workers'.
  const gatePool = createPool(proxiedUrl, { max: 4, statementTimeoutMs: 30_000, applicationName: 'chaos-gate' });
  const gateLedger = new Ledger(config, gatePool, new EffectKeyer(secrets));
  const gate = new Gate({ config, pool: gatePool, ledger: gateLedger });
  const gateFaults = new GateFaults(gate, new Rng(seed ^ 0x5bd1e995), 'issue_refund');
  const agentFaultRng = new Rng(seed ^ 0x27d4eb2d);
  let agentDone = false;
  const agentLoop = gateFaults
    .agent(G, AGENT_LANES, deadline, (effectKey) => faults.choose(effectKey, agentFaultRng))
    .then(() => void (agentDone = true));
  // The operator works while the agent calls (and until it has made every kind of change): a switch held all
  // through the fault phase would hold the queue with it, and the phase would last as long as the operator kept on.
  const operatorLoop = gateFaults.operator(() => phase === 'faults' && !(agentDone && gateFaults.everyKindDone));

  // Network and server faults on a seeded schedule; PostgreSQL restarts once, a third of the way in.
  const restartPg = values['no-pg-restart'] !== true;
  const faultLoop = (async () => {
    let restarted = !restartPg;
    while (phase === 'faults') {
      await sleep(rng.int(300, 1200));
      if (phase !== 'faults') break;
      const left = await waiting();
      if (!restarted && left < N * 0.67) {
        restarted = true;
        stats.pgRestarts++;
        await db.stop();
        await sleep(rng.int(200, 800));
        db = await openEmbeddedDatabase({ dataDir: join(dir, 'pg'), port: pgPort });
        continue;
      }
      stats.proxyFaults++;
      switch (rng.pick(['delay', 'pause', 'reset', 'commit'] as const)) {
        case 'delay':
          proxy.setDelay(rng.int(1, 30));
          await sleep(rng.int(200, 1000));
          proxy.setDelay(0);
          break;
        case 'pause':
          proxy.pause();
          await sleep(rng.int(100, 700));
          proxy.resume();
          break;
        case 'reset':
          proxy.resetAll();
          break;
        case 'commit':
          proxy.resetNextCommits(rng.int(1, 3));
          break;
      }
    }
  })();

  // The fault phase lasts until the agent's calls are all accepted, the operator has made every kind of change,
  // and nothing waits (an engaged switch holds operations pending, so this also waits for its lift).
  while (!(agentDone && gateFaults.everyKindDone && (await waiting()) === 0) && Date.now() < deadline) await sleep(250);
  phase = 'drain';
  await operatorLoop;
  await agentLoop;
  await faultLoop;
  proxy.setDelay(0);
  proxy.resume();
  await reconcileLoop;
  await stopAll(live);
  say(
    `fault phase over: ${stats.workerCrashes} worker crashes, ${stats.workerStops} graceful worker stops, ${reconcileStats.killed}/${reconcileStats.runs} reconcile runs crashed, ${stats.pgRestarts} PostgreSQL restart, ${stats.proxyFaults} proxy faults, ${proxy.stats.commitResets} connections cut mid-COMMIT`,
  );
  say(`reconcile runs killed mid-pass (during a readback): ${reconcileStats.killedMidPass}`);
  const g = gateFaults.stats;
  const refusals =
    Object.entries(g.refused)
      .sort()
      .map(([k, n]) => `${k} ${n}`)
      .join(', ') || 'none';
  say(
    `gate: ${g.accepted} agent calls accepted after refusals (${refusals}); kill switches engaged ${g.switchesEngaged.tenant} per tenant, ${g.switchesEngaged.tool} per tool, ${g.switchesEngaged.all} for everything, ${g.switchesLifted} lifted; role revoked ${g.rolesRevoked}, restored ${g.rolesRestored}`,
  );

  // Settle: reconcile until nothing changes, let a reviewer retry what provably never reached the provider,
  // drain that with a fault-free fleet, and reconcile again.
  const runtime: Runtime = {
    config,
    log: createLogger({ level: 'silent', name: 'chaos' }),
    metrics: new Metrics({ defaultMetrics: false }),
    pool,
    databaseUrl: url,
    embedded: null,
    effectKeys: secrets,
    close: () => Promise.resolve(),
  };
  const kit = await openReconciler(runtime, { ...baseEnv, DATABASE_URL: url });
  await reconcileUntilStable(kit, count, deadline);
  const { rows: before } = await pool.query<{ state: string; n: number }>(
    `SELECT CASE WHEN status = 'needs_review' THEN 'needs_review (' || review_reason || ')' ELSE status END AS state, count(*)::int AS n
     FROM actionledger.operations GROUP BY 1 ORDER BY 1`,
  );
  // Review caused on purpose (a denial, a stale decision, a revoked role) is labelled; the rest is what
  // self-healing should have kept from a person.
  const deliberate = (state: string): boolean => DELIBERATE_REVIEW_REASONS.some((r) => state === `needs_review (${r})`);
  say(
    `after the fault phase and reconciliation: ${before
      .map((r) => `${r.state}${deliberate(r.state) ? ' deliberate' : ''} ${r.n}`)
      .join(', ')}`,
  );
  const inReview = before.filter((r) => r.state.startsWith('needs_review'));
  const reviewDeliberate = inReview.filter((r) => deliberate(r.state)).reduce((a, r) => a + r.n, 0);
  const reviewOther = inReview.filter((r) => !deliberate(r.state)).reduce((a, r) => a + r.n, 0);
  const total = before.reduce((a, r) => a + r.n, 0);
  const pct = (n: number): string => `${((100 * n) / Math.max(1, total)).toFixed(2)}%`;
  say(
    `in review: ${reviewDeliberate} deliberate (${pct(reviewDeliberate)}), ${reviewOther} not deliberate (${pct(reviewOther)}) of ${total} operations`,
  );
  const healed = await count(
    `SELECT count(*) FILTER (WHERE reason LIKE 'released:%')::int AS n FROM actionledger.operation_history`,
  );
  const byPolicy = await count(
    `SELECT count(*) FILTER (WHERE actor LIKE 'policy:%' AND to_status = 'pending')::int AS n FROM actionledger.operation_history`,
  );
  say(`healed without a person: ${healed} never-sent claims released to the queue, ${byPolicy} review-policy retries`);
  const { rows: review } = await pool.query<{
    operation_id: string;
    effect_key: string;
    review_reason: string;
    provider_contact: ProviderContact;
  }>(
    `SELECT operation_id, effect_key, review_reason, provider_contact FROM actionledger.operations WHERE status = 'needs_review'`,
  );
  let retried = 0;
  for (const r of review) {
    if (!retryIsSafe(r.provider_contact)) continue;
    faults.forget(r.effect_key);
    await kit.review.retry(r.operation_id, { actor: 'chaos-reviewer', reason: `retry after ${r.review_reason}` });
    retried++;
  }
  // Drain, then reconcile; a pass may send work back to the queue (a review policy's retry of what a readback
  // proved never applied), so drain again until a pass leaves nothing pending.
  for (;;) {
    for (let i = 0; i < W; i++) spawnWorker(false);
    while ((await waiting()) > 0 && Date.now() < deadline) await sleep(250);
    await stopAll(live);
    await reconcileUntilStable(kit, count, deadline);
    if ((await waiting()) === 0 || Date.now() > deadline) break;
  }
  phase = 'done';
  say(`reviewer retried ${retried} operations that provably had no effect`);

  const result = await checkInvariants({
    pool,
    schema: 'actionledger',
    reservedIds: [...reservedIds, ...gateFaults.reserved.map((r) => r.operation_id)],
    effects: provider.allEffects(),
    requests: provider.requests(),
    gateChanges: gateFaults.changes,
  });
  say('');
  say('| invariant | violations |');
  say('|---|---|');
  for (const inv of result.invariants) say(`| ${inv.name} | ${inv.violations} |`);
  say('');
  say('| end state | operations |');
  say('|---|---|');
  for (const [k, v] of Object.entries(result.byStatus).sort()) say(`| ${k} | ${v} |`);
  say('');
  say(`provider: ${result.providerRequests} requests, ${result.providerEffects} effects for ${N} operations`);
  for (const inv of result.invariants)
    for (const ex of inv.examples) process.stderr.write(`violation: ${inv.name}: ${ex}\n`);

  kit.close();
  ledger.stop();
  gateLedger.stop();
  await gatePool.end();
  await pool.end();
  await sandbox.stop();
  await proxy.close();
  await relay.close();
  await db.stop();
  rmSync(dir, { recursive: true, force: true });
  say(`invariants: ${result.violated} violated`);
  return result.violated === 0 ? 0 : 1;
}

async function stopAll(children: Set<ChildProcess>): Promise<void> {
  await Promise.all(
    [...children].map(
      (c) =>
        new Promise<void>((resolve) => {
          if (c.exitCode !== null || c.signalCode !== null) return resolve();
          const timer = setTimeout(() => c.kill('SIGKILL'), 15_000);
          c.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
          c.kill('SIGTERM');
        }),
    ),
  );
}

async function reconcileUntilStable(
  kit: Awaited<ReturnType<typeof openReconciler>>,
  count: (sql: string) => Promise<number>,
  deadline: number,
): Promise<void> {
  for (;;) {
    const s = await kit.pass();
    const open = await count(
      `SELECT count(*)::int AS n FROM actionledger.operations WHERE status IN ('unknown', 'executing')`,
    );
    if (open === 0 || Date.now() > deadline) return;
    if (s.reconcile.examined === 0) await sleep(200);
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
