/**
 * Nothing is allowed unaudited. A trigger on gate_audit raises SQLSTATE 53100 (disk full) while a flag row
 * exists, so both the full audit row and its fallback row fail, deterministically: the authorization service
 * (real mTLS listener, real Dispatcher, the sandbox provider counting requests) refuses, the gate refuses
 * accepted calls, approvals and admin actions with `audit_unavailable` and reserves nothing, and every lost
 * refusal row is logged with its SQLSTATE and counted in actionledger_audit_lost_total.
 */
import t, { type Test } from 'tap';
import { createPool, type Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { authorizationRequest } from '../../protocol/authorization.js';
import { postJson } from '../../transport/http-client.js';
import { AuthorizationService, Gate } from '../../gate/index.js';
import { settled } from '../helpers/fleet.js';
import {
  GATE_RESOLVERS,
  GATE_VALIDATORS,
  auditRows,
  count,
  gateFixture,
  gateRoutes,
  gctx,
  reviewer,
} from '../helpers/gate.js';
import { predispatchEnv, PREDISPATCH_RELEASE_LIMIT } from '../helpers/predispatch-env.js';
import { testAgent } from '../helpers/sandbox.js';

/** Creates the fault: while public.audit_disk_full has a row, every insert into gate_audit fails with 53100. */
async function installAuditFault(pool: Pool): Promise<{ on(): Promise<void>; off(): Promise<void> }> {
  await pool.query(`
    CREATE TABLE public.audit_disk_full (on_since timestamptz NOT NULL DEFAULT now());
    CREATE FUNCTION public.audit_disk_full_raise() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM public.audit_disk_full) THEN
        RAISE EXCEPTION 'could not extend file: No space left on device (injected)' USING ERRCODE = '53100';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER audit_disk_full BEFORE INSERT ON actionledger.gate_audit FOR EACH ROW EXECUTE FUNCTION public.audit_disk_full_raise();`);
  return {
    on: async () => void (await pool.query('INSERT INTO public.audit_disk_full DEFAULT VALUES')),
    off: async () => void (await pool.query('DELETE FROM public.audit_disk_full')),
  };
}

/** A logger whose JSON lines the test reads, and a registry whose counters it reads. */
function observed(): {
  log: ReturnType<typeof createLogger>;
  lines: Record<string, unknown>[];
  metrics: Metrics;
  lost(action: string): Promise<number>;
} {
  const lines: Record<string, unknown>[] = [];
  const log = createLogger({
    level: 'info',
    name: 'test',
    destination: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
  });
  const metrics = new Metrics({ defaultMetrics: false });
  return {
    log,
    lines,
    metrics,
    async lost(action) {
      const m = (await metrics.registry.getMetricsAsJSON()).find((x) => x.name === 'actionledger_audit_lost_total');
      return Number(m?.values.find((v) => v.labels.action === action)?.value ?? 0);
    },
  };
}

async function operationRow(pool: Pool, id: string): Promise<Parameters<typeof authorizationRequest>[0]> {
  return (await pool.query('SELECT * FROM actionledger.operations WHERE operation_id = $1', [id]))
    .rows[0] as Parameters<typeof authorizationRequest>[0];
}

const transfer = { to_account: 'ACC0000000002', amount: 10 };

t.test(
  'an authorization whose audit row cannot be written is refused: the dispatcher sends nothing; allowed again once it can',
  async (t: Test) => {
    const e = await predispatchEnv(t);
    const g = await gateFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint });
    const o = observed();
    const service = new AuthorizationService({
      config: g.config,
      pool: e.pool,
      resolvers: GATE_RESOLVERS,
      tls: { ...e.pki.server, ca: e.pki.ca.cert },
      log: o.log,
      metrics: o.metrics,
    });
    t.teardown(() => service.stop());
    await service.start();
    const fault = await installAuditFault(e.pool);

    const first = await g.gate.call(gctx({ workflow_step_id: 'before' }), 'transfer_funds', transfer);
    if (!first.ok || first.operation_id === undefined || first.effect_key === undefined)
      throw new Error(JSON.stringify(first));
    const request = authorizationRequest(await operationRow(e.pool, first.operation_id));
    t.match(
      await postJson(await testAgent(t), service.authorizeUrl, {
        body: JSON.stringify(request),
        timeoutMs: 10_000,
        maxBytes: 4096,
      }),
      { kind: 'response', status: 200, json: { decision: 'allow' } },
      'allowed while audit rows can be written',
    );

    await fault.on();
    const refused = await postJson(await testAgent(t), service.authorizeUrl, {
      body: JSON.stringify(request),
      timeoutMs: 10_000,
      maxBytes: 4096,
    });
    t.match(
      refused,
      { kind: 'response', status: 503, json: { error: 'audit_unavailable' } },
      'the same request is refused over mTLS',
    );
    t.equal(await o.lost('authorize'), 1, 'the lost refusal row is counted');
    t.match(
      o.lines.filter((l) => l.msg === 'gate audit row lost'),
      [
        {
          level: 50,
          action: 'authorize',
          outcome: 'audit_unavailable',
          sqlstate: '53100',
          code: 'storage_full',
          subject_id: first.operation_id,
        },
      ],
    );

    const d = await e.open({ tools: gateRoutes(e.provider.endpoint), authorizationUrl: service.authorizeUrl });
    const row = await settled(e.pool, first.operation_id);
    await d.stop();
    // No decision: the dispatcher gives the operation back to the queue and asks again, as often as the release
    // limit allows, then records the refusal for review.
    t.equal(row.status, 'needs_review', 'the dispatcher records a refusal once its releases are spent');
    t.equal(row.review_reason, 'authorization:authorization_unavailable');
    t.match(row.result_json, { releases: PREDISPATCH_RELEASE_LIMIT, status: 503, error: 'audit_unavailable' });
    t.equal(e.provider.requestsFor(first.effect_key), 0, 'no request reached the provider');
    t.equal(
      await o.lost('authorize'),
      2 + PREDISPATCH_RELEASE_LIMIT,
      "each of the dispatcher's requests was refused the same way",
    );
    t.same(
      (await auditRows(e.pool, "action = 'authorize'")).map((r) => r.outcome),
      ['allow'],
      'the only allow on record is the one before the fault',
    );

    await fault.off();
    const second = await g.gate.call(gctx({ workflow_step_id: 'after' }), 'transfer_funds', transfer);
    if (!second.ok || second.operation_id === undefined || second.effect_key === undefined)
      throw new Error(JSON.stringify(second));
    const d2 = await e.open({ tools: gateRoutes(e.provider.endpoint), authorizationUrl: service.authorizeUrl });
    t.equal(
      (await settled(e.pool, second.operation_id)).status,
      'succeeded',
      'decisions allow again once the audit rows can be written',
    );
    await d2.stop();
    t.equal(e.provider.requestsFor(second.effect_key), 1);
    t.same(
      (await auditRows(e.pool, "action = 'authorize'")).map((r) => r.outcome),
      ['allow', 'allow'],
    );
  },
);

t.test('the authorization service answers a database failure with its code, not internal', async (t: Test) => {
  const e = await predispatchEnv(t);
  const g = await gateFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint });
  const r = await g.gate.call(gctx(), 'transfer_funds', transfer);
  if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
  const request = authorizationRequest(await operationRow(e.pool, r.operation_id));
  // Nothing listens on port 1: every query fails to connect.
  const gone = createPool('postgres://nobody@127.0.0.1:1/none', {
    max: 1,
    statementTimeoutMs: 1000,
    applicationName: 'test-gone',
  });
  t.teardown(() => gone.end());
  const o = observed();
  const service = new AuthorizationService({
    config: g.config,
    pool: gone,
    resolvers: GATE_RESOLVERS,
    tls: { ...e.pki.server, ca: e.pki.ca.cert },
    log: o.log,
    metrics: o.metrics,
  });
  t.teardown(() => service.stop());
  await service.start();
  const answer = await postJson(await testAgent(t), service.authorizeUrl, {
    body: JSON.stringify(request),
    timeoutMs: 5000,
    maxBytes: 4096,
  });
  t.match(answer, { kind: 'response', status: 503, json: { error: 'database_unavailable' } });
  t.notMatch(JSON.stringify(answer), /at .*\.js:\d+/, 'no stack in the body');
  t.match(o.lines, [{ msg: /failed on the database/, error_code: 'database_unavailable' }], 'logged with its code');
});

t.test(
  'gate decisions that would allow are refused audit_unavailable while audit rows cannot be written; nothing is reserved',
  async (t: Test) => {
    const g = await gateFixture(t);
    const o = observed();
    const gate = new Gate({
      config: g.config,
      pool: g.pool,
      ledger: g.ledger,
      validators: GATE_VALIDATORS,
      resolvers: GATE_RESOLVERS,
      log: o.log,
      metrics: o.metrics,
    });
    const fault = await installAuditFault(g.pool);
    // Set up before the fault: a confirmed proposal and a pending approval.
    const proposed = await gate.call(gctx({ workflow_step_id: 'mail' }), 'send_email', {
      to: 'a@b.c',
      subject: 's',
      body: 'b',
    });
    if (proposed.ok || proposed.confirm_token === undefined || proposed.request_id === undefined)
      throw new Error(JSON.stringify(proposed));
    t.match(await gate.confirm(proposed.confirm_token, gctx({ turn_id: 'turn-2' })), { ok: true, status: 'confirmed' });
    const held = await gate.call(
      gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'doc' }),
      'update_document',
      { document_id: 'DOC-1', status: 'published' },
    );
    if (held.request_id === undefined) throw new Error(JSON.stringify(held));
    const envelope = (await gate.approvals.show(held.request_id, { tenant_id: 'tenant-a' })).envelope_sha256;
    const auditBefore = await count(g.pool, 'actionledger.gate_audit');

    await fault.on();
    const call = await gate.call(gctx({ workflow_step_id: 'auto' }), 'transfer_funds', transfer);
    t.match(
      call,
      { ok: false, error: 'audit_unavailable', details: { sqlstate: '53100', database: 'storage_full' } },
      'an accepted call is refused with a code',
    );
    const executed = await gate.executeProposal(proposed.request_id, gctx({ turn_id: 'turn-2' }));
    t.match(executed, { ok: false, error: 'audit_unavailable' }, 'executing the confirmed proposal is refused');
    const approved = await gate.approve(held.request_id, envelope, reviewer('supervisor-1'));
    t.match(approved, { ok: false, error: 'audit_unavailable' }, 'the approval is refused');
    await t.rejects(gate.engageKillSwitch('tenant-a', 'transfer_funds', 'oncall', 'x'), {
      code: 'audit_unavailable',
      details: { sqlstate: '53100' },
    });
    await t.rejects(gate.revokeRole('tenant-a', 'agent-1', 'agent', 'security'), { code: 'audit_unavailable' });

    t.equal(await count(g.pool, 'actionledger.operations'), 0, 'nothing reserved');
    t.equal(await count(g.pool, 'actionledger.outbox'), 0, 'nothing queued');
    t.equal(await count(g.pool, 'actionledger.gate_operations'), 0);
    t.equal(
      await count(g.pool, "actionledger.gate_proposals WHERE status = 'confirmed'"),
      1,
      'the proposal is still only confirmed',
    );
    t.equal(
      await count(g.pool, "actionledger.gate_approvals WHERE status = 'pending' AND cardinality(approvers) = 0"),
      1,
      'the approval has no vote',
    );
    t.equal(await count(g.pool, 'actionledger.gate_kill_switches'), 0, 'no kill switch engaged');
    t.equal(await count(g.pool, 'actionledger.gate_role_revocations'), 0, 'no role revoked');
    t.equal(await count(g.pool, 'actionledger.gate_audit'), auditBefore, 'no audit row written');
    t.same(
      [await o.lost('call'), await o.lost('execute'), await o.lost('approve')],
      [1, 1, 1],
      'each refusal whose row was lost is counted',
    );
    t.match(
      o.lines.filter((l) => l.msg === 'gate audit row lost').map((l) => [l.action, l.sqlstate]),
      [
        ['call', '53100'],
        ['execute', '53100'],
        ['approve', '53100'],
      ],
    );
    t.ok(
      o.lines.some(
        (l) =>
          l.msg === 'gate decision failed on the database; refused with its code' &&
          l.error_code === 'audit_unavailable',
      ),
      'the refusal is logged with its code',
    );

    await fault.off();
    t.match(
      await gate.call(gctx({ workflow_step_id: 'auto' }), 'transfer_funds', transfer),
      { ok: true, status: 'reserved', created: true },
      'accepted again once audit rows can be written',
    );
    t.match(await gate.executeProposal(proposed.request_id, gctx({ turn_id: 'turn-2' })), {
      ok: true,
      status: 'reserved',
    });
    t.match(await gate.approve(held.request_id, envelope, reviewer('supervisor-1')), { ok: true, status: 'reserved' });
    t.equal(await count(g.pool, 'actionledger.operations'), 3);
  },
);
