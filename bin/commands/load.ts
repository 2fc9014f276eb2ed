/**
 * The command line's heavy parts (PostgreSQL, pg-boss, undici, prom-client, the components), imported when a
 * command runs rather than when `actionledger` starts: help, usage errors and the command table stay fast,
 * and a command loads only what it uses.
 */
export const load = {
  runtime: () => import('../../runtime/index.js'),
  identity: () => import('../../runtime/index.js'),
  ledger: () => import('../../ledger/index.js'),
  gate: () => import('../../gate/index.js'),
  principals: () => import('../../principals/index.js'),
  reconciler: () => import('../../reconciler/index.js'),
  dispatcher: () => import('../../dispatcher/index.js'),
  service: () => import('../service.js'),
  worker: () => import('../dispatcher-worker.js'),
  server: () => import('../../server/index.js'),
};
