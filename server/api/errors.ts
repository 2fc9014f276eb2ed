/**
 * One structured body for every HTTP error, `{"ok":false,"error":CODE,"message":...,"details"?}`, and the
 * status each code answers with. No stack, SQL text or server message ever reaches a response: a database
 * failure is its code (the SQLSTATE stays in the log), anything unexpected is `internal`.
 */
import { ActionLedgerError, ERROR_CODES, type ErrorCode, type Refusal } from '../../core/errors.js';
import type { GateResult } from '../../gate/index.js';

const STATUS: Partial<Record<ErrorCode, number>> = {
  invalid_json: 400,
  unauthenticated: 401,
  permission_denied: 403,
  self_approval_forbidden: 403,
  csrf_token_invalid: 403,
  // Console single sign-on: the provider's answer did not hold (401), or it holds and maps to no role (403).
  oidc_sign_in_failed: 401,
  oidc_not_mapped: 403,
  not_found: 404,
  // Misdirected Request: the tenant's calls belong to another cluster's service.
  tenant_wrong_cluster: 421,
  proposal_not_found: 404,
  operation_conflict: 409,
  invalid_state_transition: 409,
  retry_not_safe: 409,
  invalid_review: 409,
  approval_hash_mismatch: 409,
  approval_expired: 409,
  reapproval_required: 409,
  proposal_expired: 409,
  body_too_large: 413,
  unsupported_media_type: 415,
  expectation_failed: 417,
  rate_limited: 429,
  // A tool needs a business validator or resolver this process does not run: retrying will not help.
  config_invalid: 501,
  internal: 500,
  database_error: 500,
  illegal_transition: 500,
};

/** The HTTP status of a coded error: its own, else by its group (a caller's refusal 422, a retryable 503). */
export function httpStatus(code: ErrorCode): number {
  const own = STATUS[code];
  if (own !== undefined) return own;
  switch (ERROR_CODES[code]) {
    case 'refused':
      return 422;
    case 'held':
      return 202;
    case 'retryable':
    case 'startup':
      return 503;
    default:
      return 500;
  }
}

/**
 * Whether a gate result's code is a failure rather than a decision about the call. The gate answers both as a
 * result (`ok: false` with the code), and the gate routes answer its decisions 200, because the model reads
 * them; a failure (the database refused the write, or anything unexpected) says nothing about the call and is
 * the HTTP error of its code instead: 503 with Retry-After for a database that refuses writes.
 */
export function isGateFailure(code: ErrorCode): boolean {
  const group = ERROR_CODES[code];
  return group === 'retryable' || group === 'internal' || group === 'startup';
}

/** The gate's result when it is a decision (answered 200); a failure is thrown as its coded error. */
export function gateDecision<R extends GateResult>(r: R): R {
  if (r.ok || !isGateFailure(r.error)) return r;
  throw new ActionLedgerError(r.error, r.message, r.details === undefined ? {} : { details: r.details });
}

/** Retry-After of a 503 when no write probe runs (an embedder's API): the probe's default interval. */
export const DEFAULT_RETRY_AFTER_S = 5;

/** The schema of the error body, for the OpenAPI document. */
export const errorSchema = {
  $id: 'Error',
  type: 'object',
  required: ['ok', 'error', 'message'],
  properties: {
    ok: { const: false },
    error: { type: 'string', enum: Object.keys(ERROR_CODES) },
    message: { type: 'string' },
    details: { type: 'object', additionalProperties: true },
    retry_after_s: { type: 'integer' },
  },
} as const;

export type ErrorBody = Refusal & { retry_after_s?: number };
