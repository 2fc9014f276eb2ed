/** The library: `import { ... } from 'actionledger'`. */
export {
  ActionLedgerError,
  ERROR_CODES,
  isActionLedgerError,
  toRefusal,
  type ErrorCode,
  type Refusal,
} from './core/errors.js';
export { loadConfig, compileConfig, type Config, type ToolRoute } from './config/index.js';
export { openRuntime, type Runtime } from './runtime/index.js';
export { migrate, readMigrations } from './db/index.js';
export { OPERATION_STATUSES, type OperationStatus, type TrustedContext } from './core/types.js';
// Tracing (docs/observability.md): started from the OTEL_* environment, or enabled over a caller's own SDK.
export { enableTracing, flushTracing, startTracing, tracingOn } from './core/tracing.js';
export {
  EffectKeyer,
  Ledger,
  type HistoryRow,
  type LedgerStatus,
  type Reservation,
  type ReserveOptions,
} from './ledger/index.js';
export { openDispatcher, Dispatcher } from './dispatcher/index.js';
export {
  openReconciler,
  openReview,
  Reconciler,
  Review,
  verifyLedger,
  ReconcileSchedule,
  type PassSummary,
  type ReconcileSummary,
  type ReviewResult,
  type VerifyReport,
  type Discrepancy,
} from './reconciler/index.js';
export { Compensator, type CompensationSummary } from './compensator/index.js';
export {
  Gate,
  AuthorizationService,
  describeEffect,
  runGateHousekeeping,
  type ApprovalView,
  type AuthorizationServiceOptions,
  type BoundResource,
  type BusinessValidator,
  type CallOptions,
  type GateAllowed,
  type GateContext,
  type GateRefusal,
  type GateResult,
  type ResourceResolver,
  type Reviewer,
  type ValidatorVerdict,
} from './gate/index.js';
export type { GateConfig, GateTool } from './config/index.js';
