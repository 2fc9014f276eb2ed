/**
 * A task's plan version is its principal's (tenant, principal, task): another principal of the tenant calling
 * with the same task id and a new plan version neither invalidates the first principal's approvals nor stops
 * its approved operation at dispatch (the authorization service's `plan_version`); the principal's own new
 * plan version still does both. A principal that never reported a plan reads the default '-', whatever
 * another principal reported for the same task id. Migration 0017 gives each existing (tenant, task) row to
 * every principal with an approval, proposal or operation in that task, and drops a row nobody can be given.
 */
import t from 'tap';
import pg from 'pg';
import { AuthorizationService, type GateResult } from '../../gate/index.js';
import { migrate, readMigrations } from '../../db/migrate.js';
import { createTestDatabase } from '../helpers/db.js';
import { auditRows, GATE_RESOLVERS, gateFixture, gctx, reviewer, type GateFixture } from '../helpers/gate.js';

const editorA = (over = {}) => gctx({ principal_id: 'editor-a', role: 'editor', ...over });
const editorB = (over = {}) => gctx({ principal_id: 'editor-b', role: 'editor', ...over });
const publish = { document_id: 'DOC-1', status: 'published' };
const review = { document_id: 'DOC-1', status: 'reviewed' };

function requestId(r: GateResult): string {
  if (r.ok || r.error !== 'approval_required' || r.request_id === undefined)
    throw new Error(`expected approval_required, got ${JSON.stringify(r)}`);
  return r.request_id;
}

async function approvalStatus(f: GateFixture, id: string): Promise<{ status: string; reason: string | null }> {
  const { rows } = await f.pool.query<{ status: string; reason: string | null }>(
    'SELECT status, reason FROM actionledger.gate_approvals WHERE approval_id = $1',
    [id],
  );
  return rows[0]!;
}

/** Approves (one approver) and returns the operation it reserved. */
async function approveAndReserve(f: GateFixture, id: string): Promise<string> {
  const view = await f.gate.approvals.show(id, { tenant_id: 'tenant-a' });
  const r = await f.gate.approve(id, view.envelope_sha256, reviewer('supervisor-1'));
  if (!r.ok || r.operation_id === undefined) throw new Error(JSON.stringify(r));
  return r.operation_id;
}

/** The built-in authorization service's decision about an operation, asked with the ledger's own binding. */
async function decision(f: GateFixture, operationId: string): Promise<{ allow: boolean; reason: string }> {
  const service = new AuthorizationService({
    config: f.config,
    pool: f.pool,
    resolvers: GATE_RESOLVERS,
    tls: { cert: '', key: '', ca: '' },
  });
  const { rows } = await f.pool.query<Record<string, string>>(
    `SELECT operation_id, effect_key, principal_id, task_id, workflow_step_id, tool_name, tenant_id, provider_id,
            canonical_args_sha256 AS args_sha256, current_approval_id AS approval_id, current_policy_version AS policy_version
     FROM actionledger.operations WHERE operation_id = $1`,
    [operationId],
  );
  const d = await service.decide(rows[0] as Parameters<AuthorizationService['decide']>[0]);
  return { allow: d.allow, reason: d.reason };
}

t.test("another principal's new plan for the same task id touches neither approvals nor dispatch", async (t) => {
  const f = await gateFixture(t);
  const task = { task_id: 'refund-42' };
  // A: one approval approved and reserved under plan p1, one still pending under p1.
  const reserved = await approveAndReserve(
    f,
    requestId(
      await f.gate.call(editorA({ ...task, plan_version: 'p1', workflow_step_id: 'a-1' }), 'update_document', publish),
    ),
  );
  const pending = requestId(
    await f.gate.call(editorA({ ...task, plan_version: 'p1', workflow_step_id: 'a-2' }), 'update_document', review),
  );
  t.same(await decision(f, reserved), { allow: true, reason: 'approval' }, 'allowed while its plan holds');

  // B names A's task id with a new plan version, in the same tenant.
  const other = requestId(
    await f.gate.call(editorB({ ...task, plan_version: 'p2', workflow_step_id: 'b-1' }), 'update_document', review),
  );
  t.same(await approvalStatus(f, pending), { status: 'pending', reason: null }, "A's pending approval stands");
  t.same(await decision(f, reserved), { allow: true, reason: 'approval' }, "A's operation is still authorized");
  t.same(await auditRows(f.pool, "action = 'invalidate'"), [], 'nothing invalidated');
  t.same(
    (
      await f.pool.query(
        'SELECT principal_id, task_id, plan_version FROM actionledger.gate_task_plans ORDER BY principal_id',
      )
    ).rows,
    [
      { principal_id: 'editor-a', task_id: 'refund-42', plan_version: 'p1' },
      { principal_id: 'editor-b', task_id: 'refund-42', plan_version: 'p2' },
    ],
    'one plan per principal',
  );
  // B's own plan moves its own approvals only.
  await f.gate.call(editorB({ ...task, plan_version: 'p3', workflow_step_id: 'b-2' }), 'update_document', publish);
  t.same(await approvalStatus(f, other), { status: 'invalidated', reason: 'plan_changed' }, "B's own is invalidated");
  t.same(await approvalStatus(f, pending), { status: 'pending', reason: null }, "A's still pending");
  t.same(await decision(f, reserved), { allow: true, reason: 'approval' });

  // A's own new plan version does both.
  await f.gate.call(editorA({ ...task, plan_version: 'p2', workflow_step_id: 'a-3' }), 'update_document', publish);
  t.same(await approvalStatus(f, pending), { status: 'invalidated', reason: 'plan_changed' }, "A's own plan change");
  t.same(await decision(f, reserved), { allow: false, reason: 'plan_version' }, 'and stops its dispatch');
  t.match(
    await auditRows(f.pool, "action = 'invalidate'"),
    [
      { principal_id: 'editor-b', subject_id: other },
      { principal_id: 'editor-a', subject_id: pending },
    ],
    'each invalidation audited under its own principal',
  );
});

t.test("a principal that never reported a plan reads '-', whatever another reported", async (t) => {
  const f = await gateFixture(t);
  const task = { task_id: 'task-shared' };
  const reserved = await approveAndReserve(
    f,
    requestId(await f.gate.call(editorA({ ...task, workflow_step_id: 'a-1' }), 'update_document', publish)),
  );
  // B reports a plan for the same task id first, then A asks for a second approval without one.
  await f.gate.call(editorB({ ...task, plan_version: 'p9', workflow_step_id: 'b-1' }), 'update_document', review);
  const second = requestId(await f.gate.call(editorA({ ...task, workflow_step_id: 'a-2' }), 'update_document', review));
  const { rows } = await f.pool.query<{ plan: string }>(
    "SELECT envelope_json->>'plan_version' AS plan FROM actionledger.gate_approvals WHERE approval_id = $1",
    [second],
  );
  t.equal(rows[0]?.plan, '-', "A's envelope binds A's plan (none), not B's p9");
  t.same(await decision(f, reserved), { allow: true, reason: 'approval' }, "no row for A: '-' still holds");
  t.same(await decision(f, await approveAndReserve(f, second)), { allow: true, reason: 'approval' });
});

t.test('an approval approved but not executed is checked at execute against its own plan only', async (t) => {
  const f = await gateFixture(t);
  const task = { task_id: 'task-k' };
  const id = requestId(
    await f.gate.call(editorA({ ...task, plan_version: 'p1', workflow_step_id: 'a-1' }), 'update_document', publish),
  );
  await f.gate.engageKillSwitch('tenant-a', 'update_document', 'oncall', 'hold it');
  const view = await f.gate.approvals.show(id, { tenant_id: 'tenant-a' });
  t.match(await f.gate.approve(id, view.envelope_sha256, reviewer('supervisor-1')), {
    ok: false,
    error: 'tool_disabled',
  });
  t.same(await approvalStatus(f, id), { status: 'approved', reason: null }, 'approved, waiting for the switch');
  await f.gate.liftKillSwitch('tenant-a', 'update_document', 'oncall');
  requestId(
    await f.gate.call(editorB({ ...task, plan_version: 'p2', workflow_step_id: 'b-1' }), 'update_document', review),
  );
  t.same(await approvalStatus(f, id), { status: 'approved', reason: null }, 'still approved');
  const r = await f.gate.approvals.execute(id, reviewer('supervisor-1'));
  t.match(r, { ok: true, status: 'reserved' }, "B's plan is not A's: the envelope still holds");
});

t.test('migration 0017 gives each existing plan to the principals of its task and drops the rest', async (t) => {
  const url = await createTestDatabase(t, { empty: true });
  const c = new pg.Client({ connectionString: url });
  // The database is dropped WITH (FORCE) at teardown: a connection still open then gets an 'error' event.
  c.on('error', () => undefined);
  await c.connect();
  t.teardown(() => c.end());
  const all = readMigrations();
  const v17 = all.findIndex((m) => m.version === 17);
  t.equal(all[v17]?.name, 'task_plans_by_principal');
  await migrate(c, 'm', '"m"', all.slice(0, v17));
  await c.query('SET search_path TO m');
  await c.query("SELECT set_config('actionledger.notifications', 'off', false)");
  const sha = 'a'.repeat(64);
  await c.query(
    `INSERT INTO gate_task_plans (tenant_id, task_id, plan_version, updated_at) VALUES
       ('tenant-a', 'solo', 'p1', '2026-01-01T00:00:00Z'),
       ('tenant-a', 'shared', 'p7', '2026-01-02T00:00:00Z'),
       ('tenant-a', 'orphan', 'p3', '2026-01-03T00:00:00Z'),
       ('tenant-b', 'solo', 'q1', '2026-01-04T00:00:00Z')`,
  );
  const approval = (id: string, tenant: string, requester: string, task: string, plan: string) =>
    c.query(
      `INSERT INTO gate_approvals (approval_id, tenant_id, requester_id, requester_role, account_id, conversation_id,
         trace_id, task_id, workflow_step_id, tool_name, arguments_json, args_sha256, plan_version, policy_version,
         envelope_json, envelope_sha256, status, expires_at)
       VALUES ($1, $2, $3, 'editor', 'acct', 'conv', 'trace', $4, 'step', 'update_document', '{}', $5, $6, 'pol',
         '{}', $5, 'pending', now() + interval '1 hour')`,
      [id, tenant, requester, task, sha, plan],
    );
  await approval('00000000-0000-4000-8000-000000000001', 'tenant-a', 'editor-a', 'solo', 'p1');
  await approval('00000000-0000-4000-8000-000000000002', 'tenant-a', 'editor-a', 'shared', 'p7');
  await approval('00000000-0000-4000-8000-000000000003', 'tenant-b', 'editor-z', 'solo', 'q1');
  await c.query(
    `INSERT INTO gate_proposals (proposal_id, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
       trace_id, task_id, workflow_step_id, tool_name, arguments_json, args_sha256, token_sha256, policy_version,
       status, expires_at)
     VALUES ('00000000-0000-4000-8000-000000000004', 'tenant-a', 'agent-b', 'agent', 'acct', 'conv', 't1', 'trace',
       'shared', 'step', 'send_email', '{}', $1, $1, 'pol', 'proposed', now() + interval '1 hour')`,
    [sha],
  );
  await c.query(
    `INSERT INTO operations (operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id,
       tool_name, tenant_id, provider_id, provider_endpoint, idempotency_header, canonical_args_sha256,
       arguments_json, current_approval_id, current_policy_version, status)
     VALUES ('00000000-0000-4000-8000-000000000005', 'v1.k1.x', 'k1', 'service-c', 'shared', 'step', 'issue_refund',
       'tenant-a', 'billing', 'https://localhost/x', 'Idempotency-Key', $1, '{}', 'auto', 'pol', 'pending')`,
    [sha],
  );
  await migrate(c, 'm', '"m"', all);
  const { rows } = await c.query<Record<string, string>>(
    `SELECT tenant_id, principal_id, task_id, plan_version, updated_at::text AS updated_at FROM gate_task_plans
     ORDER BY tenant_id, task_id, principal_id`,
  );
  t.same(
    rows.map((r) => [r.tenant_id, r.principal_id, r.task_id, r.plan_version]),
    [
      ['tenant-a', 'agent-b', 'shared', 'p7'],
      ['tenant-a', 'editor-a', 'shared', 'p7'],
      ['tenant-a', 'service-c', 'shared', 'p7'],
      ['tenant-a', 'editor-a', 'solo', 'p1'],
      ['tenant-b', 'editor-z', 'solo', 'q1'],
    ],
    'a shared row to each of its principals, a sole one to its principal, an orphan dropped, tenants apart',
  );
  t.ok(
    rows.filter((r) => r.task_id === 'shared').every((r) => (r.updated_at ?? '').startsWith('2026-01-02')),
    'the time it was reported kept',
  );
  await t.rejects(
    c.query(
      "INSERT INTO gate_task_plans (tenant_id, principal_id, task_id, plan_version) VALUES ('tenant-a', 'editor-a', 'solo', 'x')",
    ),
    { code: '23505' },
    'keyed by (tenant, principal, task)',
  );
});
