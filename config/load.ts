/**
 * Configuration: one JSON file, validated by one ajv schema with every problem listed at once, then compiled
 * into a deep-frozen object (its types in types.ts) in steps: provider routes and their compensation mappings
 * (routes.ts), the gate's tools (gate.ts), cross-field checks, the environment, and the paths. Components receive the
 * compiled object and never read `process.env` themselves.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import type { ValidateFunction } from 'ajv';
import { escapeIdentifier } from 'pg';
import { ActionLedgerError } from '../core/errors.js';
import { parseStrictJson } from '../core/json.js';
import type { RawConfig } from './schema.js';
import { validate as generatedValidate } from './validator.generated.js';
import { compileApi, compileHttp } from './api.js';
import { consoleOidcProblems } from './console-oidc.js';
import { compileRoutes } from './routes.js';
import { sandboxRouting } from './sandbox-urls.js';
import { compileGate } from './gate.js';
import { compileNotifications } from './notify.js';
import { compileReviewPolicies } from './review-policies.js';
import { ConfigProblems, isObject, nearest } from '../core/config-problems.js';
import { reportSchemaErrors } from './schema-errors.js';
import type { Config, DispatcherConfig } from './types.js';

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

// The schema compiled ahead of time (validator-source.ts says with which options, and why).
const validate = generatedValidate as ValidateFunction<RawConfig>;

/** Validates a schema name and returns it quoted; throws `schema_name_invalid`. */
export function quoteSchemaName(name: string): string {
  if (!SCHEMA_NAME.test(name) || name.startsWith('pg_')) {
    throw new ActionLedgerError(
      'schema_name_invalid',
      `schema name ${JSON.stringify(name)} must match ${SCHEMA_NAME.source} and not start with pg_`,
    );
  }
  return escapeIdentifier(name);
}

/**
 * Reads the configuration file named by `ACTIONLEDGER_CONFIG` (or `./actionledger.config.json`) and compiles
 * it. Throws `config_invalid` listing every problem found.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): Config {
  const path = resolve(cwd, env.ACTIONLEDGER_CONFIG ?? 'actionledger.config.json');
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    const why = (cause as NodeJS.ErrnoException)?.code ?? (cause as Error)?.message;
    throw new ActionLedgerError('config_invalid', `cannot read configuration file ${path}`, {
      cause,
      details: {
        file: path,
        problems: [`cannot read ${path}`],
        issues: [{ path: '', message: `cannot read ${path} (${why})` }],
      },
    });
  }
  let raw: unknown;
  try {
    raw = parseStrictJson(text, { requireObject: true });
  } catch (cause) {
    const message = `is not strict JSON: ${(cause as Error).message}`;
    throw new ActionLedgerError('config_invalid', `configuration file ${path} ${message}`, {
      cause,
      details: { file: path, problems: [`(root) ${message}`], issues: [{ path: '', message }] },
    });
  }
  return compileConfig(raw, env, { configPath: path, cwd });
}

/** Compiles an already-parsed configuration object; see {@link loadConfig}. */
export function compileConfig(
  input: unknown,
  env: NodeJS.ProcessEnv,
  options: { configPath?: string | null; cwd?: string } = {},
): Config {
  const problems = new ConfigProblems();
  const file = options.configPath ?? null;
  // Every step runs, each skipping only the parts the schema found malformed: all problems in one report.
  const cfg = validated(input, problems, file);
  let schemaQuoted = '';
  try {
    if (!problems.malformed('/schema')) schemaQuoted = quoteSchemaName(cfg.schema);
  } catch (err) {
    problems.add('/schema', (err as Error).message);
  }
  const tools = compileRoutes(cfg.tools, problems, sandboxRouting(cfg, problems));
  const gate = compileGate(cfg.gate, cfg.tools, problems);
  crossFieldProblems(cfg, problems);
  const environment = fromEnvironment(cfg, env, problems);
  const cwd = options.cwd ?? process.cwd();
  const http = compileHttp(cfg.http, environment.port, cwd, problems);
  const toolNames = new Set(Object.keys(isObject(cfg.tools) ? cfg.tools : {}));
  const notifications = compileNotifications(cfg.notifications, toolNames, cwd, problems);
  const cluster = compileCluster(cfg, env, problems);
  const reviewPolicies = compileReviewPolicies(cfg.review_policies, toolNames, problems);
  if (!problems.malformed('/api/console/oidc')) consoleOidcProblems(cfg.api.console.oidc, problems);
  if (problems.length > 0 || gate === null) throw problems.error(file);
  const dataDir = resolve(cwd, env.ACTIONLEDGER_DATA_DIR ?? '.actionledger');
  const d = cfg.dispatcher;
  const r = cfg.reconciler;
  const keys: Record<string, { secretEnv: string }> = {};
  for (const [id, k] of Object.entries(cfg.effect_keys.keys)) keys[id] = Object.freeze({ secretEnv: k.secret_env });
  return Object.freeze({
    configPath: options.configPath ?? null,
    schema: cfg.schema,
    schemaQuoted,
    http,
    api: compileApi(cfg.api),
    databaseUrl: environment.databaseUrl,
    database: compileDatabase(cfg.database),
    dataDir,
    effectKeys: Object.freeze({ active: cfg.effect_keys.active, keys: Object.freeze(keys) }),
    argumentBounds: Object.freeze({ maxBytes: cfg.arguments.max_bytes, maxDepth: cfg.arguments.max_depth }),
    tools,
    dispatcher: Object.freeze({
      workers: d.workers,
      concurrency: d.concurrency,
      batchSize: d.batch_size,
      pollIntervalMs: d.poll_interval_ms,
      heartbeatIntervalMs: d.heartbeat_interval_ms,
      shutdownDeadlineMs: d.shutdown_deadline_ms,
      releaseLimit: d.release_limit,
      releaseBackoffInitialMs: d.release_backoff_initial_ms,
      releaseBackoffMaxMs: d.release_backoff_max_ms,
      ...dispatchPaths(cfg, cwd, resolve(dataDir, 'sandbox')),
    }),
    reconciler: Object.freeze({
      enabled: r.enabled,
      schedule: r.schedule,
      maxAttempts: r.max_attempts,
      backoffInitialMs: r.backoff_initial_ms,
      backoffMaxMs: r.backoff_max_ms,
      orphanAfterMs: r.orphan_after_ms,
      orphanCheckIntervalMs: r.orphan_check_interval_ms,
      concurrency: r.concurrency,
      batchSize: r.batch_size,
    }),
    sandbox: Object.freeze({
      enabled: cfg.sandbox.enabled,
      providerPort: cfg.sandbox.provider_port,
      authorizerPort: cfg.sandbox.authorizer_port,
    }),
    gate,
    notifications,
    reviewPolicies,
    logLevel: env.LOG_LEVEL ?? 'info',
    cluster,
    tenantClusters: new Map(Object.entries(cfg.tenant_clusters)),
  });
}

function compileDatabase(d: RawConfig['database']): Config['database'] {
  return Object.freeze({
    poolMax: d.pool_max,
    statementTimeoutMs: d.statement_timeout_ms,
    embeddedPort: d.embedded_port,
    embeddedRestartInitialMs: d.embedded_restart_initial_ms,
    embeddedRestartMaxMs: d.embedded_restart_max_ms,
  });
}

/**
 * The input checked against the JSON schema (a copy, with its defaults filled in): every schema error is added
 * to `problems` and its part marked malformed for the later steps. Throws `config_invalid` only when the input
 * is not an object at all (nothing else can be checked).
 */
function validated(input: unknown, problems: ConfigProblems, file: string | null): RawConfig {
  const raw = structuredClone(input);
  if (validate(raw)) return raw;
  reportSchemaErrors(validate.errors ?? [], problems);
  if (!isObject(raw)) throw problems.error(file);
  return raw as RawConfig;
}

/** What the schema cannot say: fields that must agree with one another (each checked when its fields are sound). */
function crossFieldProblems(cfg: RawConfig, problems: ConfigProblems): void {
  const ok = (...paths: string[]): boolean => paths.every((p) => !problems.malformed(p));
  const keysDeclared = ok('/effect_keys/active') && isObject(cfg.effect_keys.keys);
  if (keysDeclared && !Object.hasOwn(cfg.effect_keys.keys, cfg.effect_keys.active)) {
    const declared = Object.keys(cfg.effect_keys.keys);
    const suggestion = nearest(cfg.effect_keys.active, declared);
    problems.add(
      '/effect_keys/active',
      `names key ${JSON.stringify(cfg.effect_keys.active)}, which /effect_keys/keys does not declare`,
      { allowed: declared, ...(suggestion === undefined ? {} : { suggestion }) },
    );
  }
  const r = cfg.reconciler;
  if (ok('/reconciler/backoff_max_ms', '/reconciler/backoff_initial_ms') && r.backoff_max_ms < r.backoff_initial_ms)
    problems.add('/reconciler/backoff_max_ms', 'must be at least backoff_initial_ms');
  const db = cfg.database;
  if (
    ok('/database/embedded_restart_max_ms', '/database/embedded_restart_initial_ms') &&
    db.embedded_restart_max_ms < db.embedded_restart_initial_ms
  )
    problems.add('/database/embedded_restart_max_ms', 'must be at least embedded_restart_initial_ms');
  const dc = cfg.dispatcher;
  if (
    ok('/dispatcher/release_backoff_max_ms', '/dispatcher/release_backoff_initial_ms') &&
    dc.release_backoff_max_ms < dc.release_backoff_initial_ms
  )
    problems.add('/dispatcher/release_backoff_max_ms', 'must be at least release_backoff_initial_ms');
  if (
    ok('/reconciler/orphan_after_ms', '/dispatcher/heartbeat_interval_ms') &&
    r.orphan_after_ms < 2 * cfg.dispatcher.heartbeat_interval_ms
  ) {
    problems.add(
      '/reconciler/orphan_after_ms',
      'must be at least twice /dispatcher/heartbeat_interval_ms (a live worker must never look dead)',
    );
  }
  if (ok('/reconciler/schedule') && !/^\S+( \S+){4,5}$/.test(r.schedule))
    problems.add('/reconciler/schedule', 'must be a cron expression of 5 or 6 fields', { got: r.schedule });
}

/** The settings the environment overrides or supplies: `PORT`, and the database URL from the named variable. */
function fromEnvironment(
  cfg: RawConfig,
  env: NodeJS.ProcessEnv,
  problems: ConfigProblems,
): { port: number; databaseUrl: string | null } {
  const fromFile = problems.malformed('/http/port') ? 0 : cfg.http.port;
  const port = env.PORT === undefined || env.PORT === '' ? fromFile : Number(env.PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    problems.add('PORT', '(environment) must be a port number, 0 to 65535', { got: env.PORT ?? null });
  const url = problems.malformed('/database/url_env') ? undefined : env[cfg.database.url_env];
  return { port, databaseUrl: url === undefined || url === '' ? null : url };
}

/**
 * The dispatch profile and mTLS files, absolute: as configured (relative to `cwd`), or with the sandbox enabled
 * and none configured, the files the sandbox generates under `sandboxDir`.
 */
function dispatchPaths(cfg: RawConfig, cwd: string, sandboxDir: string): Pick<DispatcherConfig, 'profile' | 'tls'> {
  const { profile, tls } = cfg.dispatcher;
  const sandbox = cfg.sandbox.enabled;
  return {
    profile:
      profile !== undefined
        ? Object.freeze({
            path: resolve(cwd, profile.path),
            signaturePath: resolve(cwd, profile.signature_path),
            publicKeyPath: resolve(cwd, profile.public_key_path),
          })
        : sandbox
          ? Object.freeze({
              path: resolve(sandboxDir, 'dispatch-profile.json'),
              signaturePath: resolve(sandboxDir, 'dispatch-profile.sig'),
              publicKeyPath: resolve(sandboxDir, 'profile-signing.pub'),
            })
          : null,
    tls:
      tls !== undefined
        ? Object.freeze({
            caFile: resolve(cwd, tls.ca_file),
            certFile: resolve(cwd, tls.cert_file),
            keyFile: resolve(cwd, tls.key_file),
          })
        : sandbox
          ? Object.freeze({
              caFile: resolve(sandboxDir, 'pki', 'ca.crt'),
              certFile: resolve(sandboxDir, 'pki', 'client.crt'),
              keyFile: resolve(sandboxDir, 'pki', 'client.key'),
            })
          : null,
  };
}

/** The cluster name from ACTIONLEDGER_CLUSTER or the file; a tenant map needs one to compare against. */
function compileCluster(
  cfg: { cluster?: string; tenant_clusters: Record<string, string> },
  env: NodeJS.ProcessEnv,
  problems: ConfigProblems,
): string | null {
  const fromEnv = env.ACTIONLEDGER_CLUSTER;
  if (fromEnv !== undefined && fromEnv !== '' && !/^[a-z0-9][a-z0-9-]{0,62}$/.test(fromEnv))
    problems.add('ACTIONLEDGER_CLUSTER', '(environment) must match ^[a-z0-9][a-z0-9-]{0,62}$', { got: fromEnv });
  const cluster = fromEnv !== undefined && fromEnv !== '' ? fromEnv : (cfg.cluster ?? null);
  if (cluster === null && Object.keys(cfg.tenant_clusters ?? {}).length > 0)
    problems.add('/cluster', 'must name this cluster when /tenant_clusters maps tenants (or set ACTIONLEDGER_CLUSTER)');
  return cluster;
}
