/**
 * The fresh authorization decision's wire format, one definition for both sides: the dispatcher asks (POST the
 * binding fields to the profile's authorization URL), the gate's built-in authorization service and the sandbox
 * authorizer answer.
 *
 * A request is a JSON object with exactly the binding fields, each a non-empty string. An answer is 200 with
 * every binding field echoed unchanged, `decision` (`allow` or `deny`) and `authorized_at` / `expires_at` as
 * ISO 8601 UTC; any other status is no decision. The asking side accepts only an `allow` with exactly those
 * fields, every binding echoed, and times inside the profile's windows.
 *
 * What a checked decision does not prove: that the service applied the right policy. It proves the decision was
 * made for exactly this operation, arguments, approval and policy version, recently.
 */
import { ActionLedgerError } from '../core/errors.js';
import { canonicalJson, sha256Hex, type JsonObject } from '../core/json.js';
import type { DispatchProfile } from './profile.js';

/** The path both answering services serve the decision on. */
export const AUTHORIZE_PATH = '/v1/authorize';

/** What a decision is bound to: the operation, its key, who asked for it, the exact arguments, approval and policy. */
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
/** What an answer adds to the echoed binding. */
export const DECISION_FIELDS = ['decision', 'authorized_at', 'expires_at'] as const;

export type BindingField = (typeof BINDING_FIELDS)[number];
export type AuthorizationRequest = Record<BindingField, string>;
export type Verdict = 'allow' | 'deny';

/** A checked `allow`. */
export interface AuthorizationDecision {
  authorizedAt: Date;
  expiresAt: Date;
  /** sha256 of the canonical decision object: the evidence, without storing the decision itself. */
  decisionSha256: string;
}

/** The ledger columns a binding is made of (an operations row); the dispatcher and the gate map them alike. */
export interface LedgerBinding {
  readonly operation_id: string;
  readonly effect_key: string;
  readonly principal_id: string;
  readonly task_id: string;
  readonly workflow_step_id: string;
  readonly tool_name: string;
  readonly tenant_id: string;
  readonly provider_id: string;
  readonly canonical_args_sha256: string;
  readonly current_approval_id: string;
  readonly current_policy_version: string;
}

const ISO_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$/;

export function authorizationRequest(op: LedgerBinding): AuthorizationRequest {
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

/** A received request as a typed object, or null unless it has exactly the binding fields, each a non-empty string. */
export function parseAuthorizationRequest(value: JsonObject): AuthorizationRequest | null {
  if (Object.keys(value).length !== BINDING_FIELDS.length) return null;
  const out: Partial<AuthorizationRequest> = {};
  for (const field of BINDING_FIELDS) {
    const v = value[field];
    if (typeof v !== 'string' || v === '') return null;
    out[field] = v;
  }
  return out as AuthorizationRequest;
}

/** The answer to `request`: the binding echoed, the verdict and its window (times in ms since the epoch). */
export function decisionBody(
  request: AuthorizationRequest,
  decision: Verdict,
  authorizedAtMs: number,
  expiresAtMs: number,
): Record<BindingField | (typeof DECISION_FIELDS)[number], string> {
  return {
    ...request,
    decision,
    authorized_at: new Date(authorizedAtMs).toISOString(),
    expires_at: new Date(expiresAtMs).toISOString(),
  };
}

function fail(
  code: 'authorization_denied' | 'authorization_invalid' | 'authorization_stale',
  message: string,
  details?: Record<string, unknown>,
): ActionLedgerError {
  return new ActionLedgerError(code, message, details === undefined ? {} : { details });
}

/**
 * Validates an answer against its request: exact field set, `allow`, every binding echoed, times inside the
 * windows by `now` (the asking worker's clock; the database clock judges again when the evidence is recorded).
 */
export function checkDecision(
  body: JsonObject,
  request: AuthorizationRequest,
  profile: DispatchProfile,
  now: Date,
): AuthorizationDecision {
  const expected = new Set<string>([...BINDING_FIELDS, ...DECISION_FIELDS]);
  const missing = [...expected].filter((k) => !(k in body));
  const extra = Object.keys(body).filter((k) => !expected.has(k));
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
  return { authorizedAt, expiresAt, decisionSha256: sha256Hex(canonicalJson(body)) };
}

/** The profile's windows, shared by the worker-clock check above and the database-clock check at evidence time. */
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
