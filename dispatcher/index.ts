export { Dispatcher, dispatcherPoolFloor, FLOOR_REOPEN_INTERVAL_MS, type DispatcherOptions } from './dispatcher.js';
export { openDispatcher } from './worker.js';
