/**
 * The reservation step: the operation reserved through the ledger on the gate's client, so the budgets, the
 * gate's record of the operation and the audit row commit (or roll back) in one transaction. After the ledger's
 * statement, one more: the gate's record of the operation with the holds of a call that became it and, for a
 * call, its audit row (`gateOperationRecord`), instead of three statements, each a round trip and a plan.
 */
import type { Queryable } from '../db/index.js';
import { auditUnavailable, type AuditEntry, type AuditWriter } from './audit.js';
import type { JsonObject } from '../core/json.js';
import type { Ledger, Reservation } from '../ledger/index.js';
import type { Budgets } from './budgets.js';
import type { Value } from './checks.js';
import type { GateNamedStatements, gateQueries } from './queries.js';
import { refuse } from './refusal.js';

export interface ReservingContext {
  tenant_id: string;
  principal_id: string;
  task_id: string;
  workflow_step_id: string;
  role: string;
}

export class ReservationStep {
  readonly #ledger: Ledger;
  readonly #q: Readonly<typeof gateQueries>;
  readonly #named: GateNamedStatements;
  readonly #budgets: Budgets;
  readonly #audit: AuditWriter;

  constructor(
    ledger: Ledger,
    q: Readonly<typeof gateQueries>,
    named: GateNamedStatements,
    budgets: Budgets,
    audit: AuditWriter,
  ) {
    this.#ledger = ledger;
    this.#q = q;
    this.#named = named;
    this.#budgets = budgets;
    this.#audit = audit;
  }

  /**
   * Reserves the operation through the ledger on the gate's client (one transaction with the budgets and the
   * audit row), records the gate's view of it, and moves the subject's holds to it. A replayed step
   * (`created: false`) gives back what this call took: the effect exists once, so it is counted once.
   * Throws the ledger's coded errors (`operation_conflict` for the caller's own step reserved with other
   * arguments; the identity includes the tenant, so another tenant's steps never conflict); a replay of a step
   * reserved outside the gate is refused `operation_conflict`. With `audit`, the decision's audit row (about the
   * operation reserved) is written in the gate's record statement; when that statement fails the decision is
   * refused `audit_unavailable` (thrown), as {@link AuditWriter.decision} does. With `named`, the record is the
   * named statement (planned once per pool connection; see gate/admission.ts for when it is not).
   */
  async reserve(
    db: Queryable,
    ctx: ReservingContext,
    tool: string,
    args: JsonObject,
    approval: { kind: 'auto' | 'proposal' | 'approval'; id: string; policyVersion: string },
    taken: { counters: string[]; value: Value | null; subject?: { proposal?: string; approval?: string } },
    recording: { audit?: (operationId: string) => AuditEntry; named?: boolean } = {},
  ): Promise<Reservation> {
    const r = await this.#ledger.reserve(
      {
        tenant_id: ctx.tenant_id,
        principal_id: ctx.principal_id,
        task_id: ctx.task_id,
        workflow_step_id: ctx.workflow_step_id,
        approval_id: approval.id,
        policy_version: approval.policyVersion,
      },
      tool,
      args,
      // The gate's caller wakes the dispatchers once the decision has committed (GateCore.wakeIfReserved).
      // Named as the gate's own statements are, on the same connection of the library's pool.
      { client: db, actor: `gate:${ctx.principal_id}`, notifyOnCommit: false, named: recording.named === true },
    );
    const subject = taken.subject;
    // A new operation of a call keeps what the call took; a proposal's or approval's holds move to it below.
    const held = r.created && subject === undefined ? taken.counters : [];
    const { audit, named = false } = recording;
    let recorded: number;
    try {
      const row = audit === undefined ? null : this.#audit.params(audit(r.operation_id));
      const { rows } = await db.query<{ recorded: number }>({
        ...(named ? this.#named.gateOperationRecord : { text: this.#q.gateOperationRecord }),
        values: [
          r.operation_id,
          ctx.tenant_id,
          ctx.principal_id,
          ctx.role,
          approval.kind,
          held,
          taken.value?.amount ?? '0',
          row !== null,
          ...(row ?? Array.from({ length: 14 }, () => null)),
        ],
      });
      recorded = rows[0]?.recorded ?? 0;
    } catch (err) {
      throw audit === undefined ? err : auditUnavailable(err);
    }
    // A replay whose operation the gate never recorded was reserved straight through the ledger (the trusted
    // path, no gate checks): taking it over would make it dispatchable under `direct_reservations: deny`
    // without its caps. Refused; the caller's transaction rolls back whatever the ledger's replay rebound.
    if (!r.created && recorded === 1) {
      throw refuse(
        'operation_conflict',
        'this workflow step was reserved outside the gate (a direct reservation); use another workflow_step_id',
      );
    }
    if (r.created) {
      if (subject !== undefined) await this.#budgets.transferHolds(db, subject, r.operation_id);
    } else if (subject !== undefined) {
      await this.#budgets.releaseHolds(db, subject, 'replayed_step');
    } else {
      await this.#budgets.giveBack(db, taken.counters, taken.value);
    }
    return r;
  }
}
