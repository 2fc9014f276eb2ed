/**
 * Configuration: one JSON file, validated by one ajv schema with every problem listed at once, then compiled
 * (cross-field checks, environment resolution) into a deep-frozen object. Components receive the compiled
 * object and never read `process.env` themselves.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Ajv, type ValidateFunction } from 'ajv';
import { ActionLedgerError } from './errors.js';
import { parseStrictJson, type JsonBounds } from './json.js';
import { configSchema } from './config-schema.js';
import { canonicalHttpsProblem } from './url.js';
import { escapeIdentifier } from 'pg';
import { IDENTITY_ARGUMENT_NAMES } from './types.js';

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
  readonly logLevel: string;
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
  /** Absolute paths; with the sandbox enabled they default to files it generates in the data folder. */
  readonly profile: { readonly path: string; readonly signaturePath: string; readonly publicKeyPath: string } | null;
  readonly tls: { readonly caFile: string; readonly certFile: string; readonly keyFile: string } | null;
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

const ajv = new Ajv({ allErrors: true, strict: true, useDefaults: true });
const validate = ajv.compile(configSchema);
/** Tool argument schemas: strict mode (unknown keywords refused), every violation listed. */
const toolAjv = new Ajv({ allErrors: true, strict: true });

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
    throw new ActionLedgerError('config_invalid', `cannot read configuration file ${path}`, {
      cause,
      details: { problems: [`cannot read ${path}`] },
    });
  }
  let raw: unknown;
  try {
    raw = parseStrictJson(text, { requireObject: true });
  } catch (cause) {
    throw new ActionLedgerError(
      'config_invalid',
      `configuration file ${path} is not strict JSON: ${(cause as Error).message}`,
      { cause },
    );
  }
  return compileConfig(raw, env, { configPath: path, cwd });
}

/** One tool's route as written in the configuration file. */
export type RawTool = {
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
  gate: RawGate;
};

type RawCap = { max_count?: number; max_value?: number };
type RawGateTool = {
  description?: string;
  schema: Record<string, unknown>;
  roles: string[];
  approver_roles: string[];
  value?: { argument: string; currency_argument?: string; currency?: string; limits_currency?: string };
  approval: { mode: ApprovalMode; threshold?: number; approvers: number; ttl_s?: number };
  irreversible: boolean;
  validator?: string;
  resources: { type: string; id_argument: string }[];
  redact: string[];
  effect?: string;
  rate?: { limit: number; window_s: number };
  limits: { per_principal_day?: RawCap; per_account_day?: RawCap; per_conversation?: RawCap };
};
type RawGate = {
  policy_version: string;
  direct_reservations: 'allow' | 'deny';
  confirmation_ttl_s: number;
  approval_ttl_s: number;
  irreversible_approval_ttl_s: number;
  decision_ttl_s: number;
  tools: Record<string, RawGateTool>;
};

/**
 * Finds every object schema that is not closed (`additionalProperties: false`) and every property named like an
 * identity field: both are refused at start. Walks the keywords that hold subschemas.
 */
function schemaProblems(node: unknown, path: string, out: string[]): void {
  if (node === null || typeof node !== 'object') return;
  if (Array.isArray(node)) {
    node.forEach((n, i) => schemaProblems(n, `${path}/${i}`, out));
    return;
  }
  const o = node as Record<string, unknown>;
  const types = Array.isArray(o.type) ? o.type : [o.type];
  if ((types.includes('object') || 'properties' in o) && o.additionalProperties !== false) {
    out.push(`${path} is an object schema without additionalProperties: false`);
  }
  if (o.properties !== null && typeof o.properties === 'object') {
    for (const name of Object.keys(o.properties)) {
      if ((IDENTITY_ARGUMENT_NAMES as readonly string[]).includes(name))
        out.push(`${path}/properties/${name} declares an identity argument (authority comes from the trusted context)`);
    }
  }
  for (const [k, v] of Object.entries(o)) {
    if (k === 'enum' || k === 'const' || k === 'default' || k === 'examples') continue;
    schemaProblems(v, `${path}/${k}`, out);
  }
}

function compileGate(raw: RawGate, routes: Record<string, RawTool>, problems: string[]): GateConfig {
  const tools = new Map<string, GateTool>();
  for (const [name, t] of Object.entries(raw.tools)) {
    const where = `/gate/tools/${name}`;
    if (routes[name] === undefined) problems.push(`${where} has no provider route in /tools`);
    const before = problems.length;
    if (t.schema.type !== 'object') problems.push(`${where}/schema must have type: object`);
    schemaProblems(t.schema, `${where}/schema`, problems);
    let validate: ValidateFunction = (() => false) as unknown as ValidateFunction;
    if (problems.length === before) {
      try {
        validate = toolAjv.compile(t.schema);
      } catch (err) {
        problems.push(`${where}/schema does not compile in ajv strict mode: ${(err as Error).message}`);
      }
    }
    const props = (t.schema.properties ?? {}) as Record<string, unknown>;
    if (t.value !== undefined) {
      if (!(t.value.argument in props))
        problems.push(`${where}/value/argument names ${t.value.argument}, which the schema does not declare`);
      if ((t.value.currency_argument === undefined) === (t.value.currency === undefined))
        problems.push(`${where}/value needs exactly one of currency_argument and currency`);
      if (t.value.currency_argument !== undefined && !(t.value.currency_argument in props))
        problems.push(
          `${where}/value/currency_argument names ${t.value.currency_argument}, which the schema does not declare`,
        );
    }
    if (t.approval.mode === 'threshold' && (t.approval.threshold === undefined || t.value === undefined))
      problems.push(`${where}/approval mode threshold needs a threshold and a value argument`);
    // Caps and the threshold are amounts in one currency: a call in another is refused, never counted apart.
    const valueCapped =
      t.approval.mode === 'threshold' || Object.values(t.limits).some((c) => c?.max_value !== undefined);
    if (
      t.value?.currency !== undefined &&
      t.value.limits_currency !== undefined &&
      t.value.limits_currency !== t.value.currency
    )
      problems.push(`${where}/value/limits_currency differs from the fixed currency`);
    // Without limits_currency such a tool still loads (configurations written before it existed), but the gate
    // refuses its calls with config_invalid (fail closed) until one is declared.
    for (const [k, cap] of Object.entries(t.limits)) {
      if (cap?.max_value !== undefined && t.value === undefined)
        problems.push(`${where}/limits/${k}/max_value needs a value argument`);
    }
    for (const r of t.resources)
      if (!(r.id_argument in props)) problems.push(`${where}/resources: ${r.id_argument} is not a declared argument`);
    const cap = (c: RawCap | undefined): GateCap | null =>
      c === undefined ? null : Object.freeze({ maxCount: c.max_count ?? null, maxValue: c.max_value ?? null });
    tools.set(
      name,
      Object.freeze({
        name,
        description: t.description ?? '',
        schema: t.schema,
        validate,
        roles: Object.freeze(new Set(t.roles)),
        approverRoles: Object.freeze(new Set(t.approver_roles)),
        value:
          t.value === undefined
            ? null
            : Object.freeze({
                argument: t.value.argument,
                currencyArgument: t.value.currency_argument ?? null,
                currency: t.value.currency ?? null,
                limitsCurrency: t.value.currency ?? t.value.limits_currency ?? null,
                valueCapped,
              }),
        approval: Object.freeze({
          mode: t.approval.mode,
          threshold: t.approval.threshold ?? null,
          approvers: t.approval.approvers,
          ttlS: t.approval.ttl_s ?? (t.irreversible ? raw.irreversible_approval_ttl_s : raw.approval_ttl_s),
        }),
        irreversible: t.irreversible,
        validator: t.validator ?? null,
        resources: Object.freeze(t.resources.map((r) => Object.freeze({ type: r.type, idArgument: r.id_argument }))),
        redact: Object.freeze(new Set(t.redact)),
        effect: t.effect ?? null,
        rate: t.rate === undefined ? null : Object.freeze({ limit: t.rate.limit, windowS: t.rate.window_s }),
        limits: Object.freeze({
          perPrincipalDay: cap(t.limits.per_principal_day),
          perAccountDay: cap(t.limits.per_account_day),
          perConversation: cap(t.limits.per_conversation),
        }),
      }),
    );
  }
  return Object.freeze({
    policyVersion: raw.policy_version,
    directReservations: raw.direct_reservations,
    confirmationTtlS: raw.confirmation_ttl_s,
    decisionTtlS: raw.decision_ttl_s,
    tools,
  });
}

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
      const extra =
        e.keyword === 'additionalProperties'
          ? ` (${String((e.params as { additionalProperty: string }).additionalProperty)})`
          : '';
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
    problems.push(
      `/effect_keys/active names key ${JSON.stringify(cfg.effect_keys.active)}, which /effect_keys/keys does not declare`,
    );
  }

  const tools = new Map<string, ToolRoute>();
  for (const [name, t] of Object.entries(cfg.tools)) {
    const problem = canonicalHttpsProblem(t.endpoint);
    if (problem !== null) problems.push(`/tools/${name}/endpoint ${problem}`);
    if (t.readback !== undefined) {
      const parts = t.readback.url.split(EFFECT_KEY_PLACEHOLDER);
      const p =
        parts.length !== 2
          ? `must contain ${EFFECT_KEY_PLACEHOLDER} exactly once`
          : canonicalHttpsProblem(parts.join('k'));
      if (p !== null) problems.push(`/tools/${name}/readback/url ${p}`);
    }
    if (t.effects_listing_url !== undefined) {
      const p = canonicalHttpsProblem(t.effects_listing_url);
      if (p !== null) problems.push(`/tools/${name}/effects_listing_url ${p}`);
    }
    let compensation: CompensationMapping | null = null;
    if (t.compensation !== undefined) {
      const target = cfg.tools[t.compensation.tool];
      if (target === undefined)
        problems.push(
          `/tools/${name}/compensation/tool names ${JSON.stringify(t.compensation.tool)}, which /tools does not declare`,
        );
      else if (t.compensation.tool === name) problems.push(`/tools/${name}/compensation/tool must be another tool`);
      const args: Record<string, CompensationSource> = {};
      for (const [arg, src] of Object.entries(t.compensation.arguments)) {
        if ('value' in src) args[arg] = Object.freeze({ value: src.value });
        else if (src.from === 'arguments') {
          if (src.pointer === undefined)
            problems.push(`/tools/${name}/compensation/arguments/${arg} needs a pointer into the original arguments`);
          args[arg] = Object.freeze({ from: 'arguments', pointer: src.pointer ?? '' });
        } else {
          if (src.pointer !== undefined)
            problems.push(`/tools/${name}/compensation/arguments/${arg} takes a pointer only with from: arguments`);
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

  const gate = compileGate(cfg.gate, cfg.tools, problems);

  const r = cfg.reconciler;
  if (r.backoff_max_ms < r.backoff_initial_ms)
    problems.push('/reconciler/backoff_max_ms must be at least backoff_initial_ms');
  if (r.orphan_after_ms < 2 * cfg.dispatcher.heartbeat_interval_ms) {
    problems.push(
      '/reconciler/orphan_after_ms must be at least twice /dispatcher/heartbeat_interval_ms (a live worker must never look dead)',
    );
  }
  if (!/^\S+( \S+){4,5}$/.test(r.schedule))
    problems.push('/reconciler/schedule must be a cron expression of 5 or 6 fields');

  const port = env.PORT === undefined || env.PORT === '' ? cfg.http.port : Number(env.PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    problems.push(`PORT ${JSON.stringify(env.PORT)} is not a port number`);
  const url = env[cfg.database.url_env];
  if (problems.length > 0) throw configInvalid(problems);

  const cwd = options.cwd ?? process.cwd();
  const dataDir = resolve(cwd, env.ACTIONLEDGER_DATA_DIR ?? '.actionledger');
  const sandboxDir = resolve(dataDir, 'sandbox');
  const d = cfg.dispatcher;
  const profile =
    d.profile !== undefined
      ? {
          path: resolve(cwd, d.profile.path),
          signaturePath: resolve(cwd, d.profile.signature_path),
          publicKeyPath: resolve(cwd, d.profile.public_key_path),
        }
      : cfg.sandbox.enabled
        ? {
            path: resolve(sandboxDir, 'dispatch-profile.json'),
            signaturePath: resolve(sandboxDir, 'dispatch-profile.sig'),
            publicKeyPath: resolve(sandboxDir, 'profile-signing.pub'),
          }
        : null;
  const tls =
    d.tls !== undefined
      ? {
          caFile: resolve(cwd, d.tls.ca_file),
          certFile: resolve(cwd, d.tls.cert_file),
          keyFile: resolve(cwd, d.tls.key_file),
        }
      : cfg.sandbox.enabled
        ? {
            caFile: resolve(sandboxDir, 'pki', 'ca.crt'),
            certFile: resolve(sandboxDir, 'pki', 'client.crt'),
            keyFile: resolve(sandboxDir, 'pki', 'client.key'),
          }
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
    sandbox: Object.freeze({
      enabled: cfg.sandbox.enabled,
      providerPort: cfg.sandbox.provider_port,
      authorizerPort: cfg.sandbox.authorizer_port,
    }),
    gate,
    logLevel: env.LOG_LEVEL ?? 'info',
  });
}

function configInvalid(problems: string[]): ActionLedgerError {
  return new ActionLedgerError('config_invalid', `configuration is invalid:\n  - ${problems.join('\n  - ')}`, {
    details: { problems },
  });
}
