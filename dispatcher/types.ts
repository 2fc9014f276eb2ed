import type { ToolRoute } from '../config/index.js';
import type { Secret } from '../core/secret.js';
import type { AuthorizationDecision } from '../protocol/index.js';
import type { Settle } from './batcher.js';
import type { Span } from '../core/tracing.js';

/** What the dispatcher holds for one claimed operation. */
export interface ClaimedOperation {
  operation_id: string;
  effect_key: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  tenant_id: string;
  provider_id: string;
  provider_endpoint: string;
  idempotency_header: string;
  canonical_args_sha256: string;
  arguments_json: Record<string, unknown>;
  current_approval_id: string;
  current_policy_version: string;
  claim_token: string;
  attempt: number;
  /** How many times this operation was given back to the queue, never sent, since its reservation or review. */
  dispatch_releases: number;
  /** Seconds from this attempt's entry into the outbox (its available_at) to the claim, by the database's clock. */
  queued_s: number;
  /** performance.now() when this worker received the claim. */
  claimed_at_ms?: number;
  /** The trace context it was reserved under (sql/0020_operation_trace_context.sql), or null. */
  trace_context?: string | null;
  /** While tracing is on: when the claim statement was sent and answered (epoch ms), and its dispatch span. */
  claim_sent_at?: number;
  claim_answered_at?: number;
  span?: Span;
}

/** Where a pre-dispatch refusal happened (a metric label and the review reason's prefix). */
export type DispatchStage =
  'route' | 'arguments' | 'credential' | 'authorization' | 'evidence' | 'final_check' | 'provider' | 'database';

/** A claimed operation with a fresh authorization decision, waiting for a dispatch batch to record and send it. */
export interface DispatchItem extends Settle {
  op: ClaimedOperation;
  decision: AuthorizationDecision;
  route: ToolRoute;
  credential: Secret | null;
  progress: { sent: boolean };
  /** How many times its row was found held by another session. */
  busyRetries?: number;
}

/** The final check's verdict on one operation of a dispatch batch. */
export type FinalCheck = 'go' | 'authorization_stale' | 'tool_disabled' | 'role_revoked';
