/**
 * The fresh authorization decision: POST the binding fields to the profile's authorization
 * URL over mTLS, read at most the profile's byte cap, parse strictly, and accept only an `allow` that echoes
 * every binding field exactly and carries authorized_at / expires_at inside the profile's windows.
 *
 * What this does not prove: that the authorization service applied the right policy. It proves the decision
 * was made for exactly this operation, arguments, approval and policy version, recently, by a server holding
 * a certificate from the configured CA.
 */
import type { Agent } from 'undici';
import { ActionLedgerError } from '../core/errors.js';
import { canonicalJson, sha256Hex, type JsonObject } from '../core/json.js';
import { postJson } from '../core/http-client.js';
import type { DispatchProfile } from '../core/profile.js';
import type { ClaimedOperation } from './types.js';

export const BINDING_FIELDS = [
  'operation_id',
  'effect_key',
  'principal_id',
  'task_id',
  'workflow_step_id',
  'tool_name',
  'tenant_id',
  'provider_id',
  'args_sha256',
  'approval_id',
  'policy_version',
] as const;
const DECISION_FIELDS = ['decision', 'authorized_at', 'expires_at'] as const;
const ISO_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$/;

export type AuthorizationRequest = Record<(typeof BINDING_FIELDS)[number], string>;

export interface AuthorizationDecision {
  authorizedAt: Date;
  expiresAt: Date;
  /** sha256 of the canonical decision object: the evidence, without storing the decision itself. */
  decisionSha256: string;
}

/** The ledger columns a binding is made of; both the dispatcher and the built-in authorization service map them the same way. */
export type BindingColumns = Pick<
  ClaimedOperation,
  | 'operation_id'
  | 'effect_key'
  | 'principal_id'
  | 'task_id'
  | 'workflow_step_id'
  | 'tool_name'
  | 'tenant_id'
  | 'provider_id'
  | 'canonical_args_sha256'
  | 'current_approval_id'
  | 'current_policy_version'
>;

export function authorizationRequest(op: BindingColumns): AuthorizationRequest {
  return {
    operation_id: op.operation_id,
    effect_key: op.effect_key,
    principal_id: op.principal_id,
    task_id: op.task_id,
    workflow_step_id: op.workflow_step_id,
    tool_name: op.tool_name,
    tenant_id: op.tenant_id,
    provider_id: op.provider_id,
    args_sha256: op.canonical_args_sha256,
    approval_id: op.current_approval_id,
    policy_version: op.current_policy_version,
  };
}

function fail(
  code: 'authorization_denied' | 'authorization_invalid' | 'authorization_unavailable' | 'authorization_stale',
  message: string,
  details?: Record<string, unknown>,
): ActionLedgerError {
  return new ActionLedgerError(code, message, details === undefined ? {} : { details });
}

/** Asks for a decision; throws `authorization_*` for every way it can fail (the provider is never called then). */
export async function fetchAuthorization(
  agent: Agent,
  profile: DispatchProfile,
  request: AuthorizationRequest,
  signal?: AbortSignal,
): Promise<AuthorizationDecision> {
  const outcome = await postJson(agent, profile.authorizationUrl, {
    body: JSON.stringify(request),
    timeoutMs: profile.authorizationHttpTimeoutMs,
    maxBytes: profile.authorizationResponseMaxBytes,
    ...(signal === undefined ? {} : { signal }),
  });
  if (outcome.kind === 'not_sent')
    throw fail('authorization_unavailable', `authorization service unreachable (${outcome.code})`, {
      transport: outcome.code,
    });
  if (outcome.kind === 'unknown') {
    const code =
      outcome.code === 'oversized' || outcome.code === 'malformed_json' || outcome.code === 'redirect'
        ? 'authorization_invalid'
        : 'authorization_unavailable';
    throw fail(code, `authorization response unusable (${outcome.code})`, { transport: outcome.code });
  }
  if (outcome.status !== 200) {
    // No decision. Its code, when the answer names one (the built-in service's `tool_disabled` for a kill switch,
    // `storage_full`, ...), is kept for the log and the release's history; it never turns into a decision.
    const named = outcome.json?.error;
    throw fail('authorization_unavailable', `authorization service answered ${outcome.status}`, {
      status: outcome.status,
      ...(typeof named === 'string' && /^[a-z][a-z0-9_]{0,63}$/.test(named) ? { error: named } : {}),
    });
  }
  if (outcome.json === null) throw fail('authorization_invalid', 'authorization response has no body');
  return checkDecision(outcome.json, request, profile, new Date());
}

/**
 * Validates a decision against its request: exact field set, `allow`, every binding echoed, times inside the
 * windows by `now` (the worker's clock; the database clock judges again when the evidence is recorded).
 */
export function checkDecision(
  body: JsonObject,
  request: AuthorizationRequest,
  profile: DispatchProfile,
  now: Date,
): AuthorizationDecision {
  const expected = new Set<string>([...BINDING_FIELDS, ...DECISION_FIELDS]);
  const keys = Object.keys(body);
  const missing = [...expected].filter((k) => !(k in body));
  const extra = keys.filter((k) => !expected.has(k));
  if (missing.length > 0 || extra.length > 0)
    throw fail('authorization_invalid', 'decision has the wrong field set', { missing, extra });
  if (body.decision !== 'allow') {
    if (body.decision === 'deny') throw fail('authorization_denied', 'authorization service denied this operation');
    throw fail('authorization_invalid', 'decision is neither allow nor deny');
  }
  const mismatched = BINDING_FIELDS.filter((f) => body[f] !== request[f]);
  if (mismatched.length > 0) throw fail('authorization_invalid', 'decision does not echo the request', { mismatched });
  const authorizedAt = parseTime(body.authorized_at);
  const expiresAt = parseTime(body.expires_at);
  if (authorizedAt === null || expiresAt === null)
    throw fail('authorization_invalid', 'decision times are not ISO 8601 UTC');
  checkWindows(authorizedAt, expiresAt, now, profile);
  return { authorizedAt, expiresAt, decisionSha256: sha256Canonical(body) };
}

/** The windows, shared by the worker-clock check here and the database-clock check at evidence time. */
export function checkWindows(authorizedAt: Date, expiresAt: Date, now: Date, profile: DispatchProfile): void {
  const skew = profile.maximumClockSkewMs;
  const a = authorizedAt.getTime();
  const e = expiresAt.getTime();
  const n = now.getTime();
  if (e <= a) throw fail('authorization_invalid', 'decision expires before it was authorized');
  if (e - a > profile.maximumAuthorizationTtlMs)
    throw fail('authorization_stale', 'decision TTL exceeds the profile maximum', { ttl_ms: e - a });
  if (a > n + skew) throw fail('authorization_stale', 'decision is dated in the future beyond the skew allowance');
  if (n - a > profile.maximumAuthorizationAgeMs + skew)
    throw fail('authorization_stale', 'decision is older than the profile allows', { age_ms: n - a });
  if (e <= n - skew) throw fail('authorization_stale', 'decision has expired');
}

function parseTime(v: unknown): Date | null {
  if (typeof v !== 'string' || !ISO_UTC.test(v)) return null;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? null : d;
}

function sha256Canonical(body: JsonObject): string {
  return sha256Hex(canonicalJson(body));
}
