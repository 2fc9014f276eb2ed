export { Reconciler, type ReconcileSummary, type ReconcilerOptions } from './reconciler.js';
export { classifyReadback, readback, readbackUrl, type Readback, type ReadbackOutcome } from './readback.js';
export {
  Review,
  checkExpectation,
  retryIsSafe,
  type Expectation,
  type ExpectOptions,
  type RetryOptions,
  type ReviewInput,
  type ReviewResult,
} from './review.js';
export { listInReview, isReasonPrefix, type InReview, type ReviewFilter, type ReviewListing } from './review-list.js';
export {
  verifyLedger,
  historyProblems,
  type Discrepancy,
  type VerifyOptions,
  type DiscrepancyKind,
  type VerifyReport,
} from './verify.js';
export {
  ReconcileSchedule,
  RECONCILE_QUEUE,
  LEGACY_RECONCILE_QUEUE,
  type ReconcileScheduleOptions,
} from './schedule.js';
export { openReconciler, openReview, type PassSummary, type ReconcileKit, type ReviewKit } from './open.js';
export { ReconcileMetrics } from './metrics.js';
export { ReviewPolicyRunner, policyStates, type PolicyRunSummary, type PolicyState } from './review-policy.js';
export { OrphanWatch, type OrphanWatchOptions } from './orphan-watch.js';
export { readFleetHealth, SILENT_WORKER_WINDOW_S, workersSql } from './health.js';
