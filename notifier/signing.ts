/**
 * The two signature schemes notifications use.
 *
 * Outgoing webhooks follow the Standard Webhooks specification: the signed content is
 * `<webhook-id>.<webhook-timestamp>.<body>`, HMAC-SHA256 with the secret's bytes (a `whsec_` prefix followed by
 * base64), sent as `v1,<base64 signature>`; during a rotation every configured secret signs and the
 * signatures are joined by spaces, so a receiver holding either secret accepts the message. The test suite
 * checks these headers with the reference `standardwebhooks` library.
 *
 * Incoming Slack requests carry `X-Slack-Signature: v0=<hex>` over `v0:<X-Slack-Request-Timestamp>:<raw body>`,
 * HMAC-SHA256 with the app's signing secret; a timestamp more than five minutes from this host's clock is
 * refused (a captured request cannot be replayed later).
 *
 * What this does not prove: a valid Standard Webhooks signature says the sender held the secret, not that the
 * message is new (receivers drop duplicates by webhook-id and stale messages by timestamp); a valid Slack
 * signature within the window can be replayed inside that window (the gate refuses a second vote).
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { ActionLedgerError } from '../core/errors.js';
import { Secret } from '../core/secret.js';

/** Smallest and largest webhook secret, in bytes (the specification's range). */
export const WEBHOOK_SECRET_MIN_BYTES = 24;
export const WEBHOOK_SECRET_MAX_BYTES = 64;
/** Slack's replay window for interactivity requests. */
export const SLACK_WINDOW_S = 300;

/**
 * Decodes a webhook secret as held in its environment variable (`whsec_<base64>`, the prefix optional).
 * Throws `secret_missing` when it is unset, and `config_invalid` when it is not base64 of 24 to 64 bytes.
 */
export function webhookSecret(name: string, value: string | undefined): Secret {
  if (value === undefined || value === '')
    throw new ActionLedgerError('secret_missing', `webhook secret: environment variable ${name} is not set`);
  const b64 = value.startsWith('whsec_') ? value.slice('whsec_'.length) : value;
  const bytes = /^[A-Za-z0-9+/]+={0,2}$/.test(b64) ? Buffer.from(b64, 'base64') : Buffer.alloc(0);
  if (bytes.byteLength < WEBHOOK_SECRET_MIN_BYTES || bytes.byteLength > WEBHOOK_SECRET_MAX_BYTES)
    throw new ActionLedgerError(
      'config_invalid',
      `webhook secret ${name} must be whsec_ followed by base64 of ${WEBHOOK_SECRET_MIN_BYTES} to ${WEBHOOK_SECRET_MAX_BYTES} bytes`,
    );
  return new Secret(bytes);
}

/** The three Standard Webhooks headers for `body` (sent byte for byte), signed by every secret given. */
export function standardWebhookHeaders(
  id: string,
  timestampS: number,
  body: string,
  secrets: readonly Secret[],
): { 'webhook-id': string; 'webhook-timestamp': string; 'webhook-signature': string } {
  const content = `${id}.${timestampS}.${body}`;
  const signature = secrets
    .map((s) => `v1,${createHmac('sha256', s.reveal()).update(content, 'utf8').digest('base64')}`)
    .join(' ');
  return { 'webhook-id': id, 'webhook-timestamp': String(timestampS), 'webhook-signature': signature };
}

/** Slack's `X-Slack-Signature` value for a request (what Slack sends; tests use it to play Slack). */
export function slackSignature(signingSecret: Secret, timestamp: string, rawBody: Buffer | string): string {
  const mac = createHmac('sha256', signingSecret.reveal());
  mac.update(`v0:${timestamp}:`, 'utf8');
  mac.update(rawBody);
  return `v0=${mac.digest('hex')}`;
}

export type SlackVerdict =
  { ok: true } | { ok: false; reason: 'signature_missing' | 'stale_timestamp' | 'bad_signature' };

/**
 * Checks a Slack request's signature and timestamp: the timestamp must be whole seconds within
 * {@link SLACK_WINDOW_S} of `nowS` (either side), the signature an exact, constant-time match.
 */
export function verifySlackRequest(
  signingSecret: Secret,
  headers: { signature: string | undefined; timestamp: string | undefined },
  rawBody: Buffer,
  nowS: number,
): SlackVerdict {
  const { signature, timestamp } = headers;
  if (signature === undefined || timestamp === undefined) return { ok: false, reason: 'signature_missing' };
  if (!/^[0-9]{1,12}$/.test(timestamp) || Math.abs(nowS - Number(timestamp)) > SLACK_WINDOW_S)
    return { ok: false, reason: 'stale_timestamp' };
  const expected = Buffer.from(slackSignature(signingSecret, timestamp, rawBody), 'utf8');
  const given = Buffer.from(signature, 'utf8');
  if (given.byteLength !== expected.byteLength || !timingSafeEqual(given, expected))
    return { ok: false, reason: 'bad_signature' };
  return { ok: true };
}
