export { EffectKeyer } from './effect-key.js';
export { Ledger, checkTrustedContext, type Reservation, type ReserveOptions } from './reserve.js';
export { ledgerStatus, showOperation, type LedgerStatus, type HistoryRow } from './inspect.js';
export { outboxChannel } from './notifier.js';
export { ledgerQueries } from './queries.js';
export {
  LEGAL_TRANSITIONS,
  isLegalTransition,
  providerHasNoEffect,
  transitionCte,
  type LegalTransition,
  type ProviderContact,
  type TransitionSpec,
} from './transitions.js';
