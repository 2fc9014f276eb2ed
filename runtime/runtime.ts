/**
 * Opens what every process needs: the compiled configuration, the database (the configured URL, or the
 * embedded cluster), the effect-key secrets, a pool, the schema migrated, a logger and metrics.
 */
import { Counter } from 'prom-client';
import { loadConfig, type Config } from '../config/index.js';
import { createPool, databaseUnavailable, PG_ADAPTER, type Pool } from '../db/index.js';
import type { EmbeddedDatabase, OpenEmbeddedOptions } from '../embedded/index.js';
import { resolveEffectKeySecrets, type EffectKeySecrets } from '../config/index.js';
import { createLogger, type Logger } from '../core/log.js';
import { Metrics } from '../core/metrics.js';
import { flushTracing, startTracing } from '../core/tracing.js';
import { checkMigrated, migrate, type MigrateResult } from '../db/index.js';

const NO_KEYS: EffectKeySecrets = Object.freeze({ active: '', secrets: new Map() });

export interface Runtime {
  readonly config: Config;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly pool: Pool;
  readonly databaseUrl: string;
  readonly embedded: EmbeddedDatabase | null;
  readonly effectKeys: EffectKeySecrets;
  close(): Promise<void>;
}

export interface OpenOptions {
  env?: NodeJS.ProcessEnv;
  config?: Config;
  name: string;
  /**
   * `true`: apply pending migrations before returning (the service, `migrate` and the commands that write).
   * `'check'`: read-only commands; write nothing, but refuse (`schema_not_migrated`) a schema behind `sql/`.
   */
  migrate?: boolean | 'check';
  logDestination?: Parameters<typeof createLogger>[0]['destination'];
  defaultMetrics?: boolean;
  /** False for dispatcher workers: no ledger-wide metrics (see Metrics). */
  ledgerMetrics?: boolean;
  /** False for processes that never mint effect keys (dispatcher workers): no secrets are read. */
  effectKeys?: boolean;
  /** A database URL handed down by the fleet's parent, overriding the configuration's. */
  databaseUrl?: string;
  /** Pool size instead of `database.pool_max` (a dispatcher worker needs one connection per operation in flight). */
  poolMax?: number;
  /** Idle connections the pool keeps open (`createPool`'s `min`; a dispatcher worker's `dispatcherPoolFloor`). */
  poolMin?: number;
  /** The service: owns the embedded cluster (adopts one running on its folder) and restarts it when it dies. */
  embedded?: Pick<OpenEmbeddedOptions, 'own' | 'supervise'>;
}

// eslint-disable-next-line max-lines-per-function -- the open steps in order (embedded cluster, pool, migrations, keys), each undone when a later one fails
export async function openRuntime(options: OpenOptions): Promise<Runtime> {
  const env = options.env ?? process.env;
  const config = options.config ?? loadConfig(env);
  // Off (no OTLP endpoint in the environment) this loads nothing; on, before the logger, whose lines then carry
  // the active span's ids.
  await startTracing(env, options.name);
  const log = createLogger({
    level: config.logLevel,
    name: options.name,
    destination: options.logDestination,
    cluster: config.cluster,
  });
  if (PG_ADAPTER.mode === 'plain')
    log.warn(
      { installed: PG_ADAPTER.installed, pinned: PG_ADAPTER.pinned },
      'node-postgres is not the version its adapter was written against: statements run without its shortcuts (db/pg-adapter.ts)',
    );
  let url = options.databaseUrl ?? config.databaseUrl;
  const isEmbedded = url === null;
  const wantKeys = options.effectKeys !== false;
  // Secrets before the database: a misconfigured production start must fail before it touches anything.
  const effectKeys = !wantKeys
    ? NO_KEYS
    : isEmbedded
      ? null
      : resolveEffectKeySecrets(config, env, { embedded: false });
  let embedded: EmbeddedDatabase | null = null;
  if (url === null) {
    const { openEmbeddedDatabase } = await import('../embedded/index.js');
    embedded = await openEmbeddedDatabase({
      dataDir: config.dataDir,
      port: config.database.embeddedPort,
      onLog: (line) => log.debug({ postgres: line }, 'embedded postgres'),
      restartBackoff: {
        initialMs: config.database.embeddedRestartInitialMs,
        maxMs: config.database.embeddedRestartMaxMs,
      },
      ...options.embedded,
    });
    url = embedded.url;
    log.info(
      {
        data_dir: embedded.dataDir,
        started_here: embedded.startedHere,
        owned: embedded.owned,
        port: config.database.embeddedPort,
        ...(embedded.watchdogPid === undefined ? {} : { watchdog_pid: embedded.watchdogPid }),
      },
      embedded.startedHere
        ? 'started embedded PostgreSQL'
        : embedded.owned
          ? 'adopted running embedded PostgreSQL (stopped on shutdown)'
          : 'connected to running embedded PostgreSQL',
    );
  }
  let keys: EffectKeySecrets;
  try {
    keys =
      effectKeys ??
      resolveEffectKeySecrets(config, env, {
        embedded: true,
        onGenerated: (path, keyId) =>
          log.warn({ path, key_id: keyId }, 'generated a development effect-key secret (embedded default only)'),
      });
  } catch (err) {
    // Start is all or nothing: a cluster started for this runtime does not outlive its failure.
    await embedded?.stop();
    throw err;
  }
  const pool = createPool(url, {
    max: options.poolMax ?? config.database.poolMax,
    ...(options.poolMin === undefined ? {} : { min: options.poolMin }),
    statementTimeoutMs: config.database.statementTimeoutMs,
    applicationName: `actionledger:${options.name}`,
    notifications: config.notifications.destinations.size > 0,
  });
  const close = async (): Promise<void> => {
    await flushTracing();
    await pool.end().catch(() => undefined);
    await embedded?.stop();
  };
  try {
    if (options.migrate === true || options.migrate === 'check') {
      const client = await pool.connect().catch((err: unknown) => {
        throw databaseUnavailable(err, 'migrate');
      });
      let result: MigrateResult | null = null;
      try {
        if (options.migrate === true) result = await migrate(client, config.schema, config.schemaQuoted);
        else await checkMigrated(client, config.schemaQuoted);
      } finally {
        client.release();
      }
      if (result !== null && result.applied.length > 0)
        log.info({ applied: result.applied, schema: config.schema }, 'applied migrations');
    }
  } catch (err) {
    await close();
    throw err;
  }
  const metrics = new Metrics({
    defaultMetrics: options.defaultMetrics,
    ledger: options.ledgerMetrics,
    cluster: config.cluster,
  });
  // A fleet worker's series carry its slot (set by the service), so the parent's aggregate keeps them apart.
  const slot = env.ACTIONLEDGER_WORKER_SLOT;
  if (slot !== undefined && /^[1-9][0-9]{0,3}$/.test(slot)) metrics.registry.setDefaultLabels({ worker: slot });
  if (embedded !== null && options.embedded?.supervise !== undefined) {
    const supervised = embedded;
    // Read from the supervisor at scrape time: it counts the postmasters it brought back, this only shows them.
    new Counter({
      name: 'actionledger_embedded_postgres_restarts_total',
      help: 'Times the service brought its embedded PostgreSQL back up after it died.',
      registers: [metrics.registry],
      collect() {
        this.reset();
        this.inc(supervised.restarts);
      },
    });
  }
  return {
    config,
    log,
    metrics,
    pool,
    databaseUrl: url,
    embedded,
    effectKeys: keys,
    close,
  };
}
