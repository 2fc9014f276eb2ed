/**
 * A dispatch environment whose dispatchers can each run under their own configuration: reserve under one tool
 * registry, then dispatch under another (a changed route, a missing credential, another client certificate or
 * authorization URL). Real parts throughout: the run's PostgreSQL (a cloned database), the sandbox provider and
 * authorizer over mTLS with the test file's PKI (test/helpers/sandbox.ts), signed dispatch profiles and client
 * certificate files written by the sandbox's DispatchFiles (sandbox/kit.ts), and dispatchers built by
 * `openDispatcher` exactly as a worker process builds them.
 *
 * Run one dispatcher at a time (`open`, wait, `stop`): every dispatcher claims whatever is pending.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { compileConfig, type Config } from '../../config/index.js';
import { createPool, type Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import type { Runtime } from '../../runtime/runtime.js';
import { openDispatcher, type Dispatcher } from '../../dispatcher/index.js';
import { Ledger } from '../../ledger/index.js';
import { DispatchFiles, sandboxRoute, type SandboxRoute } from '../../sandbox/kit.js';
import type { PemPair } from '../../sandbox/pki.js';
import type { SandboxAuthorizer } from '../../sandbox/authorizer.js';
import type { SandboxProvider } from '../../sandbox/provider.js';
import { createTestDatabase, TEST_SECRET, testKeyer } from './db.js';
import { startAuthorizer, startProvider, testPki, type TestPki } from './sandbox.js';

export const PREDISPATCH_TOKEN = 'predispatch-provider-token';

/** How often a never-sent operation is released to the queue before review, in these dispatchers. */
export const PREDISPATCH_RELEASE_LIMIT = 2;

/** One tool's route as written in the configuration file. */
export type RawRoute = SandboxRoute;
export type RawTools = Record<string, RawRoute>;

export interface OpenOptions {
  tools: RawTools;
  /** The dispatcher process's environment; default {@link PredispatchEnv.env}. */
  env?: NodeJS.ProcessEnv;
  /** Authorization URL written into a freshly signed profile; default the environment's authorizer. */
  authorizationUrl?: string;
  /** The dispatcher's client certificate; default the PKI's `client`. */
  client?: PemPair;
}

export interface OpenedDispatcher {
  dispatcher: Dispatcher;
  /** The dispatcher's own registry (fresh per dispatcher), as a worker would expose it. */
  metrics: Metrics;
  /** Value of one labelled series of a counter on that registry; 0 when the series does not exist. */
  counter(name: string, labels: Record<string, string>): Promise<number>;
  /** The sum of every series of a counter on that registry. */
  counterTotal(name: string): Promise<number>;
  stop(): Promise<void>;
}

export interface PredispatchEnv {
  dir: string;
  url: string;
  pki: TestPki;
  pool: Pool;
  provider: SandboxProvider;
  authorizer: SandboxAuthorizer;
  /** DATABASE_URL, the effect-key secret and the provider credential (TEST_BILLING_TOKEN). */
  env: NodeJS.ProcessEnv;
  /** The base route of `issue_refund` to the environment's provider, with `over` applied. */
  route(over?: Partial<RawRoute>): RawRoute;
  compile(tools: RawTools, env?: NodeJS.ProcessEnv): Config;
  /** A ledger reserving under `tools` (stopped at teardown). */
  ledger(tools: RawTools): Ledger;
  /** Opens and starts a dispatcher under `options`; stopped at teardown unless stopped before. */
  open(options: OpenOptions): Promise<OpenedDispatcher>;
  /** Runs `sql` with the operations table's immutability trigger disabled (corrupting a row on purpose). */
  corrupt(sql: string, params: unknown[]): Promise<number>;
}

export async function predispatchEnv(t: Test): Promise<PredispatchEnv> {
  const dir = mkdtempSync(join(tmpdir(), 'al-predispatch-'));
  const pki = await testPki();
  const provider = await startProvider(t, { token: PREDISPATCH_TOKEN });
  const authorizer = await startAuthorizer(t);
  const files = new DispatchFiles(dir, pki.ca.cert);
  let profiles = 0;
  const writeProfile = (authorizationUrl: string) =>
    files.profile({
      profile_id: `predispatch-${++profiles}`,
      authorization_url: authorizationUrl,
      provider_http_timeout_seconds: 2,
    });
  const writeClient = (client: PemPair) => files.client(client);
  const defaultProfile = writeProfile(authorizer.authorizeUrl);
  const defaultTls = writeClient(pki.client);

  const url = await createTestDatabase(t);
  const pool = createPool(url, { max: 20, statementTimeoutMs: 30_000, applicationName: 'test-predispatch' });
  const env: NodeJS.ProcessEnv = {
    DATABASE_URL: url,
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
    TEST_BILLING_TOKEN: PREDISPATCH_TOKEN,
  };
  const ledgers: Ledger[] = [];
  const running = new Set<Dispatcher>();
  t.teardown(async () => {
    for (const d of running) await d.stop(5000);
    for (const l of ledgers) l.stop();
    await pool.end();
  });

  const rawConfig = (tools: RawTools, profile = defaultProfile, tls = defaultTls) => ({
    // A never-sent attempt is released twice, quickly, before review: the refusal tests see both.
    dispatcher: {
      poll_interval_ms: 100,
      heartbeat_interval_ms: 500,
      release_limit: PREDISPATCH_RELEASE_LIMIT,
      release_backoff_initial_ms: 20,
      release_backoff_max_ms: 40,
      profile,
      tls,
    },
    tools,
  });
  const compile = (tools: RawTools, e: NodeJS.ProcessEnv = env): Config => compileConfig(rawConfig(tools), e);

  return {
    dir,
    url,
    pki,
    pool,
    provider,
    authorizer,
    env,
    route: (over = {}) =>
      sandboxRoute({
        provider_id: 'billing-test',
        endpoint: provider.endpoint,
        credential_env: 'TEST_BILLING_TOKEN',
        ...over,
      }),
    compile,
    ledger(tools) {
      const l = new Ledger(compile(tools), pool, testKeyer());
      ledgers.push(l);
      return l;
    },
    async open(options) {
      const denv = options.env ?? env;
      const profile = options.authorizationUrl === undefined ? defaultProfile : writeProfile(options.authorizationUrl);
      const tls = options.client === undefined ? defaultTls : writeClient(options.client);
      const config = compileConfig(rawConfig(options.tools, profile, tls), denv);
      const metrics = new Metrics({ defaultMetrics: false, ledger: false });
      const runtime: Runtime = {
        config,
        log: createLogger({ level: 'silent', name: 'test' }),
        metrics,
        pool,
        databaseUrl: url,
        embedded: null,
        effectKeys: { active: 'k1', secrets: new Map() },
        close: () => Promise.resolve(),
      };
      const dispatcher = await openDispatcher(runtime, denv, { concurrency: 2 });
      running.add(dispatcher);
      await dispatcher.start();
      const series = async (name: string) => {
        const metric = metrics.registry.getSingleMetric(name);
        return metric === undefined ? [] : (await metric.get()).values;
      };
      return {
        dispatcher,
        metrics,
        async counter(name, labels) {
          const hit = (await series(name)).find((v) =>
            Object.entries(labels).every(([k, value]) => v.labels[k] === value),
          );
          return hit?.value ?? 0;
        },
        async counterTotal(name) {
          return (await series(name)).reduce((sum, v) => sum + v.value, 0);
        },
        async stop() {
          running.delete(dispatcher);
          await dispatcher.stop(5000);
        },
      };
    },
    async corrupt(sql, params) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await client.query('ALTER TABLE actionledger.operations DISABLE TRIGGER operations_immutable');
        const res = await client.query(sql, params);
        await client.query('ALTER TABLE actionledger.operations ENABLE TRIGGER operations_immutable');
        await client.query('COMMIT');
        return res.rowCount ?? 0;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw err;
      } finally {
        client.release();
      }
    },
  };
}
