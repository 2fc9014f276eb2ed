/**
 * The outbound side of each destination: one undici agent per destination built by the same client the
 * dispatcher uses for providers (transport/http-client.ts: TLS verification always on, optional client
 * certificate, no proxy from the environment, never a redirect, bounded time and bytes), and the secrets
 * read from their environment variables once, at start.
 *
 * A destination without `allow_private_network` connects through transport/network-target.ts's `guardedLookup`:
 * a name that resolves to a loopback, private, link-local or other internal address fails its attempt before
 * any byte is sent, reported as `not_sent:private_network:<class>` (see {@link outcomeError}).
 */
import { readFileSync } from 'node:fs';
import type { LookupFunction } from 'node:net';
import type { Agent } from 'undici';
import type { NotificationDestination, NotificationsConfig } from '../config/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { createMtlsAgent, postJson, type HttpOutcome } from '../transport/index.js';
import type { JsonObject } from '../core/json.js';
import type { Logger } from '../core/log.js';
import { guardedLookup, privateNetworkRefusal } from '../transport/index.js';
import { Secret } from '../core/secret.js';
import { webhookSecret } from './signing.js';

export interface DestinationClient {
  readonly destination: NotificationDestination;
  readonly agent: Agent;
  /** Webhook: the signing secrets (the first is the newest). Slack: none. */
  readonly webhookSecrets: readonly Secret[];
  /** Slack: the bot token and the signing secret. */
  readonly slack: { readonly botToken: Secret; readonly signingSecret: Secret } | null;
}

function read(path: string | null, what: string): string | undefined {
  if (path === null) return undefined;
  try {
    return readFileSync(path, 'utf8');
  } catch (cause) {
    throw new ActionLedgerError('config_invalid', `notification ${what} ${path} cannot be read`, { cause });
  }
}

function envSecret(env: NodeJS.ProcessEnv, name: string, what: string): Secret {
  const v = env[name];
  if (v === undefined || v === '')
    throw new ActionLedgerError('secret_missing', `${what}: environment variable ${name} is not set`);
  return new Secret(Buffer.from(v, 'utf8'));
}

type Secrets = Pick<DestinationClient, 'webhookSecrets' | 'slack'>;

/** A destination's secrets from the environment. Throws `secret_missing` or `config_invalid`. */
function secretsOf(d: NotificationDestination, env: NodeJS.ProcessEnv): Secrets {
  return {
    webhookSecrets: d.type === 'webhook' ? d.secretEnvs.map((n) => webhookSecret(n, env[n])) : [],
    slack:
      d.type === 'slack'
        ? {
            botToken: envSecret(env, d.botTokenEnv, `Slack bot token of ${d.name}`),
            signingSecret: envSecret(env, d.signingSecretEnv, `Slack signing secret of ${d.name}`),
          }
        : null,
  };
}

/**
 * Checks what every destination needs before anything starts (the service, ahead of forking its workers):
 * each secret set and well formed, each certificate file readable. Throws `secret_missing` or `config_invalid`.
 * With `log`, says once (warn) of each destination that may reach internal targets ({@link warnPrivateNetwork}).
 */
export function checkDestinations(config: NotificationsConfig, env: NodeJS.ProcessEnv, log?: Logger): void {
  if (log !== undefined) warnPrivateNetwork(config, log);
  for (const d of config.destinations.values()) {
    secretsOf(d, env);
    for (const [path, what] of [
      [d.caFile, 'ca_file'],
      [d.certFile, 'cert_file'],
      [d.keyFile, 'key_file'],
    ] as const)
      read(path, what);
  }
}

/** One warn line per destination with `allow_private_network: true`: its targets are not checked. */
export function warnPrivateNetwork(config: NotificationsConfig, log: Logger): void {
  for (const d of config.destinations.values())
    if (d.allowPrivateNetwork)
      log.warn(
        { code: 'private_network_allowed', destination: d.name, target: d.type === 'webhook' ? d.url : d.apiBaseUrl },
        `notification destination ${d.name} sets allow_private_network: it may reach loopback, private and ` +
          'link-local addresses (its URL and what its name resolves to are not checked)',
      );
}

export interface ClientOptions {
  /**
   * Resolves destination host names instead of the system resolver (`dns.lookup`). For tests, to give a
   * test-only name an address; the address check applies to what it returns, as to the system's answers.
   */
  lookup?: LookupFunction;
}

/**
 * A client per configured destination. Throws `secret_missing` (an environment variable is unset) or
 * `config_invalid` (a malformed webhook secret, an unreadable certificate file): a process refuses to start
 * rather than fail its first delivery.
 */
export function destinationClients(
  config: NotificationsConfig,
  env: NodeJS.ProcessEnv,
  options: ClientOptions = {},
): ReadonlyMap<string, DestinationClient> {
  const out = new Map<string, DestinationClient>();
  for (const d of config.destinations.values()) {
    const secrets = secretsOf(d, env);
    const ca = read(d.caFile, 'ca_file');
    const cert = read(d.certFile, 'cert_file');
    const key = read(d.keyFile, 'key_file');
    // Without allow_private_network every connection's addresses are checked where they are resolved.
    const lookup = d.allowPrivateNetwork ? options.lookup : guardedLookup(options.lookup);
    const agent = createMtlsAgent({
      ...(ca === undefined ? {} : { ca }),
      ...(cert === undefined || key === undefined ? {} : { cert, key: new Secret(Buffer.from(key)) }),
      ...(lookup === undefined ? {} : { lookup }),
      connectTimeoutMs: Math.min(5000, config.delivery.timeoutMs),
    });
    out.set(d.name, { destination: d, agent, ...secrets });
  }
  return out;
}

/** Closes every agent. */
export async function closeClients(clients: ReadonlyMap<string, DestinationClient>): Promise<void> {
  await Promise.all([...clients.values()].map((c) => c.agent.close().catch(() => undefined)));
}

/**
 * The stable reason an attempt that got no usable answer failed, for the delivery record: `not_sent:<code>`
 * or `unknown:<code>` (transport/http-client.ts), with a non-2xx status when one arrived, and
 * `not_sent:private_network:<class>` when the destination's name resolved to an internal address
 * (`loopback`, `private`, `link_local`...).
 */
export function outcomeError(out: Exclude<HttpOutcome, { kind: 'response' }>): string {
  const refused = out.kind === 'not_sent' ? privateNetworkRefusal(out.cause) : null;
  if (refused !== null) return `not_sent:private_network:${refused}`;
  const status = out.kind === 'unknown' ? out.status : undefined;
  return `${out.kind}:${out.code}${status === undefined ? '' : `:${status}`}`;
}

export type SlackCall = { ok: true; json: JsonObject } | { ok: false; retry: boolean; error: string };

/**
 * Calls one Slack Web API method (`chat.postMessage`, `chat.update`, `chat.postEphemeral`) with the bot token,
 * JSON body. Slack answers 200 with `ok: false` and an `error` for refusals; a 429 or 5xx, a timeout or a
 * reset are worth another attempt, any other refusal is not.
 */
export async function slackCall(
  client: DestinationClient,
  method: string,
  body: JsonObject,
  limits: { timeoutMs: number; maxBytes: number },
): Promise<SlackCall> {
  const d = client.destination;
  if (d.type !== 'slack' || client.slack === null) return { ok: false, retry: false, error: 'not_slack' };
  const out: HttpOutcome = await postJson(client.agent, `${d.apiBaseUrl}/${method}`, {
    body: JSON.stringify(body),
    spanName: 'slack',
    urlTemplate: `${d.apiBaseUrl}/${method}`,
    headers: {
      'content-type': 'application/json; charset=utf-8',
      authorization: `Bearer ${client.slack.botToken.reveal().toString('utf8')}`,
    },
    timeoutMs: limits.timeoutMs,
    maxBytes: limits.maxBytes,
  });
  if (out.kind !== 'response') {
    const refused = out.kind === 'not_sent' ? privateNetworkRefusal(out.cause) : null;
    return { ok: false, retry: true, error: refused === null ? `${out.kind}:${out.code}` : outcomeError(out) };
  }
  if (out.status === 429 || out.status >= 500) return { ok: false, retry: true, error: `http_${out.status}` };
  if (out.status !== 200 || out.json === null) return { ok: false, retry: false, error: `http_${out.status}` };
  if (out.json.ok !== true) {
    const error = typeof out.json.error === 'string' ? out.json.error.slice(0, 100) : 'not_ok';
    return { ok: false, retry: error === 'ratelimited' || error === 'internal_error', error };
  }
  return { ok: true, json: out.json };
}
