/**
 * The compiled configuration's types: what every component receives. Only types, so the files that compile
 * one part of the configuration (api.ts, gate.ts, routes.ts, notify.ts, ...) and load.ts, which runs them all,
 * import these without importing each other.
 */
import type { ValidateFunction } from 'ajv';
import type { JsonBounds } from '../core/json.js';
import type { ApiConfig, HttpConfig } from './api.js';
import type { NotificationsConfig } from './notify.js';
import type { ReviewPolicy } from './review-policies.js';

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
  /** Where notification events go (notify.ts). */
  readonly notifications: NotificationsConfig;
  /** Reviewed retries authorized ahead of time, per tool and review reason (review-policies.ts). */
  readonly reviewPolicies: readonly ReviewPolicy[];
  readonly logLevel: string;
  /** This deployment's cluster name (config `cluster`, or ACTIONLEDGER_CLUSTER), or null when none is named. */
  readonly cluster: string | null;
  /** Tenant -> the cluster that serves it (config `tenant_clusters`); see config/cluster.ts. */
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
