import type { FromSchema } from 'json-schema-to-ts';
import { apiSchema, httpSchema } from './api.js';
import { notificationsSchema } from './notify.js';
import { reviewPoliciesSchema } from './review-policies.js';

/** The JSON Schema of `actionledger.config.json`; every object closed, defaults filled in by ajv. */
export const configSchema = {
  type: 'object',
  $defs: {
    cap: {
      type: 'object',
      additionalProperties: false,
      minProperties: 1,
      properties: {
        max_count: { type: 'integer', minimum: 0 },
        max_value: { type: 'number', minimum: 0 },
      },
    },
  },
  additionalProperties: false,
  required: ['tools'],
  properties: {
    $comment: { type: 'string' },
    schema: { type: 'string', default: 'actionledger' },
    /** This deployment's PostgreSQL cluster: a label on every metric, a field on every log line (ACTIONLEDGER_CLUSTER overrides). */
    cluster: { type: 'string', pattern: '^[a-z0-9][a-z0-9-]{0,62}$' },
    /** Tenants served by a named cluster; a call here for a tenant mapped to another cluster is refused. */
    tenant_clusters: {
      type: 'object',
      default: {},
      additionalProperties: { type: 'string', pattern: '^[a-z0-9][a-z0-9-]{0,62}$' },
    },
    http: httpSchema,
    api: apiSchema,
    notifications: notificationsSchema,
    /** Reviewed authorization given ahead of time: which review reasons a pass retries by itself (review-policies.ts). */
    review_policies: reviewPoliciesSchema,
    database: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        url_env: { type: 'string', pattern: '^[A-Z_][A-Z0-9_]*$', default: 'DATABASE_URL' },
        pool_max: { type: 'integer', minimum: 1, maximum: 200, default: 10 },
        statement_timeout_ms: { type: 'integer', minimum: 100, default: 30000 },
        embedded_port: { type: 'integer', minimum: 1024, maximum: 65535, default: 54329 },
        // The supervisor's waits between restart tries of the embedded PostgreSQL (embedded/cluster.ts).
        embedded_restart_initial_ms: { type: 'integer', minimum: 10, maximum: 3600000, default: 500 },
        embedded_restart_max_ms: { type: 'integer', minimum: 10, maximum: 3600000, default: 60000 },
      },
    },
    effect_keys: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        active: { type: 'string', pattern: '^[a-z0-9][a-z0-9-]{0,15}$', default: 'k1' },
        keys: {
          type: 'object',
          default: { k1: { secret_env: 'ACTIONLEDGER_EFFECT_KEY_SECRET' } },
          propertyNames: { pattern: '^[a-z0-9][a-z0-9-]{0,15}$' },
          minProperties: 1,
          additionalProperties: {
            type: 'object',
            additionalProperties: false,
            required: ['secret_env'],
            properties: { secret_env: { type: 'string', pattern: '^[A-Z_][A-Z0-9_]*$' } },
          },
        },
      },
    },
    arguments: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        max_bytes: { type: 'integer', minimum: 2, maximum: 16777216, default: 65536 },
        max_depth: { type: 'integer', minimum: 1, maximum: 256, default: 16 },
      },
    },
    dispatcher: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        workers: { type: 'integer', minimum: 1, maximum: 64, default: 2 },
        concurrency: { type: 'integer', minimum: 1, maximum: 1024, default: 16 },
        batch_size: { type: 'integer', minimum: 1, maximum: 1000, default: 32 },
        poll_interval_ms: { type: 'integer', minimum: 10, maximum: 60000, default: 500 },
        heartbeat_interval_ms: { type: 'integer', minimum: 100, maximum: 60000, default: 2000 },
        shutdown_deadline_ms: { type: 'integer', minimum: 0, maximum: 600000, default: 15000 },
        /**
         * How many times one operation may be given back to the queue, never sent (the authorization service
         * could not decide, the provider's connection failed before any byte, the database failed between claim
         * and send, its worker died before recording evidence), before it goes to review. A tool may set its own.
         */
        release_limit: { type: 'integer', minimum: 0, maximum: 1000, default: 8 },
        /** The backoff before a released operation can be claimed again: doubling from the first, capped, jittered. */
        release_backoff_initial_ms: { type: 'integer', minimum: 1, maximum: 3600000, default: 1000 },
        release_backoff_max_ms: { type: 'integer', minimum: 1, maximum: 86400000, default: 60000 },
        profile: {
          type: 'object',
          additionalProperties: false,
          required: ['path', 'signature_path', 'public_key_path'],
          properties: {
            path: { type: 'string' },
            signature_path: { type: 'string' },
            public_key_path: { type: 'string' },
          },
        },
        tls: {
          type: 'object',
          additionalProperties: false,
          required: ['ca_file', 'cert_file', 'key_file'],
          properties: { ca_file: { type: 'string' }, cert_file: { type: 'string' }, key_file: { type: 'string' } },
        },
      },
    },
    reconciler: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** pg-boss cron expression (UTC) for the fleet's reconciliation pass; minute granularity. */
        schedule: { type: 'string', minLength: 9, maxLength: 100, default: '* * * * *' },
        enabled: { type: 'boolean', default: true },
        /** Inconclusive readbacks before an `unknown` operation goes to review. */
        max_attempts: { type: 'integer', minimum: 1, maximum: 1000, default: 8 },
        backoff_initial_ms: { type: 'integer', minimum: 1, maximum: 86400000, default: 5000 },
        backoff_max_ms: { type: 'integer', minimum: 1, maximum: 604800000, default: 900000 },
        /** A claim is orphaned when its worker has not heartbeated for this long (or stopped, or is unknown). */
        orphan_after_ms: { type: 'integer', minimum: 100, maximum: 86400000, default: 10000 },
        /**
         * How often a fleet looks for orphaned claims (a worker that stopped heartbeating or exited), to
         * reconcile them at once rather than at the next scheduled pass. 0 turns the periodic check off (the
         * pass at start and the one after a worker of the fleet exits remain).
         */
        orphan_check_interval_ms: { type: 'integer', minimum: 0, maximum: 3600000, default: 1000 },
        concurrency: { type: 'integer', minimum: 1, maximum: 64, default: 4 },
        batch_size: { type: 'integer', minimum: 1, maximum: 10000, default: 500 },
      },
    },
    sandbox: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        enabled: { type: 'boolean', default: false },
        provider_port: { type: 'integer', minimum: 1, maximum: 65535, default: 7443 },
        authorizer_port: { type: 'integer', minimum: 1, maximum: 65535, default: 7444 },
      },
    },
    gate: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        /** The policy version the gate stamps on every reservation; the authorization service allows only this one. */
        policy_version: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$', default: 'policy-1' },
        /** Operations reserved straight through the ledger (trusted services, not the gate): allowed or denied at dispatch. */
        direct_reservations: { enum: ['allow', 'deny'], default: 'deny' },
        confirmation_ttl_s: { type: 'integer', minimum: 1, maximum: 86400, default: 900 },
        approval_ttl_s: { type: 'integer', minimum: 1, maximum: 604800, default: 900 },
        irreversible_approval_ttl_s: { type: 'integer', minimum: 1, maximum: 604800, default: 300 },
        /** Lifetime of one built-in authorization decision (never past the approval's own expiry). */
        decision_ttl_s: { type: 'integer', minimum: 1, maximum: 3600, default: 30 },
        tools: {
          type: 'object',
          default: {},
          propertyNames: { pattern: '^[a-z][a-z0-9_]{0,63}$' },
          additionalProperties: {
            type: 'object',
            additionalProperties: false,
            required: ['schema', 'roles'],
            properties: {
              description: { type: 'string', maxLength: 1000 },
              /** JSON Schema of the arguments, compiled with ajv in strict mode; objects must be closed. */
              schema: { type: 'object' },
              /** Roles that may call the tool. A tool nobody listed is callable by nobody. */
              roles: {
                type: 'array',
                items: { type: 'string', pattern: '^[a-z][a-z0-9_-]{0,63}$' },
                uniqueItems: true,
              },
              /** Roles that may approve its approval requests (never the requester). */
              approver_roles: {
                type: 'array',
                items: { type: 'string', pattern: '^[a-z][a-z0-9_-]{0,63}$' },
                uniqueItems: true,
                default: ['approver'],
              },
              value: {
                type: 'object',
                additionalProperties: false,
                required: ['argument'],
                properties: {
                  /** Top-level argument holding the value (a non-negative number). */
                  argument: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]{0,63}$' },
                  /** Top-level argument holding its currency, or... */
                  currency_argument: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]{0,63}$' },
                  /** ...a fixed currency. */
                  currency: { type: 'string', pattern: '^[A-Z]{3}$' },
                  /**
                   * With currency_argument: the one currency the value caps and the approval threshold are in.
                   * A call in any other currency is refused (never counted in a bucket of its own), so the
                   * argument's schema must admit this one alone (`const` or a one-item `enum`; refused at load
                   * otherwise). Required when the tool has a threshold or a max_value; a fixed `currency` is its own.
                   */
                  limits_currency: { type: 'string', pattern: '^[A-Z]{3}$' },
                },
              },
              approval: {
                type: 'object',
                additionalProperties: false,
                default: {},
                properties: {
                  mode: { enum: ['auto', 'threshold', 'always', 'confirm'], default: 'auto' },
                  /** With mode threshold: values above it need approval. */
                  threshold: { type: 'number', minimum: 0 },
                  /** Distinct approvers needed (four eyes: the requester never counts). */
                  approvers: { type: 'integer', minimum: 1, maximum: 10, default: 1 },
                  ttl_s: { type: 'integer', minimum: 1, maximum: 604800 },
                },
              },
              irreversible: { type: 'boolean', default: false },
              /** Name of a business validator the embedding code registers (sees the trusted context). */
              validator: { type: 'string', pattern: '^[A-Za-z][A-Za-z0-9_.-]{0,63}$' },
              /** Resources the call touches: their versions are bound into approvals and checked again at dispatch. */
              resources: {
                type: 'array',
                default: [],
                items: {
                  type: 'object',
                  additionalProperties: false,
                  required: ['type', 'id_argument'],
                  properties: {
                    type: { type: 'string', pattern: '^[A-Za-z][A-Za-z0-9_.-]{0,63}$' },
                    id_argument: { type: 'string', pattern: '^[A-Za-z_][A-Za-z0-9_]{0,63}$' },
                  },
                },
              },
              /** Top-level arguments written to the audit log as "[redacted]". */
              redact: {
                type: 'array',
                items: { type: 'string', minLength: 1, maxLength: 64 },
                uniqueItems: true,
                default: [],
              },
              /** The human-readable effect shown to approvers; {name} takes a top-level argument. */
              effect: { type: 'string', maxLength: 500 },
              rate: {
                type: 'object',
                additionalProperties: false,
                required: ['limit', 'window_s'],
                properties: {
                  limit: { type: 'integer', minimum: 1, maximum: 1000000 },
                  window_s: { type: 'integer', minimum: 1, maximum: 86400 },
                },
              },
              limits: {
                type: 'object',
                additionalProperties: false,
                default: {},
                properties: {
                  per_principal_day: { $ref: '#/$defs/cap' },
                  per_account_day: { $ref: '#/$defs/cap' },
                  per_conversation: { $ref: '#/$defs/cap' },
                },
              },
            },
          },
        },
      },
    },
    tools: {
      type: 'object',
      propertyNames: { pattern: '^[a-z][a-z0-9_]{0,63}$' },
      additionalProperties: {
        type: 'object',
        additionalProperties: false,
        required: ['provider_id', 'endpoint', 'allowed_tenants', 'idempotency'],
        properties: {
          provider_id: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' },
          endpoint: { type: 'string', maxLength: 2048 },
          allowed_tenants: { type: 'array', items: { type: 'string', minLength: 1 }, uniqueItems: true },
          credential_env: { type: 'string', pattern: '^[A-Z_][A-Z0-9_]*$' },
          idempotency: {
            type: 'object',
            additionalProperties: false,
            required: ['mechanism', 'name'],
            properties: {
              mechanism: { const: 'header' },
              name: { type: 'string', pattern: "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$" },
            },
          },
          readback: {
            type: 'object',
            additionalProperties: false,
            required: ['url'],
            properties: {
              /** GET, with `{effect_key}` replaced by the URL-encoded effect key. */
              url: { type: 'string', maxLength: 2048 },
            },
          },
          /** GET: `{"effects": {"<effect key>": [{...}, ...]}}`, for `actionledger verify`. */
          effects_listing_url: { type: 'string', maxLength: 2048 },
          compensation: {
            type: 'object',
            additionalProperties: false,
            required: ['tool', 'arguments'],
            properties: {
              tool: { type: 'string', pattern: '^[a-z][a-z0-9_]{0,63}$' },
              arguments: {
                type: 'object',
                propertyNames: { minLength: 1, maxLength: 128 },
                additionalProperties: {
                  oneOf: [
                    {
                      type: 'object',
                      additionalProperties: false,
                      required: ['from'],
                      properties: {
                        from: { enum: ['arguments', 'receipt', 'operation_id', 'effect_key'] },
                        /** RFC 6901 JSON pointer into the original arguments (from: arguments). */
                        pointer: { type: 'string', pattern: '^(/[^/]*)*$' },
                      },
                    },
                    { type: 'object', additionalProperties: false, required: ['value'], properties: { value: {} } },
                  ],
                },
              },
            },
          },
          definitive_failure_statuses: {
            type: 'array',
            items: { type: 'integer', minimum: 400, maximum: 499 },
            uniqueItems: true,
            default: [],
          },
          /** This tool's `dispatcher.release_limit`: never-sent releases of one operation before review. */
          release_limit: { type: 'integer', minimum: 0, maximum: 1000 },
        },
      },
    },
  },
} as const;

/**
 * The configuration as ajv leaves it after validation, defaults filled in: derived from the schema above, so
 * the two cannot drift (test/config/types.test.ts pins the derivation).
 */
export type RawConfig = FromSchema<typeof configSchema>;
/** One tool's route as written in the configuration file. */
export type RawTool = RawConfig['tools'][string];
export type RawGate = RawConfig['gate'];
export type RawGateTool = RawGate['tools'][string];
export type RawCap = NonNullable<RawGateTool['limits']['per_principal_day']>;
