/**
 * The built-in authorization service behind a real Dispatcher: real PostgreSQL, real mTLS (the test PKI), the
 * sandbox provider counting what it receives. It allows only while the approval is approved and unexpired,
 * the role is held, no kill switch is on, the policy version is current and the resource versions match.
 */
import t, { type Test } from 'tap';
import { postJson } from '../../transport/http-client.js';
import { AuthorizationService, type GateResult } from '../../gate/index.js';
import { settled } from '../helpers/fleet.js';
import {
  GATE_RESOLVERS,
  auditRows,
  gateConfig,
  gateFixture,
  gateRoutes,
  gctx,
  reviewer,
  type GateFixture,
} from '../helpers/gate.js';
import { predispatchEnv, type PredispatchEnv } from '../helpers/predispatch-env.js';
import { testAgent } from '../helpers/sandbox.js';

/** The operations columns these tests read: uuids and text (read as the strings an authorizer request binds). */
interface OperationRow {
  operation_id: string;
  effect_key: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  tool_name: string;
  tenant_id: string;
  provider_id: string;
  canonical_args_sha256: string;
  current_approval_id: string;
  current_policy_version: string;
}

interface Env {
  e: PredispatchEnv;
  g: GateFixture;
  service: AuthorizationService;
  /** Runs a dispatcher against the service until `operationId` settles; returns the row. */
  dispatch(operationId: string): Promise<Awaited<ReturnType<typeof settled>>>;
}

async function env(t: Test, gate: NonNullable<Parameters<typeof gateConfig>[1]>['gate'] = {}): Promise<Env> {
  const e = await predispatchEnv(t);
  const g = await gateFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint, gate });
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

const editor = (over = {}) => gctx({ principal_id: 'editor-1', role: 'editor', ...over });
const publish = { document_id: 'DOC-1', status: 'published' };

async function approvedOperation(
  x: Env,
  ctx = editor(),
): Promise<{ operation_id: string; effect_key: string; approval_id: string }> {
  const held = await x.g.gate.call(ctx, 'update_document', publish);
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  const view = await x.g.gate.approvals.show(held.request_id, { tenant_id: 'tenant-a' });
  const r: GateResult = await x.g.gate.approve(held.request_id, view.envelope_sha256, reviewer('supervisor-1'));
  if (!r.ok || r.operation_id === undefined || r.effect_key === undefined) throw new Error(JSON.stringify(r));
  return { operation_id: r.operation_id, effect_key: r.effect_key, approval_id: held.request_id };
}

t.test('allowed while everything holds: auto, proposal and approval operations are dispatched once', async (t) => {
  const x = await env(t);
  const auto = await x.g.gate.call(gctx({ workflow_step_id: 'auto' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 10,
  });
  if (!auto.ok || auto.operation_id === undefined || auto.effect_key === undefined)
    throw new Error(JSON.stringify(auto));
  const a = await approvedOperation(x);
  t.equal((await x.dispatch(auto.operation_id)).status, 'succeeded');
  t.equal((await settled(x.e.pool, a.operation_id)).status, 'succeeded', 'the approved operation too');
  t.equal(x.e.provider.requestsFor(auto.effect_key), 1);
  t.equal(x.e.provider.requestsFor(a.effect_key), 1);
  const decisions = await auditRows(x.e.pool, "action = 'authorize'");
  t.same(decisions.map((d) => d.outcome).sort(), ['allow', 'allow']);
  t.same(decisions.map((d) => (d.detail as { reason: string }).reason).sort(), ['approval', 'auto']);
});

t.test('permission revoked after approval: refused at dispatch, the provider never called', async (t) => {
  const x = await env(t);
  const a = await approvedOperation(x);
  await x.g.gate.revokeRole('tenant-a', 'editor-1', 'editor', 'security');
  const row = await x.dispatch(a.operation_id);
  t.equal(row.status, 'needs_review');
  t.equal(row.review_reason, 'authorization:authorization_denied');
  t.equal(x.e.provider.requestsFor(a.effect_key), 0, 'no request reached the provider');
  t.match((await auditRows(x.e.pool, "action = 'authorize'"))[0], {
    outcome: 'deny',
    detail: { reason: 'role_not_held' },
  });
});

t.test('document approved at version 7, changed to 8 before dispatch: refused, provider untouched', async (t) => {
  const x = await env(t);
  const a = await approvedOperation(x);
  await x.e.pool.query("UPDATE shop.documents SET version = 8 WHERE doc_id = 'DOC-1'");
  const row = await x.dispatch(a.operation_id);
  t.equal(row.review_reason, 'authorization:authorization_denied');
  t.equal(x.e.provider.requestsFor(a.effect_key), 0);
  t.match((await auditRows(x.e.pool, "action = 'authorize'"))[0], {
    outcome: 'deny',
    detail: { reason: 'stale_resource' },
  });
});

t.test('approval TTL passed before dispatch: refused', async (t) => {
  const x = await env(t, { tools: { update_document: { approval: { mode: 'always', ttl_s: 1 } } } });
  const a = await approvedOperation(x);
  await new Promise((r) => setTimeout(r, 1100));
  t.equal((await x.dispatch(a.operation_id)).review_reason, 'authorization:authorization_denied');
  t.equal(x.e.provider.requestsFor(a.effect_key), 0);
  t.match((await auditRows(x.e.pool, "action = 'authorize'"))[0], { detail: { reason: 'approval_expired' } });
});

t.test('kill switch: a running dispatcher holds pending work until it is lifted', async (t) => {
  const x = await env(t);
  const r = await x.g.gate.call(gctx({ workflow_step_id: 'held' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 10,
  });
  if (!r.ok || r.operation_id === undefined || r.effect_key === undefined) throw new Error(JSON.stringify(r));
  await x.g.gate.engageKillSwitch('tenant-a', 'transfer_funds', 'oncall', 'incident');
  const d = await x.e.open({ tools: gateRoutes(x.e.provider.endpoint), authorizationUrl: x.service.authorizeUrl });
  await new Promise((res) => setTimeout(res, 1000)); // ten poll intervals
  t.equal(
    (
      await x.e.pool.query<{ status: string }>('SELECT status FROM actionledger.operations WHERE operation_id = $1', [
        r.operation_id,
      ])
    ).rows[0]?.status,
    'pending',
    'held',
  );
  t.equal(await x.e.pool.query('SELECT 1 FROM actionledger.outbox').then((q) => q.rowCount), 1, 'its outbox row waits');
  t.equal(x.e.provider.requestsFor(r.effect_key), 0);
  await x.g.gate.liftKillSwitch('tenant-a', 'transfer_funds', 'oncall');
  t.equal((await settled(x.e.pool, r.operation_id)).status, 'succeeded', 'dispatched once lifted');
  t.equal(x.e.provider.requestsFor(r.effect_key), 1);
  await d.stop();
});

t.test('decisions: policy version, kill switch, direct reservations, binding mismatch; mTLS required', async (t) => {
  const x = await env(t);
  const auto = await x.g.gate.call(gctx({ workflow_step_id: 'auto' }), 'transfer_funds', {
    to_account: 'ACC0000000002',
    amount: 10,
  });
  if (!auto.ok || auto.operation_id === undefined) throw new Error(JSON.stringify(auto));
  const row = (
    await x.e.pool.query<OperationRow>('SELECT * FROM actionledger.operations WHERE operation_id = $1', [
      auto.operation_id,
    ])
  ).rows[0]!;
  const request = {
    operation_id: row.operation_id,
    effect_key: row.effect_key,
    principal_id: row.principal_id,
    task_id: row.task_id,
    workflow_step_id: row.workflow_step_id,
    tool_name: row.tool_name,
    tenant_id: row.tenant_id,
    provider_id: row.provider_id,
    args_sha256: row.canonical_args_sha256,
    approval_id: row.current_approval_id,
    policy_version: row.current_policy_version,
  };
  t.match(await x.service.decide(request), { allow: true, reason: 'auto' });
  t.match(await x.service.decide({ ...request, args_sha256: 'f'.repeat(64) }), {
    allow: false,
    reason: /binding_mismatch:args_sha256/,
  });
  const newer = new AuthorizationService({
    config: gateConfig(x.e.url, { endpoint: x.e.provider.endpoint, gate: { policy_version: 'gate-policy-2' } }),
    pool: x.e.pool,
    resolvers: GATE_RESOLVERS,
    tls: { ...x.e.pki.server, ca: x.e.pki.ca.cert },
  });
  t.match(
    await newer.decide(request),
    { allow: false, reason: 'policy_version' },
    'a policy change denies operations stamped with the old one',
  );
  await x.g.gate.engageKillSwitch('*', 'transfer_funds', 'oncall', 'x');
  t.match(await x.service.decide(request), { allow: false, reason: 'kill_switch' });
  await x.g.gate.liftKillSwitch('*', 'transfer_funds', 'oncall');

  const direct = await x.g.ledger.reserve(
    {
      tenant_id: 'tenant-a',
      principal_id: 'svc',
      task_id: 't',
      workflow_step_id: 's',
      approval_id: 'a',
      policy_version: 'p',
    },
    'transfer_funds',
    { to_account: 'ACC0000000002', amount: 1 },
  );
  const d = (
    await x.e.pool.query<OperationRow>('SELECT * FROM actionledger.operations WHERE operation_id = $1', [
      direct.operation_id,
    ])
  ).rows[0]!;
  const directReq = {
    ...request,
    operation_id: d.operation_id,
    effect_key: d.effect_key,
    principal_id: 'svc',
    task_id: 't',
    workflow_step_id: 's',
    args_sha256: d.canonical_args_sha256,
    approval_id: 'a',
    policy_version: 'p',
  };
  t.match(
    await x.service.decide(directReq),
    { allow: false, reason: 'not_reserved_through_gate' },
    'denied by default',
  );
  const allowing = new AuthorizationService({
    config: gateConfig(x.e.url, { endpoint: x.e.provider.endpoint, gate: { direct_reservations: 'allow' } }),
    pool: x.e.pool,
    tls: { ...x.e.pki.server, ca: x.e.pki.ca.cert },
    resolvers: GATE_RESOLVERS,
  });
  t.match(await allowing.decide(directReq), { allow: true, reason: 'direct_reservation' });

  // A compensation the compensator minted is allowed while its original is being compensated, and only then.
  const comp = await x.g.ledger.reserve(
    {
      tenant_id: 'tenant-a',
      principal_id: 'svc',
      task_id: 't',
      workflow_step_id: `compensation:${direct.operation_id}`,
      approval_id: `compensation:${direct.operation_id}`,
      policy_version: 'p',
    },
    'transfer_funds',
    { to_account: 'ACC0000000001', amount: 1 },
  );
  const c = (
    await x.e.pool.query<OperationRow>('SELECT * FROM actionledger.operations WHERE operation_id = $1', [
      comp.operation_id,
    ])
  ).rows[0]!;
  const compReq = {
    ...directReq,
    operation_id: c.operation_id,
    effect_key: c.effect_key,
    workflow_step_id: c.workflow_step_id,
    args_sha256: c.canonical_args_sha256,
    approval_id: c.current_approval_id,
  };
  t.match(
    await x.service.decide(compReq),
    { allow: false, reason: 'not_reserved_through_gate' },
    'not a registered compensation yet',
  );
  await x.e.pool.query(
    `INSERT INTO actionledger.compensations (original_operation_id, compensation_operation_id, requested_by, reason) VALUES ($1, $2, 'compensator', 'test')`,
    [direct.operation_id, comp.operation_id],
  );
  t.match(
    await x.service.decide(compReq),
    { allow: false, reason: 'not_reserved_through_gate' },
    'its original is not being compensated',
  );
  // Along legal moves only: the database refuses pending -> compensating.
  for (const status of ['executing', 'succeeded', 'compensating'])
    await x.e.pool.query(
      `UPDATE actionledger.operations SET status = $2, claim_token = coalesce(claim_token, gen_random_uuid()) WHERE operation_id = $1`,
      [direct.operation_id, status],
    );
  t.match(
    await x.service.decide(compReq),
    { allow: true, reason: 'compensation' },
    'allowed while the original is compensating',
  );
  t.match(
    await x.service.decide({ ...compReq, args_sha256: 'e'.repeat(64) }),
    { allow: false, reason: /binding_mismatch/ },
    'still bound to its stored arguments',
  );

  // Over the wire: the contract's answer with the dispatcher's certificate; nothing without one from the CA.
  const good = await postJson(await testAgent(t), x.service.authorizeUrl, {
    body: JSON.stringify(request),
    timeoutMs: 2000,
    maxBytes: 4096,
  });
  t.match(good, { kind: 'response', status: 200, json: { ...request, decision: 'allow' } });
  const dup = await postJson(await testAgent(t), x.service.authorizeUrl, {
    body: `{"operation_id":"a",${JSON.stringify(request).slice(1)}`,
    timeoutMs: 2000,
    maxBytes: 4096,
  });
  t.match(dup, { kind: 'response', status: 400 }, 'duplicate keys refused');
  const intruder = await postJson(
    await testAgent(t, { cert: x.e.pki.otherClient.cert, key: x.e.pki.otherClient.key }),
    x.service.authorizeUrl,
    { body: JSON.stringify(request), timeoutMs: 2000, maxBytes: 4096 },
  );
  t.not(intruder.kind, 'response', 'a client certificate from another CA gets no answer');
});
