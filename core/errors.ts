/**
 * One error class for the whole project, with stable string codes.
 *
 * The same code is what an agent reads in a structured refusal, what pino logs as `err.code`, and what a
 * Prometheus label carries. Codes never change meaning; `docs/errors.md` documents each one and a test keeps
 * the two in step.
 */
import { databaseErrorCode, sqlState, type DatabaseErrorCode } from './sqlstate.js';

/** Every code, with the group that says what must happen next. */
export const ERROR_CODES = {
  // configuration and start-up: fix the deployment
  config_invalid: 'startup',
  secret_missing: 'startup',
  schema_name_invalid: 'startup',
  profile_invalid: 'startup',
  tls_verification_disabled: 'startup',
  migration_history_mismatch: 'startup',
  schema_not_migrated: 'startup',
  port_in_use: 'startup',
  already_running: 'startup',
  embedded_database_failed: 'startup',
  // the database: the request did not complete; nothing was half-written (each write is one transaction)
  database_unavailable: 'retryable',
  storage_full: 'retryable',
  statement_timeout: 'retryable',
  database_overloaded: 'retryable',
  database_conflict: 'retryable',
  database_read_only: 'retryable',
  database_error: 'internal',
  illegal_transition: 'internal',
  audit_unavailable: 'retryable',
  // refusals of a caller's request: nothing was written
  invalid_context: 'refused',
  invalid_arguments: 'refused',
  invalid_json: 'refused',
  unauthenticated: 'refused',
  csrf_token_invalid: 'refused',
  oidc_sign_in_failed: 'refused',
  oidc_not_mapped: 'refused',
  body_too_large: 'refused',
  unsupported_media_type: 'refused',
  expectation_failed: 'refused',
  route_not_approved: 'refused',
  operation_conflict: 'refused',
  not_found: 'refused',
  invalid_state_transition: 'refused',
  invalid_review: 'refused',
  retry_not_safe: 'refused',
  review_policy_refused: 'refused',
  compensation_unmapped: 'refused',
  // the gate: refusals an agent reads and answers from; nothing was reserved
  unknown_tool: 'refused',
  unknown_tenant: 'refused',
  tenant_wrong_cluster: 'refused',
  permission_denied: 'refused',
  tool_disabled: 'refused',
  rate_limited: 'refused',
  invalid_request: 'refused',
  limit_exceeded: 'refused',
  proposal_not_found: 'refused',
  proposal_same_turn_confirm: 'refused',
  proposal_expired: 'refused',
  params_mismatch: 'refused',
  confirmation_declined: 'refused',
  approval_hash_mismatch: 'refused',
  approval_expired: 'refused',
  self_approval_forbidden: 'refused',
  hidden_characters: 'refused',
  reapproval_required: 'refused',
  // the gate: waiting for a person; the request id says what to confirm or approve
  approval_required: 'held',
  confirmation_required: 'held',
  // dispatch: what the worker learned, grouped by what happens next
  route_changed: 'not_sent',
  args_hash_mismatch: 'not_sent',
  authorization_denied: 'not_sent',
  authorization_invalid: 'not_sent',
  authorization_unavailable: 'not_sent',
  authorization_stale: 'not_sent',
  role_revoked: 'not_sent',
  claim_lost: 'not_sent',
  worker_lost: 'not_sent',
  credential_missing: 'not_sent',
  ungated_external_write: 'not_sent',
  provider_unreachable: 'not_sent',
  provider_outcome_unknown: 'unknown',
  provider_rejected: 'rejected',
  provider_no_receipt: 'rejected',
  internal: 'internal',
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;
export type ErrorGroup = (typeof ERROR_CODES)[ErrorCode];

/** The structured refusal every public surface returns instead of throwing at an agent. */
export interface Refusal {
  ok: false;
  error: ErrorCode;
  message: string;
  details?: Record<string, unknown>;
}

export class ActionLedgerError extends Error {
  override readonly name = 'ActionLedgerError';
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.details = options.details;
  }

  get group(): ErrorGroup {
    return ERROR_CODES[this.code];
  }

  toRefusal(): Refusal {
    const refusal: Refusal = { ok: false, error: this.code, message: this.message };
    if (this.details !== undefined) refusal.details = this.details;
    return refusal;
  }
}

export function isActionLedgerError(err: unknown, code?: ErrorCode): err is ActionLedgerError {
  return err instanceof ActionLedgerError && (code === undefined || err.code === code);
}

/**
 * The coded form of anything thrown: an ActionLedgerError as it is, a database failure as its code (with the
 * SQLSTATE in `details.sqlstate`, never the server's message, which may quote data), anything else `internal`.
 */
export function asActionLedgerError(err: unknown): ActionLedgerError {
  if (err instanceof ActionLedgerError) return err;
  const code = databaseErrorCode(err);
  if (code !== undefined) {
    const state = sqlState(err);
    return new ActionLedgerError(code, DATABASE_MESSAGES[code], {
      cause: err,
      ...(state === undefined ? {} : { details: { sqlstate: state } }),
    });
  }
  return new ActionLedgerError('internal', 'internal error', { cause: err });
}

const DATABASE_MESSAGES: Record<DatabaseErrorCode, string> = {
  database_unavailable: 'PostgreSQL could not be reached, or the connection broke mid-call',
  storage_full: 'PostgreSQL is out of disk space; nothing was written',
  statement_timeout: 'a database statement ran past the statement timeout; nothing was written',
  database_overloaded: 'PostgreSQL is out of a resource (memory, connections); nothing was written',
  database_conflict:
    'a database conflict (serialization failure or deadlock) outlived its retries; nothing was written',
  database_read_only: 'PostgreSQL is read-only (a standby or a failover in progress); nothing was written',
  database_error: 'the database refused the statement; nothing was written',
  illegal_transition:
    'the database refused an operation state change its legal transitions do not allow; nothing was written',
};

/** Turns anything thrown into a refusal; unexpected errors become `internal` without leaking their text. */
export function toRefusal(err: unknown): Refusal {
  return asActionLedgerError(err).toRefusal();
}
