/**
 * Configuration: one JSON file, validated by one ajv schema with every problem listed at once, then compiled
 * into a deep-frozen object in steps: provider routes and their compensation mappings (config-routes.ts), the
 * gate's tools (config-gate.ts), cross-field checks, the environment, and the paths. Components receive the
 * compiled object and never read `process.env` themselves.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Ajv, type ValidateFunction } from 'ajv';
import { escapeIdentifier } from 'pg';
import { ActionLedgerError } from './errors.js';
import { parseStrictJson, type JsonBounds } from './json.js';
import { configSchema, type RawConfig } from './config-schema.js';
import { compileApi, compileHttp, type ApiConfig, type HttpConfig } from './config-api.js';
import { compileRoutes } from './config-routes.js';
import { compileGate } from './config-gate.js';
import { compileNotifications, type NotificationsConfig } from './config-notify.js';
import { compileReviewPolicies, type ReviewPolicy } from './config-review-policies.js';
import { ConfigProblems, isObject, nearest } from './config-problems.js';
import { reportSchemaErrors } from './config-schema-errors.js';

export interface ToolRoute {
  readonly tool: string;
  readonly providerId: string;
  readonly endpoint: string;
  readonly allowedTenants: ReadonlySet<string>;
  readonly credentialEnv: string | null;
  readonly idempotencyHeader: string;
  readonly definitiveFailureStatuses: ReadonlySet<number>;
  /** Never-sent releases of one of its operations before review; null: `dispatcher.release_limit`. */
  readonly releaseLimit: number | null;
  /** How the reconciler asks the provider whether an effect key was applied; null: no readback contract. */
  readonly readback: { readonly urlTemplate: string } | null;
  /** The provider's listing of effects by key, for `actionledger verify`. */
  readonly effectsListingUrl: string | null;
  /** The declared inverse of this tool; null: compensation goes to review, never an invented inverse. */
  readonly compensation: CompensationMapping | null;
}

/** Where one argument of a compensation comes from: the original's arguments, receipt, ids, or a literal. */
export type CompensationSource =
  | { readonly from: 'arguments'; readonly pointer: string }
  | { readonly from: 'receipt' | 'operation_id' | 'effect_key' }
  | { readonly value: unknown };

export interface CompensationMapping {
  readonly tool: string;
  readonly arguments: Readonly<Record<string, CompensationSource>>;
}

export interface ReconcilerConfig {
  readonly enabled: boolean;
  readonly schedule: string;
  readonly maxAttempts: number;
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  readonly orphanAfterMs: number;
  /** How often the fleet looks for orphaned claims to reconcile at once; 0: only scheduled passes. */
  readonly orphanCheckIntervalMs: number;
  readonly concurrency: number;
  readonly batchSize: number;
}

export { EFFECT_KEY_PLACEHOLDER } from './config-routes.js';
export type { RawTool } from './config-schema.js';

export interface Config {
  readonly configPath: string | null;
  readonly schema: string;
  /** The schema name quoted once, the only dynamic part of any SQL text. */
  readonly schemaQuoted: string;
  readonly http: HttpConfig;
  readonly api: ApiConfig;
  /** Null means the embedded PostgreSQL in {@link Config.dataDir}. */
  readonly databaseUrl: string | null;
  readonly database: {
    readonly poolMax: number;
    readonly statementTimeoutMs: number;
    readonly embeddedPort: number;
    /** The embedded PostgreSQL's restart backoff: the first wait and the cap. */
    readonly embeddedRestartInitialMs: number;
    readonly embeddedRestartMaxMs: number;
  };
  readonly dataDir: string;
  readonly effectKeys: {
    readonly active: string;
    readonly keys: Readonly<Record<string, { readonly secretEnv: string }>>;
  };
  readonly argumentBounds: JsonBounds;
  readonly tools: ReadonlyMap<string, ToolRoute>;
  readonly dispatcher: DispatcherConfig;
  readonly reconciler: ReconcilerConfig;
  readonly sandbox: { readonly enabled: boolean; readonly providerPort: number; readonly authorizerPort: number };
  readonly gate: GateConfig;
  /** Where notification events go (config-notify.ts). */
  readonly notifications: NotificationsConfig;
  /** Reviewed retries authorized ahead of time, per tool and review reason (config-review-policies.ts). */
  readonly reviewPolicies: readonly ReviewPolicy[];
  readonly logLevel: string;
  /** This deployment's cluster name (config `cluster`, or ACTIONLEDGER_CLUSTER), or null when none is named. */
  readonly cluster: string | null;
  /** Tenant -> the cluster that serves it (config `tenant_clusters`); see core/cluster.ts. */
  readonly tenantClusters: ReadonlyMap<string, string>;
}

export type ApprovalMode = 'auto' | 'threshold' | 'always' | 'confirm';
export interface GateCap {
  readonly maxCount: number | null;
  readonly maxValue: number | null;
}

/** One tool as the gate knows it: schema, who may call it, its value, its approval policy, its limits. */
export interface GateTool {
  readonly name: string;
  readonly description: string;
  /** The argument schema as configured, and its ajv (strict mode) compilation. */
  readonly schema: unknown;
  readonly validate: ValidateFunction;
  readonly roles: ReadonlySet<string>;
  readonly approverRoles: ReadonlySet<string>;
  /**
   * `limitsCurrency`: the one currency value caps and the approval threshold are in (the fixed currency, or
   * the declared `limits_currency`); a call naming another one is refused. `valueCapped`: the tool has a
   * threshold or a max_value, so it needs one (without it the gate refuses its calls, `config_invalid`).
   */
  readonly value: {
    readonly argument: string;
    readonly currencyArgument: string | null;
    readonly currency: string | null;
    readonly limitsCurrency: string | null;
    readonly valueCapped: boolean;
  } | null;
  readonly approval: {
    readonly mode: ApprovalMode;
    readonly threshold: number | null;
    readonly approvers: number;
    readonly ttlS: number;
  };
  readonly irreversible: boolean;
  readonly validator: string | null;
  readonly resources: readonly { readonly type: string; readonly idArgument: string }[];
  readonly redact: ReadonlySet<string>;
  readonly effect: string | null;
  readonly rate: { readonly limit: number; readonly windowS: number } | null;
  readonly limits: {
    readonly perPrincipalDay: GateCap | null;
    readonly perAccountDay: GateCap | null;
    readonly perConversation: GateCap | null;
  };
}

export interface GateConfig {
  readonly policyVersion: string;
  readonly directReservations: 'allow' | 'deny';
  readonly confirmationTtlS: number;
  readonly decisionTtlS: number;
  readonly tools: ReadonlyMap<string, GateTool>;
}

export interface DispatcherConfig {
  readonly workers: number;
  readonly concurrency: number;
  readonly batchSize: number;
  readonly pollIntervalMs: number;
  readonly heartbeatIntervalMs: number;
  readonly shutdownDeadlineMs: number;
  /** Never-sent releases of one operation before review (a tool's route may say otherwise: `ToolRoute.releaseLimit`). */
  readonly releaseLimit: number;
  readonly releaseBackoffInitialMs: number;
  readonly releaseBackoffMaxMs: number;
  /** Absolute paths; with the sandbox enabled they default to files it generates in the data folder. */
  readonly profile: { readonly path: string; readonly signaturePath: string; readonly publicKeyPath: string } | null;
  readonly tls: { readonly caFile: string; readonly certFile: string; readonly keyFile: string } | null;
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

// verbose: each error carries the offending value and its schema (for the allowed keys of an unknown one).
// No code optimization: the validator runs once per process, and optimizing it was a tenth of a CLI call.
const ajv = new Ajv({ allErrors: true, strict: true, useDefaults: true, verbose: true, code: { optimize: false } });
const validate = ajv.compile<RawConfig>(configSchema);

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
  const tools = compileRoutes(cfg.tools, problems);
  const gate = compileGate(cfg.gate, cfg.tools, problems);
  crossFieldProblems(cfg, problems);
  const environment = fromEnvironment(cfg, env, problems);
  const cwd = options.cwd ?? process.cwd();
  const http = compileHttp(cfg.http, environment.port, cwd, problems);
  const toolNames = new Set(Object.keys(isObject(cfg.tools) ? cfg.tools : {}));
  const notifications = compileNotifications(cfg.notifications, toolNames, cwd, problems);
  const cluster = compileCluster(cfg, env, problems);
  const reviewPolicies = compileReviewPolicies(cfg.review_policies, toolNames, problems);
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
