/**
 * Configuration: one JSON file, validated by one ajv schema with every problem listed at once, then compiled
 * (cross-field checks, environment resolution) into a deep-frozen object. Components receive the compiled
 * object and never read `process.env` themselves.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Ajv } from 'ajv';
import { ActionLedgerError } from './errors.js';
import { parseStrictJson, type JsonBounds } from './json.js';
import { configSchema } from './config-schema.js';
import { canonicalHttpsProblem } from './url.js';
import { escapeIdentifier } from 'pg';

export interface ToolRoute {
  readonly tool: string;
  readonly providerId: string;
  readonly endpoint: string;
  readonly allowedTenants: ReadonlySet<string>;
  readonly credentialEnv: string | null;
  readonly idempotencyHeader: string;
  readonly definitiveFailureStatuses: ReadonlySet<number>;
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
  readonly concurrency: number;
  readonly batchSize: number;
}

/** The placeholder a readback URL template must contain exactly once. */
export const EFFECT_KEY_PLACEHOLDER = '{effect_key}';

export interface Config {
  readonly configPath: string | null;
  readonly schema: string;
  /** The schema name quoted once, the only dynamic part of any SQL text. */
  readonly schemaQuoted: string;
  readonly http: { readonly host: string; readonly port: number };
  /** Null means the embedded PostgreSQL in {@link Config.dataDir}. */
  readonly databaseUrl: string | null;
  readonly database: { readonly poolMax: number; readonly statementTimeoutMs: number; readonly embeddedPort: number };
  readonly dataDir: string;
  readonly effectKeys: { readonly active: string; readonly keys: Readonly<Record<string, { readonly secretEnv: string }>> };
  readonly argumentBounds: JsonBounds;
  readonly tools: ReadonlyMap<string, ToolRoute>;
  readonly dispatcher: DispatcherConfig;
  readonly reconciler: ReconcilerConfig;
  readonly sandbox: { readonly enabled: boolean; readonly providerPort: number; readonly authorizerPort: number };
  readonly logLevel: string;
}

export interface DispatcherConfig {
  readonly workers: number;
  readonly concurrency: number;
  readonly batchSize: number;
  readonly pollIntervalMs: number;
  readonly heartbeatIntervalMs: number;
  readonly shutdownDeadlineMs: number;
  /** Absolute paths; with the sandbox enabled they default to files it generates in the data folder. */
  readonly profile: { readonly path: string; readonly signaturePath: string; readonly publicKeyPath: string } | null;
  readonly tls: { readonly caFile: string; readonly certFile: string; readonly keyFile: string } | null;
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

const ajv = new Ajv({ allErrors: true, strict: true, useDefaults: true });
const validate = ajv.compile(configSchema);

/** Validates a schema name and returns it quoted; throws `schema_name_invalid`. */
export function quoteSchemaName(name: string): string {
  if (!SCHEMA_NAME.test(name) || name.startsWith('pg_')) {
    throw new ActionLedgerError('schema_name_invalid', `schema name ${JSON.stringify(name)} must match ${SCHEMA_NAME.source} and not start with pg_`);
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
    throw new ActionLedgerError('config_invalid', `cannot read configuration file ${path}`, { cause, details: { problems: [`cannot read ${path}`] } });
  }
  let raw: unknown;
  try {
    raw = parseStrictJson(text, { requireObject: true });
  } catch (cause) {
    throw new ActionLedgerError('config_invalid', `configuration file ${path} is not strict JSON: ${(cause as Error).message}`, { cause });
  }
  return compileConfig(raw, env, { configPath: path, cwd });
}

type RawTool = {
  provider_id: string;
  endpoint: string;
  allowed_tenants: string[];
  credential_env?: string;
  idempotency: { mechanism: 'header'; name: string };
  definitive_failure_statuses: number[];
  readback?: { url: string };
  effects_listing_url?: string;
  compensation?: { tool: string; arguments: Record<string, { from: string; pointer?: string } | { value: unknown }> };
};
type RawConfig = {
  schema: string;
  http: { host: string; port: number };
  database: { url_env: string; pool_max: number; statement_timeout_ms: number; embedded_port: number };
  effect_keys: { active: string; keys: Record<string, { secret_env: string }> };
  arguments: { max_bytes: number; max_depth: number };
  tools: Record<string, RawTool>;
  dispatcher: {
    workers: number;
    concurrency: number;
    batch_size: number;
    poll_interval_ms: number;
    heartbeat_interval_ms: number;
    shutdown_deadline_ms: number;
    profile?: { path: string; signature_path: string; public_key_path: string };
    tls?: { ca_file: string; cert_file: string; key_file: string };
  };
  reconciler: {
    enabled: boolean;
    schedule: string;
    max_attempts: number;
    backoff_initial_ms: number;
    backoff_max_ms: number;
    orphan_after_ms: number;
    concurrency: number;
    batch_size: number;
  };
  sandbox: { enabled: boolean; provider_port: number; authorizer_port: number };
};

/** Compiles an already-parsed configuration object; see {@link loadConfig}. */
export function compileConfig(
  input: unknown,
  env: NodeJS.ProcessEnv,
  options: { configPath?: string | null; cwd?: string } = {},
): Config {
  const raw = structuredClone(input);
  const problems: string[] = [];
  if (!validate(raw)) {
    for (const e of validate.errors ?? []) {
      const where = e.instancePath === '' ? '(root)' : e.instancePath;
      const extra = e.keyword === 'additionalProperties' ? ` (${String((e.params as { additionalProperty: string }).additionalProperty)})` : '';
      problems.push(`${where} ${e.message ?? 'is invalid'}${extra}`);
    }
    throw configInvalid(problems);
  }
  const cfg = raw as unknown as RawConfig;

  let schemaQuoted = '';
  try {
    schemaQuoted = quoteSchemaName(cfg.schema);
  } catch (err) {
    problems.push(`/schema ${(err as Error).message}`);
  }
  if (!(cfg.effect_keys.active in cfg.effect_keys.keys)) {
    problems.push(`/effect_keys/active names key ${JSON.stringify(cfg.effect_keys.active)}, which /effect_keys/keys does not declare`);
  }

  const tools = new Map<string, ToolRoute>();
  for (const [name, t] of Object.entries(cfg.tools)) {
    const problem = canonicalHttpsProblem(t.endpoint);
    if (problem !== null) problems.push(`/tools/${name}/endpoint ${problem}`);
    if (t.readback !== undefined) {
      const parts = t.readback.url.split(EFFECT_KEY_PLACEHOLDER);
      const p = parts.length !== 2 ? `must contain ${EFFECT_KEY_PLACEHOLDER} exactly once` : canonicalHttpsProblem(parts.join('k'));
      if (p !== null) problems.push(`/tools/${name}/readback/url ${p}`);
    }
    if (t.effects_listing_url !== undefined) {
      const p = canonicalHttpsProblem(t.effects_listing_url);
      if (p !== null) problems.push(`/tools/${name}/effects_listing_url ${p}`);
    }
    let compensation: CompensationMapping | null = null;
    if (t.compensation !== undefined) {
      const target = cfg.tools[t.compensation.tool];
      if (target === undefined) problems.push(`/tools/${name}/compensation/tool names ${JSON.stringify(t.compensation.tool)}, which /tools does not declare`);
      else if (t.compensation.tool === name) problems.push(`/tools/${name}/compensation/tool must be another tool`);
      const args: Record<string, CompensationSource> = {};
      for (const [arg, src] of Object.entries(t.compensation.arguments)) {
        if ('value' in src) args[arg] = Object.freeze({ value: src.value });
        else if (src.from === 'arguments') {
          if (src.pointer === undefined) problems.push(`/tools/${name}/compensation/arguments/${arg} needs a pointer into the original arguments`);
          args[arg] = Object.freeze({ from: 'arguments', pointer: src.pointer ?? '' });
        } else {
          if (src.pointer !== undefined) problems.push(`/tools/${name}/compensation/arguments/${arg} takes a pointer only with from: arguments`);
          args[arg] = Object.freeze({ from: src.from as 'receipt' | 'operation_id' | 'effect_key' });
        }
      }
      compensation = Object.freeze({ tool: t.compensation.tool, arguments: Object.freeze(args) });
    }
    tools.set(
      name,
      Object.freeze({
        tool: name,
        providerId: t.provider_id,
        endpoint: t.endpoint,
        allowedTenants: Object.freeze(new Set(t.allowed_tenants)),
        credentialEnv: t.credential_env ?? null,
        idempotencyHeader: t.idempotency.name,
        definitiveFailureStatuses: Object.freeze(new Set(t.definitive_failure_statuses)),
        readback: t.readback === undefined ? null : Object.freeze({ urlTemplate: t.readback.url }),
        effectsListingUrl: t.effects_listing_url ?? null,
        compensation,
      }),
    );
  }

  const r = cfg.reconciler;
  if (r.backoff_max_ms < r.backoff_initial_ms) problems.push('/reconciler/backoff_max_ms must be at least backoff_initial_ms');
  if (r.orphan_after_ms < 2 * cfg.dispatcher.heartbeat_interval_ms) {
    problems.push('/reconciler/orphan_after_ms must be at least twice /dispatcher/heartbeat_interval_ms (a live worker must never look dead)');
  }
  if (!/^\S+( \S+){4,5}$/.test(r.schedule)) problems.push('/reconciler/schedule must be a cron expression of 5 or 6 fields');

  const port = env.PORT === undefined || env.PORT === '' ? cfg.http.port : Number(env.PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535) problems.push(`PORT ${JSON.stringify(env.PORT)} is not a port number`);
  const url = env[cfg.database.url_env];
  if (problems.length > 0) throw configInvalid(problems);

  const cwd = options.cwd ?? process.cwd();
  const dataDir = resolve(cwd, env.ACTIONLEDGER_DATA_DIR ?? '.actionledger');
  const sandboxDir = resolve(dataDir, 'sandbox');
  const d = cfg.dispatcher;
  const profile = d.profile !== undefined
    ? { path: resolve(cwd, d.profile.path), signaturePath: resolve(cwd, d.profile.signature_path), publicKeyPath: resolve(cwd, d.profile.public_key_path) }
    : cfg.sandbox.enabled
      ? { path: resolve(sandboxDir, 'dispatch-profile.json'), signaturePath: resolve(sandboxDir, 'dispatch-profile.sig'), publicKeyPath: resolve(sandboxDir, 'profile-signing.pub') }
      : null;
  const tls = d.tls !== undefined
    ? { caFile: resolve(cwd, d.tls.ca_file), certFile: resolve(cwd, d.tls.cert_file), keyFile: resolve(cwd, d.tls.key_file) }
    : cfg.sandbox.enabled
      ? { caFile: resolve(sandboxDir, 'pki', 'ca.crt'), certFile: resolve(sandboxDir, 'pki', 'client.crt'), keyFile: resolve(sandboxDir, 'pki', 'client.key') }
      : null;

  const keys: Record<string, { secretEnv: string }> = {};
  for (const [id, k] of Object.entries(cfg.effect_keys.keys)) keys[id] = Object.freeze({ secretEnv: k.secret_env });

  return Object.freeze({
    configPath: options.configPath ?? null,
    schema: cfg.schema,
    schemaQuoted,
    http: Object.freeze({ host: cfg.http.host, port }),
    databaseUrl: url === undefined || url === '' ? null : url,
    database: Object.freeze({
      poolMax: cfg.database.pool_max,
      statementTimeoutMs: cfg.database.statement_timeout_ms,
      embeddedPort: cfg.database.embedded_port,
    }),
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
      profile: profile === null ? null : Object.freeze(profile),
      tls: tls === null ? null : Object.freeze(tls),
    }),
    reconciler: Object.freeze({
      enabled: r.enabled,
      schedule: r.schedule,
      maxAttempts: r.max_attempts,
      backoffInitialMs: r.backoff_initial_ms,
      backoffMaxMs: r.backoff_max_ms,
      orphanAfterMs: r.orphan_after_ms,
      concurrency: r.concurrency,
      batchSize: r.batch_size,
    }),
    sandbox: Object.freeze({ enabled: cfg.sandbox.enabled, providerPort: cfg.sandbox.provider_port, authorizerPort: cfg.sandbox.authorizer_port }),
    logLevel: env.LOG_LEVEL ?? 'info',
  });
}

function configInvalid(problems: string[]): ActionLedgerError {
  return new ActionLedgerError('config_invalid', `configuration is invalid:\n  - ${problems.join('\n  - ')}`, {
    details: { problems },
  });
}
