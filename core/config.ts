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
}

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
  readonly logLevel: string;
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
};
type RawConfig = {
  schema: string;
  http: { host: string; port: number };
  database: { url_env: string; pool_max: number; statement_timeout_ms: number; embedded_port: number };
  effect_keys: { active: string; keys: Record<string, { secret_env: string }> };
  arguments: { max_bytes: number; max_depth: number };
  tools: Record<string, RawTool>;
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
      }),
    );
  }

  const port = env.PORT === undefined || env.PORT === '' ? cfg.http.port : Number(env.PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535) problems.push(`PORT ${JSON.stringify(env.PORT)} is not a port number`);
  const url = env[cfg.database.url_env];
  if (problems.length > 0) throw configInvalid(problems);

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
    dataDir: resolve(options.cwd ?? process.cwd(), env.ACTIONLEDGER_DATA_DIR ?? '.actionledger'),
    effectKeys: Object.freeze({ active: cfg.effect_keys.active, keys: Object.freeze(keys) }),
    argumentBounds: Object.freeze({ maxBytes: cfg.arguments.max_bytes, maxDepth: cfg.arguments.max_depth }),
    tools,
    logLevel: env.LOG_LEVEL ?? 'info',
  });
}

function configInvalid(problems: string[]): ActionLedgerError {
  return new ActionLedgerError('config_invalid', `configuration is invalid:\n  - ${problems.join('\n  - ')}`, {
    details: { problems },
  });
}
