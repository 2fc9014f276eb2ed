/**
 * `npm run bench -- --only isolation`: does a provider that hangs hold another provider's outcomes? One real
 * Dispatcher (concurrency N + H) routes `issue_refund` to a healthy sandbox provider and `issue_refund_slow`
 * (another provider id) to a second sandbox provider, in its own worker thread, that applies every request
 * and never answers within the cell (the profile's provider timeout, 120 s, outlasts it). In one environment:
 *   1. alone: N producers in a closed loop reserve `issue_refund` operations and wait for `succeeded`,
 *   2. then H `issue_refund_slow` operations are reserved and the cell waits until all H requests are at the
 *      hanging provider, and
 *   3. beside them: the same closed loop again.
 * Reported: the healthy provider's p99 (reservation commit acknowledged -> `succeeded` commit acknowledged)
 * beside the hanging provider as a ratio to its p99 alone, with the rates and p50s; and a check that the H
 * hanging operations were all still `executing` at the end (the hang held through the measurement). The ratio
 * of each round is taken within it; the table shows medians over rounds. Stopping the hanging thread resets
 * its connections: those operations end `unknown`, as they would at a provider timeout.
 */
import {
  ARGS,
  cellContext,
  closedLoopOps,
  COMPLETION_TIMEOUT_MS,
  dropDatabase,
  gitHead,
  medianOf,
  migratedDatabase,
  sleep,
  type CellLimits,
  type Run,
  producerContext,
} from './cells.js';
import { findPostmaster, waitForQuiet } from './cpu.js';
import { createBenchPki, CREDENTIAL_ENV, openDispatchBench, SandboxThread, type BenchPki } from './dispatch-env.js';
import { machine, openBenchDatabase, printTable, saveResults, stopOnSignal, type ResultEntry } from './harness.js';
import { sandboxRoute } from '../sandbox/kit.js';

export interface IsolationOptions {
  levels: number[];
  /** Operations kept hanging at the slow provider (8). */
  hanging: number;
  limits: CellLimits;
  rounds: number;
  quietMaxSeconds: number;
  save: boolean;
}

export interface IsolationResult {
  alone: Run;
  beside: Run;
  /** Hanging operations still `executing` when the measurement ended (all H when the hang held). */
  stillHanging: number;
  /** Requests the hanging provider received. */
  hangingPosts: number;
  notSucceeded: number;
}

export async function isolationCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  hanging: number,
  limits: CellLimits,
): Promise<IsolationResult> {
  const name = `al_bench_isolation_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  const slow = await SandboxThread.start(pki.server, { hang: true });
  let slowStopped = false;
  try {
    // The dispatcher: N + H in flight; a connection per healthy operation, the hanging batches' transactions,
    // LISTEN, claim and heartbeat.
    const env = await openDispatchBench(pki, url, n + hanging, n + hanging + 4, true, {
      profile: { provider_http_timeout_seconds: 120 },
      tools: {
        issue_refund_slow: sandboxRoute({
          provider_id: 'billing-slow',
          endpoint: slow.endpoint,
          credential_env: CREDENTIAL_ENV,
        }),
      },
    });
    cellContext.sandboxThread = env.sandbox.tid;
    try {
      let notSucceeded = 0;
      const cycle =
        (tag: string) =>
        async (w: number, i: number): Promise<number> => {
          const r = await env.ledger.reserve(producerContext(tag, w, i), 'issue_refund', ARGS);
          const committed = performance.now();
          const done = await env.probe.completions.wait(r.operation_id, COMPLETION_TIMEOUT_MS);
          if (done.status !== 'succeeded') notSucceeded++;
          return done.at - committed;
        };
      await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
      notSucceeded = 0;
      const alone = await closedLoopOps(n, limits.ops, limits.capMs, cycle('alone'), limits.minMs);

      const stuck: string[] = [];
      for (let i = 0; i < hanging; i++)
        stuck.push((await env.ledger.reserve(producerContext('hang', 0, i), 'issue_refund_slow', ARGS)).operation_id);
      const deadline = performance.now() + 30_000;
      while ((await slow.stats()).posts < hanging && performance.now() < deadline) await sleep(10);
      const hangingPosts = (await slow.stats()).posts;
      if (hangingPosts < hanging)
        process.stderr.write(
          `WARNING isolation N=${n}: ${hangingPosts} of ${hanging} requests reached the hanging provider\n`,
        );

      const beside = await closedLoopOps(n, limits.ops, limits.capMs, cycle('beside'), limits.minMs);
      const { rows } = await env.producerPool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM actionledger.operations WHERE operation_id = ANY($1::uuid[]) AND status = 'executing'",
        [stuck],
      );
      const stillHanging = rows[0]?.n ?? 0;
      if (stillHanging !== hanging)
        process.stderr.write(
          `WARNING isolation N=${n}: ${stillHanging} of ${hanging} hanging operations still executing\n`,
        );
      if (notSucceeded > 0)
        process.stderr.write(`WARNING isolation N=${n}: ${notSucceeded} healthy operations did not succeed\n`);
      // The hanging connections reset: those operations end unknown and the dispatcher can stop.
      await slow.stop();
      slowStopped = true;
      return { alone, beside, stillHanging, hangingPosts, notSucceeded };
    } finally {
      cellContext.sandboxThread = null;
      if (!slowStopped) {
        await slow.stop();
        slowStopped = true;
      }
      await env.close();
    }
  } finally {
    if (!slowStopped) await slow.stop();
    await dropDatabase(adminUrl, name);
  }
}

/** The isolation part: each level `rounds` times, on one PostgreSQL; prints its table, saves `runs.isolation`. */
export async function runIsolationBench(o: IsolationOptions): Promise<void> {
  const db = await openBenchDatabase();
  stopOnSignal(db);
  cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const pki = await createBenchPki();
  const byLevel = new Map<number, IsolationResult[]>();
  process.stdout.write(
    `\nIsolation: N healthy operations in flight alone, then beside ${o.hanging} hanging at another provider (PostgreSQL ${db.version}; ${o.rounds} round(s)):\n`,
  );
  try {
    for (let round = 1; round <= o.rounds; round++)
      for (const n of o.levels) {
        await waitForQuiet(cellContext.postmaster, o.quietMaxSeconds * 1000);
        const r = await isolationCell(db.adminUrl, pki, n, o.hanging, o.limits);
        byLevel.set(n, [...(byLevel.get(n) ?? []), r]);
        process.stdout.write(
          `  round ${round} N=${n}: alone ${r.alone.opsPerS.toFixed(0)} ops/s p99 ${r.alone.p99Ms.toFixed(1)} ms; ` +
            `beside the hanging provider ${r.beside.opsPerS.toFixed(0)} ops/s p99 ${r.beside.p99Ms.toFixed(1)} ms; ` +
            `${r.stillHanging} of ${o.hanging} still hanging at the end\n`,
        );
      }
  } finally {
    await db.close();
  }
  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  for (const n of o.levels) {
    const rs = byLevel.get(n) ?? [];
    if (rs.length === 0) continue;
    const m = (f: (r: IsolationResult) => number): number => medianOf(rs.map(f));
    const p99Ratio = m((r) => r.beside.p99Ms / r.alone.p99Ms);
    const p50Ratio = m((r) => r.beside.p50Ms / r.alone.p50Ms);
    const rateRatio = m((r) => r.beside.opsPerS / r.alone.opsPerS);
    const still = Math.min(...rs.map((r) => r.stillHanging));
    rows.push([
      String(n),
      m((r) => r.alone.opsPerS),
      m((r) => r.alone.p50Ms),
      m((r) => r.alone.p99Ms),
      m((r) => r.beside.opsPerS),
      m((r) => r.beside.p50Ms),
      m((r) => r.beside.p99Ms),
      p99Ratio,
      rateRatio,
      `${still} of ${o.hanging}`,
    ]);
    const common = {
      hanging_in_flight: o.hanging,
      rounds: rs.length,
    };
    entries.push(
      {
        name: 'isolation_healthy_alone',
        concurrency: n,
        ops_per_s: m((r) => r.alone.opsPerS),
        p50_ms: m((r) => r.alone.p50Ms),
        p99_ms: m((r) => r.alone.p99Ms),
        ops: m((r) => r.alone.ops),
        ...common,
      },
      {
        name: 'isolation_healthy_beside_hanging',
        concurrency: n,
        ops_per_s: m((r) => r.beside.opsPerS),
        p50_ms: m((r) => r.beside.p50Ms),
        p99_ms: m((r) => r.beside.p99Ms),
        ops: m((r) => r.beside.ops),
        p99_ratio_to_alone: p99Ratio,
        p50_ratio_to_alone: p50Ratio,
        ops_per_s_ratio_to_alone: rateRatio,
        hanging_still_executing_min: still,
        not_succeeded: Math.max(...rs.map((r) => r.notSucceeded)),
        ...common,
      },
    );
  }
  process.stdout.write(
    '\nHealthy provider alone and beside a hanging one (one dispatcher; reservation commit -> succeeded, ms; medians over rounds, ratios of each round):\n',
  );
  const table = printTable(
    [
      'N',
      'alone ops/s',
      'alone p50',
      'alone p99',
      'beside ops/s',
      'beside p50',
      'beside p99',
      'p99 beside / alone',
      'ops/s beside / alone',
      'hanging at the end',
    ],
    rows,
  );
  if (!o.save) return;
  saveResults('isolation', entries, {
    machine: machine(),
    postgres: db.version,
    rounds: String(o.rounds),
    hanging: String(o.hanging),
    lifecycle_cell: `>= ${o.limits.ops} ops and ${o.limits.minMs / 1000} s, none started after ${o.limits.capMs / 1000} s`,
    tree: gitHead(),
    tables: table,
  });
}
