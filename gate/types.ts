/** The gate's public shapes: the trusted context it needs, its results, and the hooks the embedding code supplies. */
import type { Queryable } from '../db/index.js';
import type { ErrorCode } from '../core/errors.js';
import type { JsonObject } from '../core/json.js';
import type { OperationStatus } from '../core/types.js';

/**
 * Who is asking, from authentication and workflow state; never from tool arguments or model text.
 * Operation identity is (tenant_id, principal_id, task_id, workflow_step_id), as in the ledger. Every field is an
 * identifier (core/identifier.ts), compared in its NFC form.
 */
export interface GateContext {
  tenant_id: string;
  principal_id: string;
  role: string;
  account_id: string;
  conversation_id: string;
  turn_id: string;
  trace_id: string;
  task_id: string;
  workflow_step_id: string;
  /** The workflow's current plan version for this task; a change invalidates approvals bound to the old one. */
  plan_version?: string;
}

export const GATE_CONTEXT_FIELDS = [
  'tenant_id',
  'principal_id',
  'role',
  'account_id',
  'conversation_id',
  'turn_id',
  'trace_id',
  'task_id',
  'workflow_step_id',
] as const satisfies readonly (keyof GateContext)[];

/** A person acting on an approval: from their authenticated session, like the agent's context. */
export interface Reviewer {
  tenant_id: string;
  principal_id: string;
  role: string;
}

export interface GateAllowed {
  ok: true;
  /** `reserved`: in the ledger; `confirmed`: a proposal awaiting execute; `pending_approvals`: more approvers needed. */
  status: 'reserved' | 'approved' | 'confirmed' | 'cancelled' | 'rejected' | 'pending_approvals';
  operation_id?: string;
  effect_key?: string;
  created?: boolean;
  operation_status?: OperationStatus;
  request_id?: string;
  message: string;
}

/** How a person approves. */
export interface ApproveOptions {
  /**
   * The person saw the characters the envelope holds that a reader would not see as written (each shown by its
   * code), or its text written right to left (shown in stored order), and approves anyway; without it such an
   * approval is refused `hidden_characters`.
   */
  acknowledgeHiddenCharacters?: boolean;
}

/** A refusal (or a hold waiting for a person): a value the model reads, never an exception. */
export interface GateRefusal {
  ok: false;
  error: ErrorCode;
  message: string;
  details?: Record<string, unknown>;
  retry_after_s?: number;
  /** The approval or proposal id, with approval_required / confirmation_required. */
  request_id?: string;
  /** Returned exactly once, with confirmation_required; only its sha256 is stored. */
  confirm_token?: string;
  envelope_sha256?: string;
  expires_at?: string;
}

export type GateResult = GateAllowed | GateRefusal;

export type ValidatorVerdict = { ok: true } | { ok: false; error: 'not_found' | 'invalid_request'; message: string };

/**
 * A tool's business check. It sees the trusted context and runs in the gate's transaction (`db`); ownership
 * belongs in its query (`WHERE id = $1 AND account_id = $2`), and "not yours" must answer exactly like
 * "not there" (`not_found`).
 */
export type BusinessValidator = (input: {
  context: Readonly<GateContext>;
  tool: string;
  args: Readonly<JsonObject>;
  db: Queryable;
}) => Promise<ValidatorVerdict>;

/**
 * Reads the current version of one resource the operator declared (`gate.tools.*.resources`), or null when it
 * does not exist for this tenant. Bound into approvals and checked again on approval and at dispatch.
 */
export type ResourceResolver = (input: {
  tenant_id: string;
  id: string;
  db: Queryable;
}) => Promise<string | number | null>;

export interface BoundResource {
  type: string;
  id: string;
  version: string;
}
