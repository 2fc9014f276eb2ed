/** Shared low-level types (like River's rivertype): components import these, never each other's internals. */

export const OPERATION_STATUSES = [
  'pending',
  'executing',
  'succeeded',
  'unknown',
  'needs_review',
  'compensating',
  'compensated',
  'failed',
] as const;
export type OperationStatus = (typeof OPERATION_STATUSES)[number];

/** End states: nothing moves an operation out of these except the compensation path from `succeeded`. */
export const END_STATUSES: ReadonlySet<OperationStatus> = new Set(['succeeded', 'failed', 'compensated']);

/**
 * Who is asking, established by authentication and workflow state, never by tool arguments or model text.
 * Operation identity is (tenant_id, principal_id, task_id, workflow_step_id): the same principal, task and step
 * in two tenants are two operations. Every field is an identifier (core/identifier.ts), compared in its NFC form.
 */
export interface TrustedContext {
  tenant_id: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  approval_id: string;
  policy_version: string;
}

export const TRUSTED_CONTEXT_FIELDS = [
  'tenant_id',
  'principal_id',
  'task_id',
  'workflow_step_id',
  'approval_id',
  'policy_version',
] as const satisfies readonly (keyof TrustedContext)[];

/**
 * Argument names that would carry authority (who is asking, for whom, under which approval). The gate refuses
 * them in tool schemas at start and in arguments at call time: authority comes from the trusted context.
 */
export const IDENTITY_ARGUMENT_NAMES = [
  'tenant_id',
  'principal_id',
  'user_id',
  'role',
  'roles',
  'account_id',
  'conversation_id',
  'turn_id',
  'trace_id',
  'approval_id',
  'policy_version',
  'approved_by',
  'requester_id',
] as const;

/** The longest trusted-context field, in UTF-16 code units. */
export const MAX_CONTEXT_FIELD = 256;

/** Whether `v` can be a trusted-context field: non-empty well-formed text, bounded, no control characters. */
export function isContextText(v: unknown): v is string {
  return (
    typeof v === 'string' &&
    v.length > 0 &&
    v.length <= MAX_CONTEXT_FIELD &&
    v.isWellFormed() &&
    !/[\u0000-\u001f\u007f]/.test(v)
  );
}
