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
}

/** Where a pre-dispatch refusal happened (a metric label and the review reason's prefix). */
export type DispatchStage =
  'route' | 'arguments' | 'credential' | 'authorization' | 'evidence' | 'final_check' | 'provider';
