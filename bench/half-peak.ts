/**
 * Enqueue -> dispatch latency at half the peak rate: an open-loop cell (arrivals at a fixed rate, whatever the
 * system's answers) beside the closed-loop cells of bench/cells.ts.
 *
 * The runner gives it actionledger's end-to-end peak of the same round (the best level's ops/s) and that level's
 * concurrency. On a fresh environment like {@link actionledgerCell}'s (a real Dispatcher of that concurrency,
 * pool concurrency + 4, the sandbox servers over mutual TLS), after a closed-loop warm-up, reservations arrive as
 * a Poisson process at half the peak rate for `seconds` (exponential gaps from a seeded generator, so every run
 * offers the same pattern scaled to its rate), each started at its arrival time without waiting for the others.
 *
 * Latency per operation: from its reservation commit acknowledged to the moment undici has written its provider
 * request to the socket (the diagnostics channel `undici:request:bodySent`, the one core/request-sent.ts watches
 * for crash points; recognised by the provider URL and the Idempotency-Key, the effect key); and, beside it, to
 * its outcome commit acknowledged. The achieved rate is operations succeeded / (start of the arrivals -> last
 * outcome commit acknowledged); the offered rate, arrivals / the arrival window.
 */
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import {
  ARGS,
  producerContext,
  COMPLETION_TIMEOUT_MS,
  cellContext,
  closedLoopOps,
  dropDatabase,
  migratedDatabase,
  nodeLoad,
  openBossMtls,
  sleep,
} from './cells.js';
import type { CpuSplit } from './cpu.js';
import { openDispatchBench, type BenchPki } from './dispatch-env.js';
import { percentiles } from './harness.js';

/** What an open loop measured: the rate offered and achieved, and the latency to the provider request sent. */
interface OpenLoopResult {
  /** The level the system runs at (dispatcher concurrency, or the peer's batch size) and the rate offered. */
  concurrency: number;
  targetOpsPerS: number;
  /** Arrivals started / the arrival window (the Poisson process's realised rate). */
  offeredOpsPerS: number;
  /** Operations succeeded / (first arrival -> last outcome commit acknowledged). */
  achievedOpsPerS: number;
  arrivals: number;
  seconds: number;
  /** Enqueue commit acknowledged -> provider request written to the socket. */
  p50Ms: number;
  p99Ms: number;
  /** Enqueue commit acknowledged -> outcome commit acknowledged. */
  outcomeP50Ms: number;
  outcomeP99Ms: number;
  /** How late the generator started arrivals against their schedule (timer and event-loop delay). */
  arrivalLagP99Ms: number;
  notSucceeded: number;
  /** Operations that succeeded but whose provider request (or, for actionledger, claim) went unseen (should be 0). */
  sendUnseen: number;
  elu: number;
  cpu: CpuSplit;
  /** The authorization requests made during the arrivals. */
  authorization: AuthorizationWatch;
  check: string;
}

export interface HalfPeakResult extends OpenLoopResult {
  /** The end-to-end rate the target was taken from. */
  peakOpsPerS: number;
  maxMs: number;
  /** Reservation commit acknowledged -> the claim that took it returned (where a slow send's time went). */
  claimP50Ms: number;
  claimP99Ms: number;
  /** Of the operations whose request went out at or after the p99 above: their median commit -> claim. */
  tailClaimMs: number;
  /**
   * Where commit -> sent went, stage by stage (median ms), for all operations and for those at or past the p99:
   * claim -> evidence sent (the authorization, and waiting for a dispatch batch), -> row locks answered (the
   * evidence statement, BEGIN and the locks, written together), -> request sent (the final check, the request's
   * start).
   */
  stages: { all: Record<string, number>; tail: Record<string, number> };
  /**
   * Connections the dispatcher's pool opened while the arrivals ran: each one opened while an operation waited
   * for it (it kept `dispatcherPoolFloor` open from its start).
   */
  dbConnectionsOpened: number;
}

/** mulberry32: a small seeded generator, so the arrival pattern is the same in every run. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Starts `one(i)` at the arrival times of a Poisson process of `opsPerS` for `seconds` (the same seeded pattern in
 * every run, scaled to the rate), each without waiting for the others, and resolves when all have settled.
 */
async function poissonArrivals(
  opsPerS: number,
  seconds: number,
  one: (i: number) => Promise<void>,
): Promise<{
  start: number;
  arrivals: number;
  failed: number;
  /** How late arrivals started against their schedule (timer and event-loop delay). */
  arrivalLagP99Ms: number;
  used: { elu: number; cpu: CpuSplit };
}> {
  const random = seeded(0x5eed);
  const lag: number[] = [];
  const inFlight: Promise<void>[] = [];
  const load = nodeLoad();
  const start = performance.now();
  const end = start + seconds * 1000;
  let at = start;
  for (;;) {
    at += (-Math.log(1 - random()) * 1000) / opsPerS;
    if (at >= end) break;
    const wait = at - performance.now();
    if (wait > 0) await sleep(wait);
    lag.push(performance.now() - at);
    inFlight.push(one(inFlight.length));
  }
  const settled = await Promise.allSettled(inFlight);
  const failed = settled.filter((s) => s.status === 'rejected').length;
  return { start, arrivals: inFlight.length, failed, arrivalLagP99Ms: percentiles(lag).p99Ms, used: load() };
}

interface UndiciRequestMessage {
  request?: { origin?: unknown; path?: unknown; headers?: unknown; body?: unknown };
}

/**
 * Records performance.now() when undici has written a request to `endpoint` (origin and path), by the value of
 * its `header`; returns the map and a function that stops watching.
 */
function watchSends(endpoint: string, header: string): { sentAt: Map<string, number>; stop: () => void } {
  const target = new URL(endpoint);
  const path = `${target.pathname}${target.search}`;
  const name = header.toLowerCase();
  const sentAt = new Map<string, number>();
  const listener = (message: unknown): void => {
    const t = performance.now();
    const req = (message as UndiciRequestMessage | null)?.request;
    if (req === undefined || req.origin !== target.origin || req.path !== path || !Array.isArray(req.headers)) return;
    // undici keeps headers as a flat [name, value, name, value, ...] list.
    const headers = req.headers as unknown[];
    for (let i = 0; i + 1 < headers.length; i += 2) {
      const n = headers[i];
      const v = headers[i + 1];
      if (typeof n === 'string' && n.toLowerCase() === name && typeof v === 'string') {
        if (!sentAt.has(v)) sentAt.set(v, t);
        return;
      }
    }
  };
  subscribe('undici:request:bodySent', listener);
  return { sentAt, stop: () => unsubscribe('undici:request:bodySent', listener) };
}

/** The authorization requests of an open loop: their durations, how many were out at once, connections opened. */
export interface AuthorizationWatch {
  /** Request created -> response headers received, ms. */
  p50Ms: number;
  p99Ms: number;
  maxInFlight: number;
  /** TLS connections opened to the authorizer while watching (each a mutual-TLS handshake on these cores). */
  connects: number;
}

/** One operation's authorization request: created and its response's body received (performance.now()). */
interface AuthorizationTimes {
  created: number;
  received?: number;
}

/** The `operation_id` of an authorization request body (a JSON string or its bytes), if it has one. */
function operationOf(body: unknown): string | undefined {
  const text = typeof body === 'string' ? body : Buffer.isBuffer(body) ? body.toString('utf8') : undefined;
  return text === undefined ? undefined : /"operation_id":"([0-9a-f-]{36})"/.exec(text)?.[1];
}

/**
 * Watches undici's requests to `url`'s origin and path (the authorizer): from `undici:request:create` to
 * `undici:request:headers`, the most out at once, and the connections opened to that origin
 * (`undici:client:connected`); and, by the `operation_id` of each request body, when that operation's request
 * was created and its response body received (`undici:request:trailers`), in `byOperation`.
 */
function watchAuthorizations(url: string): {
  read: () => AuthorizationWatch;
  byOperation: Map<string, AuthorizationTimes>;
  stop: () => void;
} {
  const target = new URL(url);
  const path = `${target.pathname}${target.search}`;
  const started = new WeakMap<object, number>();
  const operations = new WeakMap<object, AuthorizationTimes>();
  const byOperation = new Map<string, AuthorizationTimes>();
  const durations: number[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  let connects = 0;
  const mine = (req: UndiciRequestMessage['request']): req is object & UndiciRequestMessage['request'] =>
    req !== undefined && req !== null && req.origin === target.origin && req.path === path;
  const onCreate = (message: unknown): void => {
    const req = (message as UndiciRequestMessage | null)?.request;
    if (!mine(req)) return;
    const now = performance.now();
    started.set(req, now);
    maxInFlight = Math.max(maxInFlight, ++inFlight);
    const op = operationOf(req.body);
    if (op !== undefined) {
      const times = { created: now };
      byOperation.set(op, times);
      operations.set(req, times);
    }
  };
  const onReceived = (message: unknown): void => {
    const req = (message as UndiciRequestMessage | null)?.request;
    if (!mine(req)) return;
    const times = operations.get(req);
    if (times !== undefined) times.received = performance.now();
  };
  const onEnd = (message: unknown): void => {
    const req = (message as UndiciRequestMessage | null)?.request;
    if (!mine(req)) return;
    const t0 = started.get(req);
    if (t0 === undefined) return;
    started.delete(req);
    inFlight--;
    durations.push(performance.now() - t0);
  };
  const onConnected = (message: unknown): void => {
    const params = (message as { connectParams?: { hostname?: string; port?: string | number } } | null)?.connectParams;
    if (params !== undefined && String(params.port) === target.port && params.hostname === target.hostname) connects++;
  };
  const channels: [string, (m: unknown) => void][] = [
    ['undici:request:create', onCreate],
    ['undici:request:headers', onEnd],
    ['undici:request:trailers', onReceived],
    ['undici:request:error', onEnd],
    ['undici:client:connected', onConnected],
  ];
  for (const [name, fn] of channels) subscribe(name, fn);
  return {
    read: () => ({ ...percentiles(durations), maxInFlight, connects }),
    byOperation,
    stop: () => {
      for (const [name, fn] of channels) unsubscribe(name, fn);
    },
  };
}

export async function halfPeakCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  peakOpsPerS: number,
  seconds: number,
): Promise<HalfPeakResult> {
  const name = `al_bench_half_peak_${n}`;
  const url = await migratedDatabase(adminUrl, name);
  const env = await openDispatchBench(pki, url, n, n + 4);
  cellContext.sandboxThread = env.sandbox.tid;
  const route = env.config.tools.get('issue_refund')!;
  const targetOpsPerS = peakOpsPerS / 2;
  const toSent: number[] = [];
  const toOutcome: number[] = [];
  /** Commit -> claim, for the operations in `toSent` (same order). */
  const toClaim: number[] = [];
  /** Stage durations of the operations in `toSent` (same order). */
  const gaps: Record<string, number>[] = [];
  let notSucceeded = 0;
  let sendUnseen = 0;
  const watch = watchSends(route.endpoint, route.idempotencyHeader);
  try {
    const reserve = (tag: string, w: number, i: number) =>
      env.ledger.reserve(producerContext(tag, w, i), 'issue_refund', ARGS);
    // Warm-up: closed loops, as the end-to-end cell's, so connections and TLS sessions exist.
    await closedLoopOps(n, Math.max(20, 2 * n), COMPLETION_TIMEOUT_MS, async (w, i) => {
      const r = await reserve('warm', w, i);
      await env.probe.completions.wait(r.operation_id, COMPLETION_TIMEOUT_MS);
      return 0;
    });
    watch.sentAt.clear();

    let lastOutcome = 0;
    const one = async (i: number): Promise<void> => {
      const r = await reserve('run', i % n, i);
      const committed = performance.now();
      const done = await env.probe.completions.wait(r.operation_id, COMPLETION_TIMEOUT_MS);
      if (done.status !== 'succeeded') notSucceeded++;
      lastOutcome = Math.max(lastOutcome, done.at);
      toOutcome.push(done.at - committed);
      const sent = watch.sentAt.get(r.effect_key);
      const claimed = env.probe.claimedAt.get(r.operation_id);
      env.probe.claimedAt.delete(r.operation_id);
      if (sent === undefined || claimed === undefined) sendUnseen++;
      else {
        toSent.push(sent - committed);
        toClaim.push(claimed - committed);
        const st = env.probe.stages.get(r.operation_id) ?? {};
        env.probe.stages.delete(r.operation_id);
        const points: [string, number | undefined][] = [
          ['claim', claimed],
          ['authorize', st.evidenceSent],
          ['evidence + lock', st.lockDone],
          ['check + send', sent],
        ];
        const gap: Record<string, number> = {};
        for (let k = 1; k < points.length; k++) {
          const [name, to] = points[k]!;
          const from = points[k - 1]![1];
          if (to !== undefined && from !== undefined) gap[name] = to - from;
        }
        // The authorize stage in two: the authorization call itself (request created -> its body received),
        // then the rest until the evidence statement went out (the decision's checks, the wait for a dispatch
        // batch and for its connection).
        const a = auth.byOperation.get(r.operation_id);
        auth.byOperation.delete(r.operation_id);
        if (a?.received !== undefined) {
          gap['authorization call'] = a.received - a.created;
          if (st.evidenceSent !== undefined) gap['after the call'] = st.evidenceSent - a.received;
        }
        gaps.push(gap);
      }
    };
    const auth = watchAuthorizations(env.sandbox.authorizeUrl);
    let dbConnectionsOpened = 0;
    const onConnect = (): void => void dbConnectionsOpened++;
    env.dispatcherPool.on('connect', onConnect);
    const { start, arrivals, failed, arrivalLagP99Ms, used } = await poissonArrivals(targetOpsPerS, seconds, one);
    env.dispatcherPool.off('connect', onConnect);
    auth.stop();
    const { rows } = await env.producerPool.query<{ status: string; n: number }>(
      'SELECT status, count(*)::int AS n FROM actionledger.operations GROUP BY status ORDER BY status',
    );
    const stats = await env.sandbox.stats();
    const total = rows.reduce((s, r) => s + r.n, 0);
    const check = `arrivals ${arrivals} (${failed} failed); operations ${rows.map((r) => `${r.status}=${r.n}`).join(' ')}; provider POSTs ${stats.posts} (${stats.distinctKeys} keys)`;
    const ok =
      failed === 0 &&
      notSucceeded === 0 &&
      sendUnseen === 0 &&
      rows.length === 1 &&
      rows[0]?.status === 'succeeded' &&
      stats.posts === total &&
      stats.distinctKeys === total;
    if (!ok) process.stderr.write(`WARNING half peak N=${n}: ${check}; ${sendUnseen} sends unseen\n`);
    const sent = percentiles(toSent);
    const outcome = percentiles(toOutcome);
    const claim = percentiles(toClaim);
    const tail = toClaim.filter((_, i) => toSent[i]! >= sent.p99Ms);
    const medians = (rows: Record<string, number>[]): Record<string, number> => {
      const out: Record<string, number> = {};
      for (const name of ['authorize', 'authorization call', 'after the call', 'evidence + lock', 'check + send']) {
        const xs = rows.map((g) => g[name]).filter((x): x is number => x !== undefined);
        if (xs.length > 0) out[name] = percentiles(xs).p50Ms;
      }
      return out;
    };
    const stages = { all: medians(gaps), tail: medians(gaps.filter((_, i) => toSent[i]! >= sent.p99Ms)) };
    return {
      peakOpsPerS,
      concurrency: n,
      targetOpsPerS,
      offeredOpsPerS: arrivals / seconds,
      achievedOpsPerS: lastOutcome > start ? (arrivals - failed - notSucceeded) / ((lastOutcome - start) / 1000) : NaN,
      arrivals,
      seconds,
      p50Ms: sent.p50Ms,
      p99Ms: sent.p99Ms,
      maxMs: toSent.length === 0 ? NaN : Math.max(...toSent),
      claimP50Ms: claim.p50Ms,
      claimP99Ms: claim.p99Ms,
      tailClaimMs: tail.length === 0 ? NaN : percentiles(tail).p50Ms,
      stages,
      dbConnectionsOpened,
      outcomeP50Ms: outcome.p50Ms,
      outcomeP99Ms: outcome.p99Ms,
      arrivalLagP99Ms,
      notSucceeded: notSucceeded + failed,
      sendUnseen,
      ...used,
      authorization: auth.read(),
      check,
    };
  } finally {
    watch.stop();
    cellContext.sandboxThread = null;
    await env.close();
    await dropDatabase(adminUrl, name);
  }
}

/** The peer's open loop: enqueue is its `send`, the outcome its `complete`. */
export type PeerOpenLoopResult = OpenLoopResult;

/**
 * The same open loop against the peer one would build instead (bench/cells.ts, `openBossMtls`: pg-boss 10, one
 * worker with batch size `n` woken after each send, whose handler makes the dispatcher's two mutual-TLS calls):
 * jobs sent at the arrival times of the same seeded Poisson process at `targetOpsPerS`, latency from the send's
 * commit acknowledged to the provider request written (its Idempotency-Key is the job id) and to the job's
 * `complete` acknowledged. It says whether a system with none of actionledger's bookkeeping keeps the tail
 * target on this machine, at the same offered rate or at half its own peak.
 */
export async function peerOpenLoopCell(
  adminUrl: string,
  pki: BenchPki,
  n: number,
  targetOpsPerS: number,
  seconds: number,
): Promise<PeerOpenLoopResult> {
  // Its environment sets cellContext.sandboxThread and clears it when closed.
  const peer = await openBossMtls(adminUrl, pki, n);
  const watch = watchSends(peer.route.endpoint, peer.route.idempotencyHeader);
  const toSent: number[] = [];
  const toOutcome: number[] = [];
  let sendUnseen = 0;
  try {
    await closedLoopOps(n, Math.max(20, 2 * n), COMPLETION_TIMEOUT_MS, async (w, i) => {
      const { id } = await peer.send(producerContext('warm', w, i));
      await peer.completions.wait(id, COMPLETION_TIMEOUT_MS);
      return 0;
    });
    peer.notSucceeded = 0;
    watch.sentAt.clear();
    let lastOutcome = 0;
    const one = async (i: number): Promise<void> => {
      const { id, committed } = await peer.send(producerContext('run', i % n, i));
      const done = await peer.completions.wait(id, COMPLETION_TIMEOUT_MS);
      lastOutcome = Math.max(lastOutcome, done.at);
      toOutcome.push(done.at - committed);
      const sent = watch.sentAt.get(id);
      if (sent === undefined) sendUnseen++;
      else toSent.push(sent - committed);
    };
    const auth = watchAuthorizations(peer.authorizeUrl);
    const { start, arrivals, failed, arrivalLagP99Ms, used } = await poissonArrivals(targetOpsPerS, seconds, one);
    auth.stop();
    const { ok, check } = await peer.verify();
    const notSucceeded = peer.notSucceeded + failed;
    if (!ok || failed > 0 || sendUnseen > 0)
      process.stderr.write(
        `WARNING peer open loop N=${n}: ${check}; ${failed} arrivals failed, ${sendUnseen} sends unseen\n`,
      );
    const sent = percentiles(toSent);
    const outcome = percentiles(toOutcome);
    return {
      concurrency: n,
      targetOpsPerS,
      offeredOpsPerS: arrivals / seconds,
      achievedOpsPerS: lastOutcome > start ? (arrivals - notSucceeded) / ((lastOutcome - start) / 1000) : NaN,
      arrivals,
      seconds,
      p50Ms: sent.p50Ms,
      p99Ms: sent.p99Ms,
      outcomeP50Ms: outcome.p50Ms,
      outcomeP99Ms: outcome.p99Ms,
      arrivalLagP99Ms,
      notSucceeded,
      sendUnseen,
      ...used,
      authorization: auth.read(),
      check: `arrivals ${arrivals} (${failed} failed); ${check}`,
    };
  } finally {
    watch.stop();
    await peer.close();
  }
}
