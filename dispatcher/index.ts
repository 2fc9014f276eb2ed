export { Dispatcher, type DispatcherOptions } from './dispatcher.js';
export { openDispatcher } from './worker.js';
export { CRASH_POINTS, CrashPoints, type CrashPoint } from './crash-points.js';
export {
  verifyProfile,
  signProfile,
  loadVerifiedProfile,
  generateProfileKeyPair,
  type DispatchProfile,
} from './profile.js';
export { runGated, assertGated, gate } from './gate-scope.js';
export { BINDING_FIELDS, checkDecision } from './authorize.js';
export { dispatcherQueries } from './queries.js';
