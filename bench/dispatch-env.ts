/**
 * The benchmarks' dispatch environment, built with the sandbox's builder (sandbox/kit.ts) as the tests' is: a
 * PKI generated for the run, the sandbox provider and authorizer over mutual TLS on loopback (here in a worker
 * thread, see dispatch-sandbox.ts), a signed dispatch profile, a config routing `issue_refund` to the sandbox,
 * and a real Dispatcher opened with openDispatcher on a runtime.
 *
 * Measurement without touching the dispatcher: {@link DispatchProbe} wraps `query` on the dispatcher pool's
 * clients and recognises the dispatcher's own statements (dispatcher/queries.ts, bound to the same schema),
 * so it sees when the final check took the row lock, when the outcome UPDATE was sent (the provider answer is in
 * hand) and when the outcome COMMIT was acknowledged; claims, which run on a connection outside the pool
 * (dispatcher/claim-session.ts), it hears on the `actionledger:claim` diagnostics channel.
 */
import * as diagnosticsChannel from 'node:diagnostics_channel';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import type pg from 'pg';
import { compileConfig, type Config } from '../config/index.js';
import { bindQueries, createPool, type Pool } from '../db/db.js';
import { createLogger } from '../core/log.js';
import { Metrics } from '../core/metrics.js';
import type { Runtime } from '../runtime/runtime.js';
import { Secret } from '../core/secret.js';
import { dispatcherPoolFloor, openDispatcher, type Dispatcher } from '../dispatcher/index.js';
import type { ClaimEvent } from '../dispatcher/producer.js';
import { dispatcherQueries } from '../dispatcher/queries.js';
import { EffectKeyer, Ledger } from '../ledger/index.js';
import type { ServerTls } from '../sandbox/index.js';
import { createDispatchPki, DispatchFiles, sandboxRoute, type DispatchPki, type SandboxRoute } from '../sandbox/kit.js';
import type { SandboxThreadData, SandboxThreadMessage } from './dispatch-sandbox.js';

/** The bearer token the benchmark's sandbox provider requires. */
export const PROVIDER_TOKEN = 'bench-provider-token';
/** The environment variable the benchmark's routes name for the provider credential. */
export const CREDENTIAL_ENV = 'BENCH_BILLING_TOKEN';

export type BenchPki = DispatchPki;

export function createBenchPki(): Promise<BenchPki> {
  return createDispatchPki('bench-ca');
}

/** The sandbox servers in a worker thread. */
export class SandboxThread {
  readonly #worker: Worker;
  readonly endpoint: string;
  readonly authorizeUrl: string;
  /** The worker thread's kernel thread id, when procfs tells it. */
  readonly tid: number | null;

  private constructor(worker: Worker, endpoint: string, authorizeUrl: string, tid: number | null) {
    this.#worker = worker;
    this.endpoint = endpoint;
    this.authorizeUrl = authorizeUrl;
    this.tid = tid;
  }

  /** `hang`: the provider applies every request and never answers (until the thread stops). */
  static async start(tls: ServerTls, options: { hang?: boolean } = {}): Promise<SandboxThread> {
    const worker = new Worker(new URL('./dispatch-sandbox.js', import.meta.url), {
      workerData: { tls, token: PROVIDER_TOKEN, hang: options.hang === true } satisfies SandboxThreadData,
    });
    const ready = await next(worker, 'ready');
    if (ready.type !== 'ready') throw new Error('sandbox thread did not start');
    return new SandboxThread(worker, ready.endpoint, ready.authorizeUrl, ready.tid);
  }

  async stats(): Promise<Extract<SandboxThreadMessage, { type: 'stats' }>> {
    const reply = next(this.#worker, 'stats');
    this.#worker.postMessage({ type: 'stats' });
    const m = await reply;
    if (m.type !== 'stats') throw new Error('unexpected reply');
    return m;
  }

  async stop(): Promise<void> {
    const reply = next(this.#worker, 'stopped');
    this.#worker.postMessage({ type: 'stop' });
    await reply;
    await this.#worker.terminate();
  }
}

function next(worker: Worker, type: SandboxThreadMessage['type']): Promise<SandboxThreadMessage> {
  return new Promise((resolve, reject) => {
    const onMessage = (m: SandboxThreadMessage): void => {
      if (m.type === 'error') {
        cleanup();
        reject(new Error(`sandbox thread: ${m.message}`));
      } else if (m.type === type) {
        cleanup();
        resolve(m);
      }
    };
    const onError = (err: Error): void => {
      cleanup();
      reject(err);
    };
    const cleanup = (): void => {
      worker.off('message', onMessage);
      worker.off('error', onError);
    };
    worker.on('message', onMessage);
    worker.on('error', onError);
  });
}

export interface Done {
  status: string;
  /** performance.now() when the completion commit was acknowledged. */
  at: number;
}

/** Completion signals by id, awaited by the producers; a completion may arrive before anyone waits. */
export class Completions {
  readonly #waiting = new Map<string, { resolve: (d: Done) => void; timer: NodeJS.Timeout }>();
  readonly #early = new Map<string, Done>();

  done(id: string, status: string, at: number): void {
    const w = this.#waiting.get(id);
    if (w === undefined) {
      this.#early.set(id, { status, at });
      return;
    }
    this.#waiting.delete(id);
    clearTimeout(w.timer);
    w.resolve({ status, at });
  }

  wait(id: string, timeoutMs: number): Promise<Done> {
    const early = this.#early.get(id);
    if (early !== undefined) {
      this.#early.delete(id);
      return Promise.resolve(early);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting.delete(id);
        reject(new Error(`${id} not completed within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiting.set(id, { resolve, timer });
    });
  }
}

type QueryFn = (...args: unknown[]) => unknown;
type After = (result: pg.QueryResult) => void;

/**
 * Wraps `query` on every client the pool creates; `observe` may return a callback run on success. `thenCommit`:
 * the statement travels with its COMMIT (db/db.ts `queryThenCommit`), and its success is the commit's.
 */
export function instrumentPool(
  pool: Pool,
  observe: (
    client: pg.PoolClient,
    text: string,
    values: unknown[] | undefined,
    thenCommit: boolean,
  ) => After | undefined,
): void {
  pool.on('connect', (client: pg.PoolClient) => {
    const target = client as unknown as { query: QueryFn };
    const original = target.query.bind(client);
    target.query = (...args: unknown[]) => {
      const first = args[0];
      const text = typeof first === 'string' ? first : (first as { text?: unknown } | null)?.text;
      const inline = (first as { values?: unknown } | null)?.values;
      const values = Array.isArray(args[1])
        ? (args[1] as unknown[])
        : Array.isArray(inline)
          ? (inline as unknown[])
          : undefined;
      const query = first as { thenCommit?: unknown; submit?: unknown; callback?: unknown } | null;
      const after = typeof text === 'string' ? observe(client, text, values, query?.thenCommit === true) : undefined;
      if (after === undefined) return original(...args);
      if (query !== null && typeof query.submit === 'function') {
        // A query object: it answers through its own callback (an array of results for several statements).
        const cb = query.callback as (err: Error | null | undefined, res: pg.QueryResult | pg.QueryResult[]) => void;
        query.callback = (err: Error | null | undefined, res: pg.QueryResult | pg.QueryResult[]) => {
          if (err === null || err === undefined) after(Array.isArray(res) ? res[0]! : res);
          cb(err, res);
        };
        return original(...args);
      }
      const last = args[args.length - 1];
      if (typeof last === 'function') {
        const cb = last as (err: Error | null, res: pg.QueryResult) => void;
        args[args.length - 1] = (err: Error | null, res: pg.QueryResult) => {
          if (err === null || err === undefined) after(res);
          cb(err, res);
        };
        return original(...args);
      }
      return (original(...args) as Promise<pg.QueryResult>).then((res) => {
        after(res);
        return res;
      });
    };
  });
}

/** Samples a pool's checked-out and waiting clients. */
export class PoolSampler {
  readonly #pool: Pool;
  #timer: NodeJS.Timeout | undefined;
  #samples = 0;
  #inUse = 0;
  #maxInUse = 0;
  #waiting = 0;

  constructor(pool: Pool) {
    this.#pool = pool;
  }

  start(intervalMs = 5): void {
    this.#timer = setInterval(() => {
      const inUse = this.#pool.totalCount - this.#pool.idleCount;
      this.#samples++;
      this.#inUse += inUse;
      this.#waiting += this.#pool.waitingCount;
      this.#maxInUse = Math.max(this.#maxInUse, inUse);
    }, intervalMs);
  }

  stop(): { avgInUse: number; maxInUse: number; avgWaiting: number } {
    clearInterval(this.#timer);
    const n = Math.max(1, this.#samples);
    return { avgInUse: this.#inUse / n, maxInUse: this.#maxInUse, avgWaiting: this.#waiting / n };
  }
}

type Stage = 'evidenceSent' | 'lockDone';

interface ClientState {
  inTxn: boolean;
  lockedAt: number | undefined;
  pending: { op: string; status: string }[] | undefined;
}

/** What the dispatcher did, seen from its pool (see the file comment). */
export class DispatchProbe {
  readonly completions = new Completions();
  /** performance.now() when the claim that took the operation returned. */
  readonly claimedAt = new Map<string, number>();
  /**
   * performance.now() of an operation's stages after its claim, the last try of each: its evidence statement sent
   * (its authorization in hand; the first statement of its dispatch batch's opening), and that batch's row-lock
   * statement answered.
   */
  readonly stages = new Map<string, Partial<Record<Stage, number>>>();
  /** Final-check lock acquired -> outcome UPDATE sent: the provider call and its classification. */
  providerMs: number[] = [];
  /** Final-check lock acquired -> outcome COMMIT acknowledged: how long the row lock (and a connection) is held. */
  lockHeldMs: number[] = [];
  outcomes = new Map<string, number>();
  /** Statements the dispatcher sent (BEGIN and COMMIT included). */
  statements = 0;
  readonly #state = new WeakMap<pg.PoolClient, ClientState>();

  constructor(pool: Pool, config: Config) {
    const q = bindQueries(dispatcherQueries, config.schemaQuoted);
    pool.on('acquire', (client: pg.PoolClient) =>
      this.#state.set(client, { inTxn: false, lockedAt: undefined, pending: undefined }),
    );
    instrumentPool(pool, (client, text, values, thenCommit) => {
      let st = this.#state.get(client);
      if (st === undefined) {
        st = { inTxn: false, lockedAt: undefined, pending: undefined };
        this.#state.set(client, st);
      }
      const s = st;
      this.statements++;
      if (text === 'BEGIN') {
        s.inTxn = true;
        return undefined;
      }
      if (text === q.evidenceRecordBatch) {
        const ops = (values?.[0] as string[] | undefined) ?? [];
        this.#stage(ops, 'evidenceSent');
        return undefined;
      }
      if (text === q.operationLockForDispatchBatch) {
        const ops = (values?.[0] as string[] | undefined) ?? [];
        return (res) => {
          if (res.rows.length > 0) s.lockedAt = performance.now();
          this.#stage(ops, 'lockDone');
        };
      }
      if (text === q.operationComplete || text === q.operationCompleteBatch) {
        if (s.lockedAt !== undefined) this.providerMs.push(performance.now() - s.lockedAt);
        const batch = text === q.operationCompleteBatch;
        const done = batch
          ? (values?.[0] as string[]).map((op, i) => ({ op, status: String((values?.[2] as string[])[i]) }))
          : [{ op: String(values?.[0]), status: String(values?.[2]) }];
        if (s.inTxn && thenCommit) {
          // Its COMMIT travels with it: on success the outcomes are committed.
          this.statements++;
          const { lockedAt } = s;
          s.inTxn = false;
          s.pending = undefined;
          s.lockedAt = undefined;
          return () => {
            const t = performance.now();
            if (lockedAt !== undefined) this.lockHeldMs.push(t - lockedAt);
            for (const d of done) this.#finish(d.op, d.status, t);
          };
        }
        if (s.inTxn) {
          s.pending = done;
          return undefined;
        }
        return (res) => {
          const t = performance.now();
          const changed = batch
            ? new Set((res.rows as { operation_id: string }[]).map((r) => r.operation_id))
            : undefined;
          for (const d of done)
            if (changed?.has(d.op) ?? (res.rows[0] as { n?: number } | undefined)?.n === 1)
              this.#finish(d.op, d.status, t);
        };
      }
      if (text === 'COMMIT') {
        const { pending, lockedAt } = s;
        s.inTxn = false;
        s.pending = undefined;
        s.lockedAt = undefined;
        if (pending === undefined && lockedAt === undefined) return undefined;
        return () => {
          const t = performance.now();
          if (lockedAt !== undefined) this.lockHeldMs.push(t - lockedAt);
          for (const d of pending ?? []) this.#finish(d.op, d.status, t);
        };
      }
      if (text === 'ROLLBACK') {
        s.inTxn = false;
        s.pending = undefined;
        s.lockedAt = undefined;
      }
      return undefined;
    });
  }

  /** Records the claims of worker `workerId` (statements and claimed-at times) until the returned function is called. */
  observeClaims(workerId: string): () => void {
    const onClaim = (message: unknown): void => {
      const event = message as ClaimEvent;
      if (event.workerId !== workerId) return;
      this.statements++;
      const t = performance.now();
      for (const row of event.rows) this.claimedAt.set(row.operation_id, t);
    };
    diagnosticsChannel.subscribe('actionledger:claim', onClaim);
    return () => diagnosticsChannel.unsubscribe('actionledger:claim', onClaim);
  }

  resetStats(): void {
    this.providerMs = [];
    this.lockHeldMs = [];
    this.outcomes = new Map();
    this.statements = 0;
  }

  #stage(ops: readonly string[], stage: Stage): void {
    const t = performance.now();
    for (const op of ops) {
      let at = this.stages.get(op);
      if (at === undefined) this.stages.set(op, (at = {}));
      at[stage] = t;
    }
  }

  #finish(op: string, status: string, at: number): void {
    this.outcomes.set(status, (this.outcomes.get(status) ?? 0) + 1);
    this.completions.done(op, status, at);
  }
}

export interface DispatchBench {
  config: Config;
  /** The runtime and environment the dispatcher was opened with (for a second, dispatcher-free client). */
  runtime: Runtime;
  env: NodeJS.ProcessEnv;
  ledger: Ledger;
  producerPool: Pool;
  dispatcherPool: Pool;
  dispatcher: Dispatcher;
  probe: DispatchProbe;
  sandbox: SandboxThread;
  close(): Promise<void>;
}

/**
 * One environment on the migrated database `url`: producers reserve through their own pool (as a separate
 * service would); the dispatcher runs `concurrency` operations in flight on a pool of `dispatcherPoolMax`.
 */
/** Temporary folders (they hold the run's client key) still to remove, also when the run is interrupted. */
const tempDirs = new Set<string>();
process.once('exit', () => {
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});

export async function openDispatchBench(
  pki: BenchPki,
  url: string,
  concurrency: number,
  dispatcherPoolMax: number,
  startDispatcher = true,
  extra: {
    /** More tools in the configuration (routes to other servers). */
    tools?: Record<string, SandboxRoute>;
    /** Profile fields to replace (timeouts). */
    profile?: Record<string, unknown>;
  } = {},
): Promise<DispatchBench> {
  const dir = mkdtempSync(join(tmpdir(), 'al-bench-dispatch-'));
  tempDirs.add(dir);
  const sandbox = await SandboxThread.start(pki.server);
  const files = new DispatchFiles(dir, pki.ca.cert);
  const raw = {
    dispatcher: {
      concurrency,
      profile: files.profile({
        profile_id: 'bench',
        authorization_url: sandbox.authorizeUrl,
        authorization_http_timeout_seconds: 5,
        provider_http_timeout_seconds: 5,
        ...extra.profile,
      }),
      tls: files.client(pki.client),
    },
    tools: {
      issue_refund: sandboxRoute({
        provider_id: 'billing-bench',
        endpoint: sandbox.endpoint,
        credential_env: CREDENTIAL_ENV,
      }),
      ...extra.tools,
    },
  };
  const env: NodeJS.ProcessEnv = { DATABASE_URL: url, [CREDENTIAL_ENV]: PROVIDER_TOKEN, LOG_LEVEL: 'warn' };
  const config = compileConfig(raw, env);
  const producerPool = createPool(url, {
    max: concurrency + 2,
    statementTimeoutMs: 60_000,
    applicationName: 'bench-producer',
  });
  // Sized and kept as a worker of `actionledger start` keeps its pool (bin/dispatcher-worker.ts).
  const dispatcherPool = createPool(url, {
    max: dispatcherPoolMax,
    min: dispatcherPoolFloor(concurrency),
    statementTimeoutMs: 60_000,
    applicationName: 'bench-dispatcher',
  });
  const probe = new DispatchProbe(dispatcherPool, config);
  const ledger = new Ledger(
    config,
    producerPool,
    new EffectKeyer({ active: 'k1', secrets: new Map([['k1', new Secret(Buffer.alloc(32, 7))]]) }),
  );
  const runtime: Runtime = {
    config,
    log: createLogger({ level: 'warn', name: 'bench-dispatcher' }),
    metrics: new Metrics({ defaultMetrics: false, ledger: false }),
    pool: dispatcherPool,
    databaseUrl: url,
    embedded: null,
    effectKeys: { active: 'k1', secrets: new Map() },
    close: () => Promise.resolve(),
  };
  const dispatcher = await openDispatcher(runtime, env, { concurrency });
  const unobserve = probe.observeClaims(dispatcher.workerId);
  if (startDispatcher) await dispatcher.start();
  return {
    config,
    runtime,
    env,
    ledger,
    producerPool,
    dispatcherPool,
    dispatcher,
    probe,
    sandbox,
    async close() {
      await dispatcher.stop(10_000);
      unobserve();
      ledger.stop();
      await sandbox.stop();
      await producerPool.end();
      await dispatcherPool.end();
      rmSync(dir, { recursive: true, force: true });
      tempDirs.delete(dir);
    },
  };
}
