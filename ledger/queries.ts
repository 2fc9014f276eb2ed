/**
 * The ledger's SQL, as fixed text with `$n` parameters. `@schema.` is bound once at start (db/db.ts).
 * Each reservation is one statement: ledger row, outbox row and history row commit together or not at all.
 */
import { transitionCte } from './transitions.js';

const reserveCte = `
  WITH ins AS (
    INSERT INTO @schema.operations (
      operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name, tenant_id,
      provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
      current_approval_id, current_policy_version, status, trace_context)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14, $15, 'pending', $17::text)
    ON CONFLICT (tenant_id, principal_id, task_id, workflow_step_id) DO NOTHING
    RETURNING operation_id, effect_key, status, provider_receipt
  ), outbox AS (
    INSERT INTO @schema.outbox (operation_id, attempt) SELECT operation_id, 1 FROM ins
  ), history AS (
    INSERT INTO @schema.operation_history (operation_id, from_status, to_status, actor, reason)
    SELECT operation_id, NULL, 'pending', $16, 'reserved' FROM ins
  )`;

export const ledgerQueries = {
  ledgerInsertReservation: `${reserveCte}
    SELECT operation_id, effect_key, status, provider_receipt FROM ins`,

  /** The same, plus a NOTIFY that PostgreSQL delivers when the caller's own transaction commits. */
  ledgerInsertReservationNotify: `${reserveCte}, wake AS (SELECT pg_notify($18, '') FROM ins)
    SELECT operation_id, effect_key, status, provider_receipt, (SELECT count(*) FROM wake) AS woke FROM ins`,

  ledgerSelectByIdentity: `
    SELECT operation_id, effect_key, status, tool_name, tenant_id, canonical_args_sha256, provider_id,
           provider_endpoint, idempotency_header, current_approval_id, current_policy_version, provider_receipt
    FROM @schema.operations
    WHERE tenant_id = $1 AND principal_id = $2 AND task_id = $3 AND workflow_step_id = $4`,

  /** Records a refreshed approval / policy version on a still-pending operation; identity and key unchanged. */
  ledgerUpdateAuthorizationContext: `
    WITH ${transitionCte({
      name: 'upd',
      input: '(SELECT $1::uuid AS operation_id) i',
      from: "'pending'",
      to: "'pending'",
      fence: '(l.current_approval_id, l.current_policy_version) IS DISTINCT FROM ($2, $3)',
      set: 'current_approval_id = $2, current_policy_version = $3',
      actor: '$4',
      reason: "'authorization_context_updated'",
      detail: "jsonb_build_object('approval_id', $2::text, 'policy_version', $3::text)",
      returning: 'l.status',
    })}
    SELECT status FROM upd`,

  ledgerSelectStatus: `SELECT status FROM @schema.operations WHERE operation_id = $1`,

  ledgerSelectOperation: `
    SELECT operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name, tenant_id,
           provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
           current_approval_id, current_policy_version, status, attempt, claimed_by, claimed_at,
           provider_receipt, result_json, review_reason, created_at, updated_at, trace_context
    FROM @schema.operations WHERE operation_id = $1`,

  historySelectByOperation: `
    SELECT id, from_status, to_status, at, actor, reason, detail
    FROM @schema.operation_history WHERE operation_id = $1 ORDER BY id`,

  ledgerCountByStatus: `SELECT status, count(*)::bigint AS n FROM @schema.operations GROUP BY status`,

  outboxOldestPending: `
    SELECT extract(epoch FROM now() - min(o.created_at))::float8 AS oldest_s, count(*)::bigint AS depth
    FROM @schema.outbox o`,
} as const;

/**
 * Reads scoped to one tenant, for the HTTP API (ledger/tenant-view.ts), and the direct path's guard
 * (ledger/direct.ts). Listing walks `operations_tenant_created_idx` (sql/0009_operations_listing.sql): the
 * caller's tenant only, newest first, keyset-paged on (created_at, operation_id); the cursor's time travels as
 * whole microseconds since the epoch, so no precision is lost on the way through JavaScript.
 */
const tenantListColumns = `
    SELECT operation_id, tenant_id, principal_id, task_id, workflow_step_id, tool_name, provider_id, status, attempt,
           current_approval_id, current_policy_version, review_reason, created_at, updated_at,
           (extract(epoch FROM created_at) * 1000000)::bigint::text AS cursor_us
    FROM @schema.operations
    WHERE tenant_id = $1
      AND ($2::text IS NULL OR status = $2)
      AND ($3::text IS NULL OR tool_name = $3)
      AND ($4::text IS NULL OR task_id = $4)
      AND ($5::text IS NULL OR principal_id = $5)`;

export const ledgerTenantQueries = {
  tenantSelectOperation: `
    SELECT operation_id, effect_key, effect_key_id, principal_id, task_id, workflow_step_id, tool_name, tenant_id,
           provider_id, provider_endpoint, idempotency_header, canonical_args_sha256, arguments_json,
           current_approval_id, current_policy_version, status, attempt, claimed_by, claimed_at,
           provider_receipt, result_json, review_reason, created_at, updated_at
    FROM @schema.operations WHERE operation_id = $1 AND tenant_id = $2`,

  /** What the dispatcher was told by the authorization service before each send ($2: the tenant). */
  tenantEvidence: `
    SELECT e.attempt, e.approval_id, e.policy_version, e.args_sha256, e.decision_sha256, e.authorized_at,
           e.expires_at, e.recorded_at
    FROM @schema.authorization_evidence e JOIN @schema.operations o ON o.operation_id = e.operation_id
    WHERE e.operation_id = $1 AND o.tenant_id = $2 ORDER BY e.recorded_at, e.attempt`,

  /** Every provider readback the reconciler made for the operation ($2: the tenant). */
  tenantReconcileChecks: `
    SELECT c.attempt, c.from_status, c.outcome, c.at, c.actor, c.detail
    FROM @schema.reconciliation_checks c JOIN @schema.operations o ON o.operation_id = c.operation_id
    WHERE c.operation_id = $1 AND o.tenant_id = $2 ORDER BY c.id`,

  /** The first page: $6 is the page size plus one (the extra row says whether there is a next page). */
  tenantListFirst: `${tenantListColumns}
    ORDER BY created_at DESC, operation_id DESC
    LIMIT $6`,

  /** The page after the cursor ($7 microseconds since the epoch, $8 operation id). */
  tenantListAfter: `${tenantListColumns}
      AND (created_at, operation_id) < (timestamptz 'epoch' + $7::bigint * interval '1 microsecond', $8::uuid)
    ORDER BY created_at DESC, operation_id DESC
    LIMIT $6`,

  /** Whether the gate reserved this operation (its record in gate_operations). */
  gateRecordedOperation: `SELECT 1 FROM @schema.gate_operations WHERE operation_id = $1`,
} as const;
