/**
 * The gate's SQL, fixed text with `$n` parameters; `@schema.` is bound once at start (db/db.ts).
 * Budgets are taken by single conditional upserts, state changes by single conditional UPDATEs.
 */
const approvalColumns = `approval_id, tenant_id, requester_id, requester_role, account_id, conversation_id, trace_id,
  task_id, workflow_step_id, tool_name, arguments_json, args_sha256, resources, plan_version, policy_version,
  envelope_json, envelope_sha256, status, required_approvals, approvers, reason, operation_id, created_at,
  expires_at, expires_at <= now() AS expired`;

const proposalColumns = `proposal_id, tenant_id, principal_id, role, account_id, conversation_id, turn_id, trace_id,
  task_id, workflow_step_id, tool_name, arguments_json, args_sha256, policy_version, status, operation_id,
  expires_at, expires_at <= now() AS expired`;

export const gateQueries = {
  /**
   * The admission of a call that takes no budget (no rate, no caps, no plan version): whether the role ($3) of
   * the principal ($2) in the tenant ($1) is revoked, and the reason of a kill switch covering the tool ($4).
   */
  gateAdmitAccess: `
    SELECT EXISTS (
             SELECT 1 FROM @schema.gate_role_revocations WHERE tenant_id = $1 AND principal_id = $2 AND role = $3
           ) AS revoked,
           (SELECT reason FROM @schema.gate_kill_switches
            WHERE tenant_id IN ($1, '*') AND tool_name IN ($4, '*') LIMIT 1) AS kill_reason`,

  /**
   * A call's admission (gate/admission.ts), one statement: the role revocation ($1 tenant, $2 principal, $3
   * role), the kill switch ($4 tool), then, only while those pass, one call from the principal's rate window
   * (window $5 s, limit $6; none when $5 is null), aligned to multiples of $5 s since the epoch by the database
   * clock and incremented only while under the limit; then, only while the window had room, one unit and $16
   * of value on each cap ($11 scopes, $12 keys, $13 count caps, $14 value caps; null = no cap), each counter one
   * per (tenant, tool, scope, key, period) in the caps' currency $15 (0005), taken by a conditional upsert in
   * the order given, unless the step ($8 task, $9 step) was reserved before with this tool and these arguments
   * ($10; looked up only when $7); and the plan version $17 of the principal's task, whose change invalidates
   * that principal's pending or approved approvals of the task bound to another version (their holds released
   * by trigger). A cap missing from cap_scopes would be exceeded: nothing was taken from it.
   */
  gateAdmit: `
    WITH revoked AS (
      SELECT EXISTS (
        SELECT 1 FROM @schema.gate_role_revocations WHERE tenant_id = $1 AND principal_id = $2 AND role = $3
      ) AS revoked
    ), killed AS (
      SELECT reason FROM @schema.gate_kill_switches WHERE tenant_id IN ($1, '*') AND tool_name IN ($4, '*') LIMIT 1
    ), open AS (
      SELECT 1 FROM revoked WHERE NOT revoked AND NOT EXISTS (SELECT 1 FROM killed)
    ), rate AS (
      INSERT INTO @schema.gate_rate_windows AS w (tenant_id, principal_id, tool_name, window_start, window_s, used)
      SELECT $1, $2, $4, to_timestamp(floor(extract(epoch FROM now()) / $5::int) * $5::int), $5::int, 1
      FROM open WHERE $5::int IS NOT NULL
      ON CONFLICT (tenant_id, principal_id, tool_name, window_start) DO UPDATE SET used = w.used + 1
      WHERE w.used < $6::int
      RETURNING used
    ), passed AS (
      SELECT 1 FROM open WHERE $5::int IS NULL OR EXISTS (SELECT 1 FROM rate)
    ), prior AS (
      SELECT 1 FROM @schema.operations
      WHERE $7::boolean AND tenant_id = $1 AND principal_id = $2 AND task_id = $8 AND workflow_step_id = $9
        AND tool_name = $4 AND canonical_args_sha256 = $10
    ), cap AS (
      SELECT * FROM unnest($11::text[], $12::text[], $13::int[], $14::numeric[]) WITH ORDINALITY
        AS l(scope, scope_key, max_count, max_value, n)
    ), caps AS (
      INSERT INTO @schema.gate_counters AS c (tenant_id, tool_name, scope, scope_key, period, currency, used_count, used_value)
      SELECT $1, $4, l.scope, l.scope_key,
             CASE WHEN l.scope = 'conversation' THEN 'all' ELSE to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') END,
             $15, 1, $16::numeric
      FROM cap l
      WHERE EXISTS (SELECT 1 FROM passed) AND NOT EXISTS (SELECT 1 FROM prior)
        AND (l.max_count IS NULL OR 1 <= l.max_count) AND (l.max_value IS NULL OR $16::numeric <= l.max_value)
      ORDER BY l.n
      ON CONFLICT (tenant_id, tool_name, scope, scope_key, period) DO UPDATE
      SET used_count = c.used_count + 1, used_value = c.used_value + excluded.used_value
      WHERE (SELECT (l.max_count IS NULL OR c.used_count + 1 <= l.max_count)
                AND (l.max_value IS NULL OR c.used_value + excluded.used_value <= l.max_value)
             FROM cap l WHERE l.scope = c.scope)
      RETURNING c.scope, c.counter_id
    ), plan AS (
      INSERT INTO @schema.gate_task_plans AS p (tenant_id, principal_id, task_id, plan_version)
      SELECT $1, $2, $8, $17 FROM passed WHERE $17::text IS NOT NULL
      ON CONFLICT (tenant_id, principal_id, task_id) DO UPDATE SET plan_version = excluded.plan_version, updated_at = now()
      WHERE p.plan_version <> excluded.plan_version
      RETURNING plan_version
    ), invalidated AS (
      UPDATE @schema.gate_approvals a SET status = 'invalidated', reason = 'plan_changed', decided_at = now()
      FROM plan
      WHERE a.tenant_id = $1 AND a.requester_id = $2 AND a.task_id = $8 AND a.status IN ('pending', 'approved')
        AND a.plan_version <> plan.plan_version
      RETURNING a.approval_id
    )
    SELECT (SELECT revoked FROM revoked) AS revoked,
           (SELECT reason FROM killed) AS kill_reason,
           (SELECT used FROM rate) AS rate_used,
           CASE WHEN $5::int IS NOT NULL THEN greatest(1, ceil(extract(epoch FROM
             to_timestamp((floor(extract(epoch FROM now()) / $5::int) + 1) * $5::int) - now())))::int END AS retry_after_s,
           EXISTS (SELECT 1 FROM prior) AS replay,
           (SELECT array_agg(scope ORDER BY scope) FROM caps) AS cap_scopes,
           (SELECT array_agg(counter_id::text ORDER BY scope) FROM caps) AS counter_ids,
           (SELECT array_agg(approval_id::text) FROM invalidated) AS invalidated`,

  /** Rate windows that ended over a minute ago: nothing reads them again, so the table stays bounded. */
  rateWindowPrune: `
    DELETE FROM @schema.gate_rate_windows WHERE window_start + make_interval(secs => window_s) < now() - interval '1 minute'`,

  /** Gives back what this call took on counters $1 (a replayed reservation consumes nothing). */
  counterGiveBack: `
    UPDATE @schema.gate_counters SET used_count = used_count - 1, used_value = used_value - $2::numeric
    WHERE counter_id = ANY($1::bigint[])`,

  holdInsert: `
    INSERT INTO @schema.gate_cap_holds (counter_id, amount, count, proposal_id, approval_id, operation_id)
    SELECT unnest($1::bigint[]), $2::numeric, 1, $3::uuid, $4::uuid, $5::uuid`,

  holdTransfer: `
    UPDATE @schema.gate_cap_holds SET operation_id = $3
    WHERE released_at IS NULL AND operation_id IS NULL
      AND (proposal_id = $1::uuid OR approval_id = $2::uuid)`,

  /** Releases the open holds of a subject without changing its state (a replayed step). */
  holdRelease: `SELECT @schema.gate_release_holds($1, $2::uuid, $3)`,

  /** Counters an approval holds that today's caps ($2 count, $3 value per scope) no longer admit. */
  holdCountersOf: `
    SELECT c.scope, c.used_count, c.used_value::text AS used_value
    FROM @schema.gate_cap_holds h JOIN @schema.gate_counters c ON c.counter_id = h.counter_id
    WHERE h.approval_id = $1 AND h.released_at IS NULL`,

  killSwitchEngaged: `
    SELECT tenant_id, tool_name, reason FROM @schema.gate_kill_switches
    WHERE tenant_id IN ($1, '*') AND tool_name IN ($2, '*') LIMIT 1`,
  /** The pending operations a kill switch covers (it holds them), counted in the transaction that engages it. */
  killSwitchPending: `
    SELECT count(DISTINCT l.operation_id)::int AS n
    FROM @schema.outbox o JOIN @schema.operations l ON l.operation_id = o.operation_id
    WHERE l.status = 'pending' AND ($1 = '*' OR l.tenant_id = $1) AND ($2 = '*' OR l.tool_name = $2)`,
  /** The executing operations a kill switch covers, read after it was engaged (listed in operation_claims). */
  killSwitchInFlight: `
    SELECT l.operation_id
    FROM @schema.operation_claims c JOIN @schema.operations l ON l.operation_id = c.operation_id
    WHERE l.status = 'executing' AND ($1 = '*' OR l.tenant_id = $1) AND ($2 = '*' OR l.tool_name = $2)
    ORDER BY l.operation_id`,
  /**
   * Waits for one operation's row lock and lets go of it at once (its own statement, autocommit). A dispatch
   * batch holds its rows' locks from its final check until its outcomes commit, so this returns when a request
   * that was already at the provider has its outcome recorded, and at once for an operation not being sent.
   */
  killSwitchAwaitOperation: `SELECT status FROM @schema.operations WHERE operation_id = $1 FOR SHARE`,
  killSwitchEngage: `
    INSERT INTO @schema.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ($1, $2, $3, $4)
    ON CONFLICT (tenant_id, tool_name) DO UPDATE SET engaged_by = excluded.engaged_by, reason = excluded.reason, engaged_at = now()`,
  killSwitchLift: `DELETE FROM @schema.gate_kill_switches WHERE tenant_id = $1 AND tool_name = $2 RETURNING tenant_id`,
  killSwitchList: `SELECT tenant_id, tool_name, engaged_at, engaged_by, reason FROM @schema.gate_kill_switches ORDER BY engaged_at`,

  roleRevoked: `SELECT 1 FROM @schema.gate_role_revocations WHERE tenant_id = $1 AND principal_id = $2 AND role = $3`,
  roleRevoke: `
    INSERT INTO @schema.gate_role_revocations (tenant_id, principal_id, role, revoked_by) VALUES ($1, $2, $3, $4)
    ON CONFLICT DO NOTHING`,
  roleRestore: `DELETE FROM @schema.gate_role_revocations WHERE tenant_id = $1 AND principal_id = $2 AND role = $3`,

  /**
   * The votes of a revoked approver ($2, role $3, tenant $1) on approvals still pending stop counting: the
   * approver and the role they voted with leave both arrays, which stay aligned. A vote whose role is unknown
   * (recorded before roles were) is withdrawn on any revocation of that approver: it may have been that role.
   * Approved approvals are not changed here; the authorization service and the dispatcher's final check refuse
   * their operations while an approver's role is revoked. Returns the approvals changed.
   */
  pendingVotesWithdraw: `
    UPDATE @schema.gate_approvals a
    SET approvers = v.approvers, approver_roles = v.roles
    FROM (
      SELECT a2.approval_id,
             coalesce(array_agg(x.who ORDER BY x.i) FILTER (WHERE x.keep), '{}') AS approvers,
             coalesce(array_agg(x.r ORDER BY x.i) FILTER (WHERE x.keep), '{}') AS roles
      FROM @schema.gate_approvals a2
      CROSS JOIN LATERAL (
        SELECT u.who, u.r, u.i, NOT (u.who = $2 AND (u.r IS NULL OR u.r = $3)) AS keep
        FROM unnest(a2.approvers, a2.approver_roles) WITH ORDINALITY AS u(who, r, i)
        WHERE u.who IS NOT NULL
      ) x
      WHERE a2.tenant_id = $1 AND a2.status = 'pending' AND $2 = ANY (a2.approvers)
      GROUP BY a2.approval_id
    ) v
    WHERE a.approval_id = v.approval_id AND a.status = 'pending' AND cardinality(v.approvers) <> cardinality(a.approvers)
    RETURNING a.approval_id`,

  /** The current plan version of the principal's task ($1 tenant, $2 principal, $3 task); no row: none reported. */
  planCurrent: `SELECT plan_version FROM @schema.gate_task_plans WHERE tenant_id = $1 AND principal_id = $2 AND task_id = $3`,

  /**
   * The gate's record of an operation it reserved ($1; tenant $2, principal $3, role $4, approval kind $5), one
   * statement with the holds the call keeps on its counters ($6, one unit and $7 of value each; none when
   * empty) and, when $8, the decision's audit row ($9..$22 as in `auditInsert`). Returns `recorded`: 0 when the
   * gate had recorded the operation before (a replay of its own step).
   */
  gateOperationRecord: `
    WITH rec AS (
      INSERT INTO @schema.gate_operations (operation_id, tenant_id, principal_id, role, approval_kind)
      VALUES ($1, $2, $3, $4, $5) ON CONFLICT (operation_id) DO NOTHING RETURNING operation_id
    ), held AS (
      INSERT INTO @schema.gate_cap_holds (counter_id, amount, count, operation_id)
      SELECT unnest($6::bigint[]), $7::numeric, 1, $1::uuid
    ), audited AS (
      INSERT INTO @schema.gate_audit (action, outcome, tenant_id, principal_id, role, account_id, conversation_id,
        turn_id, trace_id, tool_name, subject_id, arguments, detail, duration_ms)
      SELECT $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20::jsonb, $21::jsonb, $22 WHERE $8::boolean
    )
    SELECT count(*)::int AS recorded FROM rec`,

  proposalInsert: `
    INSERT INTO @schema.gate_proposals (proposal_id, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
      trace_id, task_id, workflow_step_id, tool_name, arguments_json, args_sha256, token_sha256, policy_version, status,
      expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13, $14, $15, 'proposed',
            now() + make_interval(secs => $16))
    RETURNING expires_at`,
  proposalByToken: `SELECT ${proposalColumns} FROM @schema.gate_proposals WHERE token_sha256 = $1 AND tenant_id = $2 FOR UPDATE`,
  proposalById: `SELECT ${proposalColumns} FROM @schema.gate_proposals WHERE proposal_id = $1 AND tenant_id = $2 FOR UPDATE`,
  proposalExpire: `
    UPDATE @schema.gate_proposals SET status = 'expired', ended_at = now()
    WHERE proposal_id = $1 AND status IN ('proposed', 'confirmed') AND expires_at <= now() RETURNING proposal_id`,
  /**
   * Housekeeping: proposals past their TTL still open (abandoned: nobody confirmed, executed or cancelled
   * them) become `expired`, which releases the caps they hold (trigger gate_proposals_release). At most
   * 1000 a pass; rows another transaction holds are left for the next pass.
   */
  proposalExpireDue: `
    UPDATE @schema.gate_proposals SET status = 'expired', ended_at = now()
    WHERE proposal_id IN (
      SELECT proposal_id FROM @schema.gate_proposals
      WHERE status IN ('proposed', 'confirmed') AND expires_at <= now()
      ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
    AND status IN ('proposed', 'confirmed') AND expires_at <= now()
    RETURNING proposal_id, tenant_id, tool_name`,
  proposalConfirm: `
    UPDATE @schema.gate_proposals
    SET status = 'confirmed', confirmed_by = $2, confirmed_turn_id = $3, actor_mismatch = (principal_id <> $2), confirmed_at = now()
    WHERE proposal_id = $1 AND status = 'proposed' AND expires_at > now() AND turn_id <> $3
    RETURNING proposal_id`,
  proposalCancel: `
    UPDATE @schema.gate_proposals SET status = 'cancelled', ended_at = now()
    WHERE proposal_id = $1 AND status IN ('proposed', 'confirmed') RETURNING proposal_id`,
  proposalExecuted: `
    UPDATE @schema.gate_proposals SET status = 'executed', operation_id = $2, ended_at = now()
    WHERE proposal_id = $1 AND status = 'confirmed' AND expires_at > now() RETURNING proposal_id`,

  approvalInsert: `
    INSERT INTO @schema.gate_approvals (approval_id, tenant_id, requester_id, requester_role, account_id, conversation_id,
      trace_id, task_id, workflow_step_id, tool_name, arguments_json, args_sha256, resources, plan_version,
      policy_version, envelope_json, envelope_sha256, status, required_approvals, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13::jsonb, $14, $15, $16::jsonb, $17, 'pending',
            $18, $19, $20)`,
  approvalSelect: `SELECT ${approvalColumns} FROM @schema.gate_approvals WHERE approval_id = $1 AND tenant_id = $2`,
  approvalSelectForUpdate: `SELECT ${approvalColumns} FROM @schema.gate_approvals WHERE approval_id = $1 AND tenant_id = $2 FOR UPDATE`,
  /**
   * The approval itself: one conditional UPDATE that needs the id AND the hash the approver was shown, a
   * pending row inside its TTL, an approver who is not the requester and has not voted yet. The role the
   * approver voted with ($5) goes into `approver_roles` at the same position as the approver (a vote recorded
   * before that column existed is padded with NULL: its role is unknown). It becomes `approved` when the
   * required number of distinct approvers is reached. Exactly one row, or refused.
   */
  approvalApprove: `
    UPDATE @schema.gate_approvals
    SET approvers = approvers || $4::text,
        approver_roles = approver_roles
          || array_fill(NULL::text, ARRAY[greatest(cardinality(approvers) - cardinality(approver_roles), 0)])
          || $5::text,
        status = CASE WHEN cardinality(approvers) + 1 >= required_approvals THEN 'approved' ELSE 'pending' END,
        decided_at = CASE WHEN cardinality(approvers) + 1 >= required_approvals THEN now() ELSE decided_at END
    WHERE approval_id = $1 AND tenant_id = $2 AND envelope_sha256 = $3 AND status = 'pending' AND expires_at > now()
      AND requester_id <> $4 AND NOT ($4 = ANY (approvers))
    RETURNING status`,
  approvalReject: `
    UPDATE @schema.gate_approvals SET status = 'rejected', reason = $3, decided_at = now()
    WHERE approval_id = $1 AND tenant_id = $2 AND status IN ('pending', 'approved') AND expires_at > now()
    RETURNING approval_id`,
  approvalExpire: `
    UPDATE @schema.gate_approvals SET status = 'expired', decided_at = now()
    WHERE approval_id = $1 AND status IN ('pending', 'approved') AND expires_at <= now() RETURNING approval_id`,
  approvalExpireDue: `
    UPDATE @schema.gate_approvals SET status = 'expired', decided_at = now()
    WHERE status IN ('pending', 'approved') AND expires_at <= now()
    RETURNING approval_id, tenant_id, tool_name`,
  approvalInvalidate: `
    UPDATE @schema.gate_approvals SET status = 'invalidated', reason = $2, decided_at = now()
    WHERE approval_id = $1 AND status IN ('pending', 'approved') RETURNING approval_id`,
  approvalExecuted: `
    UPDATE @schema.gate_approvals SET status = 'executed', operation_id = $2
    WHERE approval_id = $1 AND status = 'approved' AND expires_at > now() RETURNING approval_id`,

  auditInsert: `
    INSERT INTO @schema.gate_audit (action, outcome, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
      trace_id, tool_name, subject_id, arguments, detail, duration_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb, $13::jsonb, $14)`,
  /** Many rows of `auditInsert` at once: one array per column ($12, $13 as text, cast per element). */
  auditInsertMany: `
    INSERT INTO @schema.gate_audit (action, outcome, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
      trace_id, tool_name, subject_id, arguments, detail, duration_ms)
    SELECT a, o, t, p, r, ac, cv, tu, tr, tn, s, args::jsonb, d::jsonb, ms
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
      $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::float8[])
      WITH ORDINALITY AS g(a, o, t, p, r, ac, cv, tu, tr, tn, s, args, d, ms, n)
    ORDER BY n`,
  /** The same row about an operation: the tenant and tool not given ($3, $10 null) are the operation's ($15). */
  auditInsertForOperation: `
    INSERT INTO @schema.gate_audit (action, outcome, tenant_id, principal_id, role, account_id, conversation_id, turn_id,
      trace_id, tool_name, subject_id, arguments, detail, duration_ms)
    SELECT $1, $2, COALESCE($3, o.tenant_id), $4, $5, $6, $7, $8, $9, COALESCE($10, o.tool_name), $11, $12::jsonb,
      $13::jsonb, $14
    FROM (SELECT 1) one LEFT JOIN @schema.operations o ON o.operation_id = $15::uuid`,

  /** What the built-in authorization service decides from: the operation as the ledger holds it, and the gate's record. */
  authorizeSelectOperation: `
    SELECT l.operation_id, l.effect_key, l.principal_id, l.task_id, l.workflow_step_id, l.tool_name, l.tenant_id,
           l.provider_id, l.canonical_args_sha256, l.current_approval_id, l.current_policy_version, l.arguments_json,
           g.role, g.approval_kind, now() AS db_now
    FROM @schema.operations l LEFT JOIN @schema.gate_operations g ON g.operation_id = l.operation_id
    WHERE l.operation_id = $1`,
  authorizeSelectApproval: `
    SELECT a.status, a.operation_id, a.args_sha256, a.resources, a.expires_at, a.expires_at > now() AS live,
           a.plan_version, coalesce(p.plan_version, '-') AS current_plan_version, a.approvers, a.approver_roles
    FROM @schema.gate_approvals a
    LEFT JOIN @schema.gate_task_plans p
      ON p.tenant_id = a.tenant_id AND p.principal_id = a.requester_id AND p.task_id = a.task_id
    WHERE a.approval_id::text = $1 AND a.tenant_id = $2`,
  authorizeSelectProposal: `
    SELECT status, operation_id FROM @schema.gate_proposals WHERE proposal_id::text = $1 AND tenant_id = $2`,
} as const;

/** The statements a call runs on every decision, each named once per pool connection (gate/admission.ts). */
export type GateNamedStatements = Readonly<
  Record<'gateAdmitAccess' | 'gateAdmit' | 'gateOperationRecord', { name: string; text: string }>
>;

export const gateOperationQueries = {
  operationSelect: `SELECT operation_id, effect_key, status FROM @schema.operations WHERE operation_id = $1`,
} as const;
