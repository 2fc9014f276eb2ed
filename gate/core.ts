/**
 * The parts the pipeline, proposals and approvals share, built once per gate from its dependencies:
 *
 *   registry    -> tools, business validators, resource resolvers (gate/registry.ts)
 *   access      -> role table, revocations, kill switches (gate/access.ts)
 *   admission   -> a call's revocation, kill switch, rate window, caps and plan in one statement (gate/admission.ts)
 *   budgets     -> holds: what a proposal, approval or operation keeps of the caps (gate/budgets.ts)
 *   reservation -> the ledger reservation in the gate's own transaction (gate/reservation.ts)
 *   audit       -> the audit writer, failing closed (gate/audit.ts)
 *   failures    -> how a failed decision is coded and logged (gate/failures.ts)
 *
 * The checks that need no database are plain functions (gate/checks.ts), as are redaction and text
 * sanitising (gate/redaction.ts).
 */
import type { Config, GateTool } from '../config/index.js';
import { bindQueries, prepared, type Pool } from '../db/index.js';
import { createLogger, type Logger } from '../core/log.js';
import type { Metrics } from '../core/metrics.js';
import type { Ledger } from '../ledger/index.js';
import { AccessChecks } from './access.js';
import { AuditWriter } from './audit.js';
import { Budgets } from './budgets.js';
import { DecisionFailures } from './failures.js';
import { gateQueries, type GateNamedStatements } from './queries.js';
import { GateRegistry } from './registry.js';
import { ReservationStep } from './reservation.js';
import type { BusinessValidator, GateResult, ResourceResolver } from './types.js';

export interface GateDeps {
  config: Config;
  pool: Pool;
  ledger: Ledger;
  validators?: Readonly<Record<string, BusinessValidator>>;
  resolvers?: Readonly<Record<string, ResourceResolver>>;
  /** The authorization service never runs business validators, so it need not register them. */
  withoutValidators?: boolean;
  /**
   * The operator CLI has no resolvers: approving a tool that binds resources is then refused with
   * `config_invalid` (before the vote is recorded) instead of refusing to start.
   */
  withoutResolvers?: boolean;
  /** Where lost audit rows and database failures are logged; default: warnings and errors to stderr. */
  log?: Logger;
  /** Counts lost audit rows (`actionledger_audit_lost_total`); without it they are counted unexposed. */
  metrics?: Pick<Metrics, 'auditLost'>;
  /** The audit writer to use instead of a new one (the command line's marks its break-glass rows). */
  audit?: AuditWriter;
}

/** The default logger of the gate's parts: warnings and errors to stderr. */
export function gateLogger(log: Logger | undefined): Logger {
  return log ?? createLogger({ level: 'warn', name: 'actionledger-gate', destination: process.stderr });
}

export class GateCore {
  readonly config: Config;
  readonly pool: Pool;
  readonly ledger: Ledger;
  readonly q: Readonly<typeof gateQueries>;
  /** A call's statements as named statements (gate/admission.ts). */
  readonly named: GateNamedStatements;
  readonly log: Logger;
  readonly registry: GateRegistry;
  readonly access: AccessChecks;
  readonly budgets: Budgets;
  readonly reservation: ReservationStep;
  readonly audit: AuditWriter;
  readonly failures: DecisionFailures;

  /** Throws `config_invalid` when a configured validator or resource resolver is not registered. */
  constructor(deps: GateDeps) {
    this.config = deps.config;
    this.pool = deps.pool;
    this.ledger = deps.ledger;
    this.log = gateLogger(deps.log);
    this.q = bindQueries(gateQueries, deps.config.schemaQuoted);
    this.named = Object.freeze({
      gateAdmitAccess: prepared(this.q.gateAdmitAccess),
      gateAdmit: prepared(this.q.gateAdmit),
      gateOperationRecord: prepared(this.q.gateOperationRecord),
    });
    this.registry = new GateRegistry(deps.config, deps);
    this.access = new AccessChecks(deps.config, this.q);
    this.budgets = new Budgets(this.q);
    this.audit =
      deps.audit ?? new AuditWriter({ config: deps.config, pool: deps.pool, log: this.log, metrics: deps.metrics });
    this.reservation = new ReservationStep(deps.ledger, this.q, this.named, this.budgets, this.audit);
    this.failures = new DecisionFailures(this.log);
  }

  tool(name: string): GateTool | undefined {
    return this.registry.tool(name);
  }

  /**
   * After a decision's transaction committed: wakes the dispatchers when it reserved a new operation (the
   * gate reserves without a NOTIFY in its transaction, whose commits PostgreSQL would otherwise serialize).
   */
  wakeIfReserved(result: GateResult): void {
    if (result.ok && result.created === true) this.ledger.wake(result.operation_id);
  }
}
