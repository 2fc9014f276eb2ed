/**
 * The gate: the agent-facing front door (tool registry, checks pipeline, proposals, approvals, limits, audit)
 * and the built-in authorization service the dispatcher asks before every dispatch.
 */
export { Gate, type CallOptions, type KillSwitchEngaged } from './gate.js';
export { Approvals } from './approvals.js';
export { listKillSwitches, type KillSwitchRow } from './kill-switch-list.js';
export { readGateStatus, type GateReading } from './status.js';
export {
  listApprovals,
  APPROVAL_STATUSES,
  type ApprovalListFilter,
  type ApprovalPage,
  type ApprovalSummary,
} from './approval-list.js';
export { listAudit, ISO_TIME_PATTERN, type AuditListFilter, type AuditListRow, type AuditPage } from './audit-list.js';
export { withdrawPendingVotes } from './role-revocation.js';
export { describeEffect, type ApprovalView } from './approval-envelope.js';
export { type ApprovalBlocker, type ApprovalCaller } from './approval-blockers.js';
export { Proposals } from './proposals.js';
export { runGateHousekeeping, type GateHousekeepingSummary } from './housekeeping.js';
export { AuthorizationService, type AuthorizationServiceOptions } from './authorization-service.js';
export { type GateDeps } from './core.js';
export { checkGateContext } from './checks.js';
export { REDACTED, auditArguments } from './redaction.js';
export { AuditWriter, type AuditEntry, type AuditWriterOptions } from './audit.js';
export {
  GATE_CONTEXT_FIELDS,
  type ApproveOptions,
  type BoundResource,
  type BusinessValidator,
  type GateAllowed,
  type GateContext,
  type GateRefusal,
  type GateResult,
  type ResourceResolver,
  type Reviewer,
  type ValidatorVerdict,
} from './types.js';
