/**
 * `npm run bench -- --only tracing`: what OpenTelemetry tracing costs, off and on. One real Dispatcher (N in flight)
 * and N producers in a closed loop, each reserving `issue_refund` and waiting for `succeeded` (reservation commit
 * acknowledged -> outcome commit acknowledged), in one environment per level and round, cells alternating:
 *
 *   off, on, off, on
 *
 *   - off: tracing off, as in a process without an OTLP endpoint: every hook is one boolean test. Before the first
 *     "on" cell of the process nothing of the SDK is loaded; after one, its context manager, propagator and
 *     provider are unregistered again (`disable()` of each), so the second "off" runs the same code as the first.
 *   - on: the SDK started as a process with `OTEL_EXPORTER_OTLP_ENDPOINT` starts it (core/tracing-sdk.ts), always
 *     sampled (parentbased_always_on, every reservation a root), the batch processor exporting OTLP/HTTP JSON to a
 *     receiver in a child process of its own (it parses each export and counts the spans). Per operation: the
 *     reservation, the dispatch, the claim, and the two requests' client spans (the sandbox's servers run in a
 *     worker thread, which does not trace).
 *
 * Reported per level (medians over rounds): each cell's rate and p50 / p99, "off again / off" (the run-to-run
 * spread of two identical cells: what "not measurable" is measured against), "on / off" for the rate and p50, and
 * the spans received per operation. The hooks' own cost with tracing off is also timed alone: every tracing call a
 * reserved-and-dispatched operation makes when off (the boolean tests, the reservation's stored context,
 * `withSpan` without a span), a million times, in ns per operation and as a share of the off p50.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { context, propagation, trace } from '@opentelemetry/api';
import { activeTraceContext, disableTracing, enableTracing, tracingOn, withSpan } from '../core/tracing.js';
import { startSdk } from '../core/tracing-sdk.js';
import {
  ARGS,
  cellContext,
  closedLoopOps,
  COMPLETION_TIMEOUT_MS,
  dropDatabase,
  medianOf,
  migratedDatabase,
  producerContext,
  type CellLimits,
  type Run,
} from './cells.js';
import { findPostmaster, waitForQuiet } from './cpu.js';
import { createBenchPki, openDispatchBench, type BenchPki } from './dispatch-env.js';
import { machine, openBenchDatabase, printTable, saveResults, stopOnSignal, type ResultEntry } from './harness.js';

export interface TracingOptions {
  levels: number[];
  limits: CellLimits;
  rounds: number;
  quietMaxSeconds: number;
  save: boolean;
}

interface TracingRound {
  off: Run;
  on: Run;
  offAgain: Run;
  onAgain: Run;
  spansPerOp: number;
}

/** The OTLP receiver, a child process: answers 200 to every export, and `GET /count` with the spans so far. */
class Receiver {
  readonly #child: ChildProcess;
  readonly port: Promise<number>;

  constructor() {
    const script = `
      const http = require('node:http');
      let spans = 0;
      const server = http.createServer((req, res) => {
        const chunks = [];
        req.on('data', (c) => chunks.push(c));
        req.on('end', () => {
          if (req.method === 'GET') return res.end(String(spans));
          try {
            for (const rs of JSON.parse(Buffer.concat(chunks).toString()).resourceSpans ?? [])
              for (const ss of rs.scopeSpans ?? []) spans += (ss.spans ?? []).length;
          } catch {}
          res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        });
      });
      server.listen(0, '127.0.0.1', () => process.stdout.write(String(server.address().port) + '\\n'));`;
    this.#child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    this.port = new Promise((resolve, reject) => {
      this.#child.stdout?.once('data', (c: Buffer) => resolve(Number(c.toString().trim())));
      this.#child.once('exit', () => reject(new Error('the OTLP receiver exited')));
    });
  }

  async spans(): Promise<number> {
    const res = await fetch(`http://127.0.0.1:${await this.port}/count`);
    return Number(await res.text());
  }

  stop(): void {
    this.#child.kill();
  }
}

/** Every tracing call one reserved-and-dispatched operation makes with tracing off, as the code makes them. */
function offHooks(): Promise<unknown> {
  // The reservation, the producer's claim, the pipeline and the two requests' exchange: tracingOn() each.
  let n = Number(tracingOn()) + Number(tracingOn()) + Number(tracingOn()) + Number(tracingOn()) + Number(tracingOn());
  // The pipeline and the executor: withSpan without a span.
  n += withSpan(undefined, () => 1) + withSpan(undefined, () => 1);
  // The reservation's stored context (null when off).
  return Promise.resolve(activeTraceContext() ?? n);
}

async function hookCostNs(): Promise<number> {
  const count = 1_000_000;
  for (let i = 0; i < 10_000; i++) await offHooks();
  const start = process.hrtime.bigint();
  for (let i = 0; i < count; i++) await offHooks();
  const baseline = process.hrtime.bigint();
  // The loop's own cost (an awaited resolved promise), taken off.
  for (let i = 0; i < count; i++) await Promise.resolve(null);
  const end = process.hrtime.bigint();
  return Math.max(0, Number(baseline - start - (end - baseline)) / count);
}

async function tracingCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  limits: CellLimits,
  receiver: Receiver,
): Promise<TracingRound> {
  const name = `al_bench_tracing_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  try {
    const env = await openDispatchBench(pki, url, n, n + 4);
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
      const off = async (tag: string): Promise<Run> =>
        closedLoopOps(n, limits.ops, limits.capMs, cycle(tag), limits.minMs);
      const on = async (tag: string): Promise<{ run: Run; spans: number }> => {
        const sdk = startSdk(process.env, 'bench');
        enableTracing();
        const before = await receiver.spans();
        try {
          const run = await closedLoopOps(n, limits.ops, limits.capMs, cycle(tag), limits.minMs);
          // What the cell recorded reaches the receiver before the next cell (not timed).
          await sdk.flush();
          return { run, spans: (await receiver.spans()) - before };
        } finally {
          disableTracing();
          await sdk.shutdown();
          trace.disable();
          context.disable();
          propagation.disable();
        }
      };
      await closedLoopOps(n, Math.max(20, 2 * n), limits.capMs, cycle('warm'));
      notSucceeded = 0;
      const offRun = await off('off');
      const onRun = await on('on');
      const offAgain = await off('off2');
      const onAgain = await on('on2');
      if (notSucceeded > 0)
        process.stderr.write(`WARNING tracing N=${n}: ${notSucceeded} operations did not succeed\n`);
      const ops = onRun.run.ops + onAgain.run.ops;
      return {
        off: offRun,
        on: onRun.run,
        offAgain,
        onAgain: onAgain.run,
        spansPerOp: ops === 0 ? 0 : (onRun.spans + onAgain.spans) / ops,
      };
    } finally {
      cellContext.sandboxThread = null;
      await env.close();
    }
  } finally {
    await dropDatabase(adminUrl, name);
  }
}

/** The tracing part: each level `rounds` times, on one PostgreSQL; prints its table, saves `runs.tracing`. */
export async function runTracingBench(o: TracingOptions): Promise<void> {
  // The exporter reads the standard variables; the receiver's port is known once it listens.
  const receiver = new Receiver();
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${await receiver.port}`;
  process.env.OTEL_SERVICE_NAME = 'actionledger-bench';
  const db = await openBenchDatabase();
  const version = db.version;
  stopOnSignal(db);
  cellContext.postmaster = await findPostmaster(db.adminUrl).catch(() => null);
  const pki = await createBenchPki();
  const hookNs = await hookCostNs();
  const byLevel = new Map<number, TracingRound[]>();
  process.stdout.write(
    `\nTracing: reserve -> succeeded through one Dispatcher, N in flight, cells alternating off, on, off, on (PostgreSQL ${db.version}; ${o.rounds} round(s)):\n`,
  );
  try {
    for (let round = 1; round <= o.rounds; round++)
      for (const n of o.levels) {
        await waitForQuiet(cellContext.postmaster, o.quietMaxSeconds * 1000);
        const r = await tracingCell(db.adminUrl, pki, n, o.limits, receiver);
        byLevel.set(n, [...(byLevel.get(n) ?? []), r]);
        process.stdout.write(
          `  round ${round} N=${n}: off ${r.off.opsPerS.toFixed(0)} ops/s, on ${r.on.opsPerS.toFixed(0)}, ` +
            `off ${r.offAgain.opsPerS.toFixed(0)}, on ${r.onAgain.opsPerS.toFixed(0)}; ${r.spansPerOp.toFixed(2)} spans/op\n`,
        );
      }
  } finally {
    await db.close();
    receiver.stop();
  }
  const rows: (string | number)[][] = [];
  const entries: ResultEntry[] = [];
  for (const n of o.levels) {
    const rs = byLevel.get(n) ?? [];
    if (rs.length === 0) continue;
    const m = (f: (r: TracingRound) => number): number => medianOf(rs.map(f));
    const offRate = m((r) => (r.off.opsPerS + r.offAgain.opsPerS) / 2);
    const onRate = m((r) => (r.on.opsPerS + r.onAgain.opsPerS) / 2);
    const offP50 = m((r) => (r.off.p50Ms + r.offAgain.p50Ms) / 2);
    const onP50 = m((r) => (r.on.p50Ms + r.onAgain.p50Ms) / 2);
    const offP99 = m((r) => (r.off.p99Ms + r.offAgain.p99Ms) / 2);
    const onP99 = m((r) => (r.on.p99Ms + r.onAgain.p99Ms) / 2);
    const spread = m((r) => r.offAgain.opsPerS / r.off.opsPerS);
    const rateRatio = m((r) => (r.on.opsPerS + r.onAgain.opsPerS) / (r.off.opsPerS + r.offAgain.opsPerS));
    const p50Ratio = m((r) => (r.on.p50Ms + r.onAgain.p50Ms) / (r.off.p50Ms + r.offAgain.p50Ms));
    const hookShare = (hookNs / 1e6 / offP50) * 100;
    rows.push([
      String(n),
      offRate,
      offP50,
      offP99,
      onRate,
      onP50,
      onP99,
      spread,
      rateRatio,
      p50Ratio,
      m((r) => r.spansPerOp),
      `${hookNs.toFixed(0)} ns (${hookShare.toPrecision(2)}% of p50)`,
    ]);
    entries.push({
      name: 'tracing',
      concurrency: n,
      ops_per_s: offRate,
      p50_ms: offP50,
      p99_ms: offP99,
      on_ops_per_s: onRate,
      on_p50_ms: onP50,
      on_p99_ms: onP99,
      off_again_over_off: spread,
      on_over_off_rate: rateRatio,
      on_over_off_p50: p50Ratio,
      spans_per_op: m((r) => r.spansPerOp),
      off_hooks_ns_per_op: hookNs,
      rounds: rs.length,
    });
  }
  process.stdout.write('\n');
  printTable(
    [
      'N',
      'off ops/s',
      'off p50 ms',
      'off p99 ms',
      'on ops/s',
      'on p50 ms',
      'on p99 ms',
      'off again / off',
      'on / off (rate)',
      'on / off (p50)',
      'spans/op',
      'off hooks per op',
    ],
    rows,
  );
  if (o.save) saveResults('tracing', entries, { machine: machine(), postgres: version, rounds: String(o.rounds) });
}
