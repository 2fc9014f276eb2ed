export { Dispatcher, dispatcherPoolFloor, FLOOR_REOPEN_INTERVAL_MS, type DispatcherOptions } from './dispatcher.js';
export { openDispatcher } from './worker.js';
export {
  BINDING_FIELDS,
  authorizationRequest,
  checkDecision,
  type AuthorizationRequest,
  type BindingColumns,
} from './authorize.js';
