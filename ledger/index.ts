export { EffectKeyer } from './effect-key.js';
export { Ledger, checkTrustedContext, type Reservation, type ReservedStep, type ReserveOptions } from './reserve.js';
export { LedgerView, type LedgerStatus, type HistoryRow } from './inspect.js';
export { outboxChannel } from './notifier.js';
export {
  LEGAL_TRANSITIONS,
  isLegalTransition,
  providerHasNoEffect,
  releaseToQueueSql,
  transitionCte,
  type LegalTransition,
  type ProviderContact,
  type TransitionSpec,
} from './transitions.js';
export {
  TenantLedgerView,
  operationCursorBefore,
  OPERATION_PAGE,
  type OperationFilter,
  type OperationPage,
  type OperationSummary,
  type TenantOperation,
  type OperationRecords,
} from './tenant-view.js';
export { DirectReservations } from './direct.js';
