/**
 * The outbound side of each destination: one undici agent per destination built by the same client the
 * dispatcher uses for providers (core/http-client.ts: TLS verification always on, optional client
 * certificate, no proxy from the environment, never a redirect, bounded time and bytes), and the secrets
 * read from their environment variables once, at start.
 */
import { readFileSync } from 'node:fs';
import type { Agent } from 'undici';
import type { NotificationDestination, NotificationsConfig } from '../core/config-notify.js';
import { ActionLedgerError } from '../core/errors.js';
import { createMtlsAgent, postJson, type HttpOutcome } from '../core/http-client.js';
import type { JsonObject } from '../core/json.js';
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
 */
export function checkDestinations(config: NotificationsConfig, env: NodeJS.ProcessEnv): void {
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

/**
 * A client per configured destination. Throws `secret_missing` (an environment variable is unset) or
 * `config_invalid` (a malformed webhook secret, an unreadable certificate file): a process refuses to start
 * rather than fail its first delivery.
 */
export function destinationClients(
  config: NotificationsConfig,
  env: NodeJS.ProcessEnv,
): ReadonlyMap<string, DestinationClient> {
  const out = new Map<string, DestinationClient>();
  for (const d of config.destinations.values()) {
    const secrets = secretsOf(d, env);
    const ca = read(d.caFile, 'ca_file');
    const cert = read(d.certFile, 'cert_file');
    const key = read(d.keyFile, 'key_file');
    const agent = createMtlsAgent({
      ...(ca === undefined ? {} : { ca }),
      ...(cert === undefined || key === undefined ? {} : { cert, key: new Secret(Buffer.from(key)) }),
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
    headers: {
      'content-type': 'application/json; charset=utf-8',
      authorization: `Bearer ${client.slack.botToken.reveal().toString('utf8')}`,
    },
    timeoutMs: limits.timeoutMs,
    maxBytes: limits.maxBytes,
  });
  if (out.kind !== 'response') return { ok: false, retry: true, error: `${out.kind}:${out.code}` };
  if (out.status === 429 || out.status >= 500) return { ok: false, retry: true, error: `http_${out.status}` };
  if (out.status !== 200 || out.json === null) return { ok: false, retry: false, error: `http_${out.status}` };
  if (out.json.ok !== true) {
    const error = typeof out.json.error === 'string' ? out.json.error.slice(0, 100) : 'not_ok';
    return { ok: false, retry: error === 'ratelimited' || error === 'internal_error', error };
  }
  return { ok: true, json: out.json };
}
