/**
 * The `notifications` section: where the events go (signed webhooks, Slack), which events go to which
 * destination per tenant and tool, and how the delivery loop retries. Secrets are named by environment
 * variable, never written in the file; they are read where they are used (notifier/transport.ts).
 */
import { resolve } from 'node:path';
import type { ConfigProblems } from '../core/config-problems.js';
import { isObject, pointer } from '../core/config-problems.js';
import { destinationUrlProblem } from '../transport/index.js';

export const NOTIFICATION_EVENTS = [
  'approval.requested',
  'approval.decided',
  'approval.expired',
  'operation.review',
  'kill_switch.engaged',
  'kill_switch.lifted',
  'compensation.escalated',
] as const;
export type NotificationEventType = (typeof NOTIFICATION_EVENTS)[number];

const envName = { type: 'string', pattern: '^[A-Z_][A-Z0-9_]*$' } as const;
const tlsFiles = {
  /** PEM trust anchors for the receiver's certificate (default: Node's public roots). */
  ca_file: { type: 'string', minLength: 1 },
  /** A client certificate and key, for a receiver that requires mutual TLS. */
  cert_file: { type: 'string', minLength: 1 },
  key_file: { type: 'string', minLength: 1 },
  /**
   * Lets the destination reach loopback, private, link-local and other internal targets (a receiver on this
   * host or inside the network; the tests' local servers). Without it such a URL is refused at load and an
   * address such a name resolves to is refused at delivery (transport/network-target.ts).
   */
  allow_private_network: { type: 'boolean' },
} as const;

/** The `notifications` section's schema. */
export const notificationsSchema = {
  type: 'object',
  additionalProperties: false,
  default: {},
  properties: {
    destinations: {
      type: 'object',
      default: {},
      propertyNames: { pattern: '^[a-z0-9][a-z0-9_-]{0,62}$' },
      additionalProperties: {
        type: 'object',
        required: ['type'],
        properties: { type: { enum: ['webhook', 'slack'] } },
        oneOf: [
          {
            type: 'object',
            additionalProperties: false,
            required: ['type', 'url', 'secret_envs'],
            properties: {
              type: { const: 'webhook' },
              url: { type: 'string', pattern: '^https://' },
              /** The first signs; every one listed signs during a rotation (receivers accept any). */
              secret_envs: { type: 'array', items: envName, minItems: 1, maxItems: 4, uniqueItems: true },
              ...tlsFiles,
            },
          },
          {
            type: 'object',
            additionalProperties: false,
            required: ['type', 'channel', 'bot_token_env', 'signing_secret_env', 'team_id'],
            properties: {
              type: { const: 'slack' },
              channel: { type: 'string', minLength: 1, maxLength: 80 },
              team_id: { type: 'string', minLength: 1, maxLength: 40 },
              bot_token_env: envName,
              signing_secret_env: envName,
              /** Default https://slack.com/api; tests point it at a local server. */
              api_base_url: { type: 'string', pattern: '^https://' },
              ...tlsFiles,
            },
          },
        ],
      },
    },
    routes: {
      type: 'array',
      default: [],
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['destinations'],
        properties: {
          destinations: { type: 'array', items: { type: 'string' }, minItems: 1, uniqueItems: true },
          events: { type: 'array', items: { enum: NOTIFICATION_EVENTS }, minItems: 1, uniqueItems: true },
          tenants: { type: 'array', items: { type: 'string', minLength: 1 }, minItems: 1, uniqueItems: true },
          tools: { type: 'array', items: { type: 'string', minLength: 1 }, minItems: 1, uniqueItems: true },
        },
      },
    },
    delivery: {
      type: 'object',
      additionalProperties: false,
      default: {},
      properties: {
        poll_interval_ms: { type: 'integer', minimum: 10, maximum: 60000, default: 500 },
        batch_size: { type: 'integer', minimum: 1, maximum: 500, default: 16 },
        max_attempts: { type: 'integer', minimum: 1, maximum: 100, default: 15 },
        backoff_initial_ms: { type: 'integer', minimum: 10, maximum: 3600000, default: 1000 },
        backoff_max_ms: { type: 'integer', minimum: 10, maximum: 86400000, default: 3600000 },
        timeout_ms: { type: 'integer', minimum: 100, maximum: 120000, default: 10000 },
        /** How long a claimed delivery is a worker's; must exceed timeout_ms. A dead worker's ends with it. */
        lease_ms: { type: 'integer', minimum: 200, maximum: 3600000, default: 30000 },
        max_response_bytes: { type: 'integer', minimum: 256, maximum: 1048576, default: 65536 },
        /** Events, and their deliveries, are removed this many days after they were written once none is pending. */
        retention_days: { type: 'integer', minimum: 1, maximum: 3650, default: 7 },
      },
    },
  },
} as const;

interface TlsFiles {
  readonly caFile: string | null;
  readonly certFile: string | null;
  readonly keyFile: string | null;
  /** `allow_private_network`: internal targets allowed, at load and at delivery. */
  readonly allowPrivateNetwork: boolean;
}
export interface WebhookDestination extends TlsFiles {
  readonly type: 'webhook';
  readonly name: string;
  readonly url: string;
  readonly secretEnvs: readonly string[];
}
export interface SlackDestination extends TlsFiles {
  readonly type: 'slack';
  readonly name: string;
  readonly channel: string;
  readonly teamId: string;
  readonly botTokenEnv: string;
  readonly signingSecretEnv: string;
  /** No trailing slash. */
  readonly apiBaseUrl: string;
}
export type NotificationDestination = WebhookDestination | SlackDestination;

export interface NotificationRoute {
  readonly destinations: readonly string[];
  /** Null: every event, tenant or tool. */
  readonly events: ReadonlySet<NotificationEventType> | null;
  readonly tenants: ReadonlySet<string> | null;
  readonly tools: ReadonlySet<string> | null;
}

export interface NotificationsConfig {
  readonly destinations: ReadonlyMap<string, NotificationDestination>;
  readonly routes: readonly NotificationRoute[];
  readonly delivery: {
    readonly pollIntervalMs: number;
    readonly batchSize: number;
    readonly maxAttempts: number;
    readonly backoffInitialMs: number;
    readonly backoffMaxMs: number;
    readonly timeoutMs: number;
    readonly leaseMs: number;
    readonly maxResponseBytes: number;
    readonly retentionDays: number;
  };
}

interface RawTls {
  ca_file?: string;
  cert_file?: string;
  key_file?: string;
  allow_private_network?: boolean;
}
type RawDestination =
  | ({ type: 'webhook'; url: string; secret_envs: string[] } & RawTls)
  | ({
      type: 'slack';
      channel: string;
      team_id: string;
      bot_token_env: string;
      signing_secret_env: string;
      api_base_url?: string;
    } & RawTls);
export interface RawNotifications {
  destinations?: Record<string, RawDestination>;
  routes?: { destinations: string[]; events?: NotificationEventType[]; tenants?: string[]; tools?: string[] }[];
  delivery?: {
    poll_interval_ms?: number;
    batch_size?: number;
    max_attempts?: number;
    backoff_initial_ms?: number;
    backoff_max_ms?: number;
    timeout_ms?: number;
    lease_ms?: number;
    max_response_bytes?: number;
    retention_days?: number;
  };
}

const set = <T>(a: readonly T[] | undefined): ReadonlySet<T> | null => (a === undefined ? null : new Set(a));

/** Compiles the section (already schema-checked, defaults filled): cross-field problems go to `problems`. */
export function compileNotifications(
  raw: RawNotifications,
  toolNames: ReadonlySet<string>,
  cwd: string,
  problems: ConfigProblems,
): NotificationsConfig {
  const destinations = new Map<string, NotificationDestination>();
  const declared = isObject(raw.destinations) ? raw.destinations : {};
  {
    for (const [name, d] of Object.entries(declared)) {
      const at = pointer('notifications', 'destinations', name);
      if (problems.malformed(at)) continue;
      if ((d.cert_file === undefined) !== (d.key_file === undefined))
        problems.add(at, 'cert_file and key_file go together (a client certificate needs its key)');
      const tls: TlsFiles = {
        caFile: d.ca_file === undefined ? null : resolve(cwd, d.ca_file),
        certFile: d.cert_file === undefined ? null : resolve(cwd, d.cert_file),
        keyFile: d.key_file === undefined ? null : resolve(cwd, d.key_file),
        allowPrivateNetwork: d.allow_private_network === true,
      };
      const target = d.type === 'webhook' ? (['url', d.url] as const) : (['api_base_url', d.api_base_url] as const);
      if (target[1] !== undefined) {
        const problem = destinationUrlProblem(target[1], tls.allowPrivateNetwork);
        if (problem !== null)
          problems.add(
            pointer('notifications', 'destinations', name, target[0]),
            problem.message,
            problem.class === 'userinfo' ? {} : { got: target[1] },
          );
      }
      destinations.set(
        name,
        Object.freeze(
          d.type === 'webhook'
            ? { type: 'webhook' as const, name, url: d.url, secretEnvs: Object.freeze([...d.secret_envs]), ...tls }
            : {
                type: 'slack' as const,
                name,
                channel: d.channel,
                teamId: d.team_id,
                botTokenEnv: d.bot_token_env,
                signingSecretEnv: d.signing_secret_env,
                apiBaseUrl: (d.api_base_url ?? 'https://slack.com/api').replace(/\/+$/, ''),
                ...tls,
              },
        ),
      );
    }
  }
  const routes: NotificationRoute[] = [];
  if (Array.isArray(raw.routes)) {
    raw.routes.forEach((r, i) => {
      if (problems.malformed(pointer('notifications', 'routes', i))) return;
      for (const d of r.destinations)
        if (!Object.hasOwn(declared, d))
          problems.add(pointer('notifications', 'routes', i, 'destinations'), `names no declared destination`, {
            got: d,
            allowed: Object.keys(declared),
          });
      for (const t of r.tools ?? [])
        if (!toolNames.has(t))
          problems.add(pointer('notifications', 'routes', i, 'tools'), 'names no configured tool', { got: t });
      routes.push(
        Object.freeze({
          destinations: Object.freeze([...r.destinations]),
          events: set(r.events),
          tenants: set(r.tenants),
          tools: set(r.tools),
        }),
      );
    });
  }
  const delivery = compileDelivery(raw.delivery ?? {}, problems);
  return Object.freeze({ destinations, routes: Object.freeze(routes), delivery });
}

function compileDelivery(
  d: NonNullable<RawNotifications['delivery']>,
  problems: ConfigProblems,
): NotificationsConfig['delivery'] {
  const delivery = Object.freeze({
    pollIntervalMs: d.poll_interval_ms ?? 500,
    batchSize: d.batch_size ?? 16,
    maxAttempts: d.max_attempts ?? 15,
    backoffInitialMs: d.backoff_initial_ms ?? 1000,
    backoffMaxMs: d.backoff_max_ms ?? 3600000,
    timeoutMs: d.timeout_ms ?? 10000,
    leaseMs: d.lease_ms ?? 30000,
    maxResponseBytes: d.max_response_bytes ?? 65536,
    retentionDays: d.retention_days ?? 7,
  });
  if (!problems.malformed('/notifications/delivery')) {
    if (delivery.leaseMs <= delivery.timeoutMs)
      problems.add(
        '/notifications/delivery/lease_ms',
        'must exceed timeout_ms (a live worker must never lose a delivery it is still sending)',
      );
    if (delivery.backoffMaxMs < delivery.backoffInitialMs)
      problems.add('/notifications/delivery/backoff_max_ms', 'must be at least backoff_initial_ms');
  }
  return delivery;
}
