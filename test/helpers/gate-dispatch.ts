/**
 * The gate behind a real dispatcher: the predispatch environment (real PostgreSQL, the sandbox provider over
 * mTLS), the gate fixture on the same database, and the built-in authorization service the dispatcher asks.
 * For tests of what happens to a gate-reserved operation between its approval and its send.
 */
import type { Test } from 'tap';
import { AuthorizationService, type GateResult } from '../../gate/index.js';
import { settled } from './fleet.js';
import { GATE_RESOLVERS, gateFixture, gateRoutes, gctx, reviewer, type GateFixture } from './gate.js';
import { predispatchEnv, type PredispatchEnv } from './predispatch-env.js';

export interface GateDispatchEnv {
  e: PredispatchEnv;
  g: GateFixture;
  service: AuthorizationService;
  /** Runs a dispatcher against the service until `operationId` settles; returns the row. */
  dispatch(operationId: string): Promise<Awaited<ReturnType<typeof settled>>>;
}

export async function gateDispatchEnv(t: Test): Promise<GateDispatchEnv> {
  const e = await predispatchEnv(t);
  const g = await gateFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint });
  const service = new AuthorizationService({
    config: g.config,
    pool: e.pool,
    resolvers: GATE_RESOLVERS,
    tls: { ...e.pki.server, ca: e.pki.ca.cert },
  });
  t.teardown(() => service.stop());
  await service.start();
  return {
    e,
    g,
    service,
    async dispatch(operationId) {
      const d = await e.open({ tools: gateRoutes(e.provider.endpoint), authorizationUrl: service.authorizeUrl });
      try {
        return await settled(e.pool, operationId);
      } finally {
        await d.stop();
      }
    },
  };
}

export interface ApprovedOperation {
  operation_id: string;
  effect_key: string;
  approval_id: string;
}

/**
 * Calls `delete_customer` (two approvers) as admin-1 and has `approvers` approve it in turn (all supervisors);
 * returns the operation the last approval reserved.
 */
export async function approvedDeletion(
  g: GateFixture,
  approvers: readonly string[] = ['supervisor-1', 'supervisor-2'],
  step = 'delete-1',
): Promise<ApprovedOperation> {
  const held = await g.gate.call(
    gctx({ principal_id: 'admin-1', role: 'admin', workflow_step_id: step }),
    'delete_customer',
    {
      customer_id: 'C-1',
    },
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  const view = await g.gate.approvals.show(held.request_id, { tenant_id: 'tenant-a' });
  let r: GateResult | undefined;
  for (const who of approvers) r = await g.gate.approve(held.request_id, view.envelope_sha256, reviewer(who));
  if (r === undefined || !r.ok || r.operation_id === undefined || r.effect_key === undefined)
    throw new Error(JSON.stringify(r));
  return { operation_id: r.operation_id, effect_key: r.effect_key, approval_id: held.request_id };
}
