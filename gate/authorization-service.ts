/**
 * The built-in authorization service: the other side of the dispatcher's fresh authorization decision (the
 * wire format in protocol/authorization.ts), over mutual TLS, deciding from PostgreSQL at the moment of dispatch.
 *
 * `POST /v1/authorize` takes exactly the binding fields (strict JSON, each a non-empty string) and answers 200
 * with every field echoed, `decision` and `authorized_at` / `expires_at`. It allows only when:
 *   - the operation exists and every binding field matches the ledger row (arguments hash, approval id,
 *     policy version, route, identity);
 *   - no kill switch covers its tenant or tool;
 *   - for an operation the gate reserved: the policy version is the current one, the principal still holds
 *     a role the tool lists (and it was not revoked), and
 *       approval: the approval is approved (or executed into this very operation) and inside its TTL, the
 *                 task's current plan version is the one approved (`plan_version`), every approver still
 *                 holds the role they voted with (`approver_role_not_held`: one of the tool's approver roles,
 *                 not revoked; a vote whose role was never recorded counts as not held), and every bound
 *                 resource still has the approved version (operator-declared resolvers);
 *       proposal: the proposal was executed into this operation;
 *   - for a compensation the compensator minted (approval id `compensation:<original>`): while its original
 *     is `compensating`;
 *   - for an operation reserved straight through the ledger (a trusted service, not the gate): only when
 *     `gate.direct_reservations` is `allow`.
 * A kill switch covering the operation is answered 503 `tool_disabled` (audited `deferred`): no decision, so the
 * dispatcher gives the operation back to the queue, where it waits for the switch to be lifted. Every answer but
 * a 200 means "no decision": this service never denies because it could not decide.
 * A decision never outlives the approval it rests on. Every decision is audited (action `authorize`), and an
 * allow is answered only after its audit row is written: when it cannot be (a full disk, the database gone)
 * the answer is 503 `audit_unavailable`: no decision, so nothing is sent and the dispatcher asks again later. A deny
 * whose row cannot be written is still a deny; it is logged and counted (`actionledger_audit_lost_total`).
 * A decision the database could not make is 503 (or 500 for `internal`) with its code, such as `storage_full`,
 * and the SQLSTATE in the log; never a stack.
 *
 * What this does not prove: that the resources will not change between this decision and the provider call
 * (a provider-side version precondition closes that window), nor anything about policies outside the gate.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bindQueries, type Pool } from '../db/index.js';
import type { Config } from '../config/index.js';
import type { Logger } from '../core/log.js';
import type { Metrics } from '../core/metrics.js';
import { parseStrictJson, type JsonObject } from '../core/json.js';
import { MtlsJsonServer, readBody, sendJson as send } from '../transport/index.js';
import {
  AUTHORIZE_PATH,
  BINDING_FIELDS,
  authorizationRequest,
  decisionBody,
  parseAuthorizationRequest,
  type AuthorizationRequest,
} from '../protocol/index.js';
import { AccessChecks } from './access.js';
import { AuditWriter, type AuditEntry } from './audit.js';
import { gateLogger } from './core.js';
import { DecisionFailures } from './failures.js';
import { gateQueries } from './queries.js';
import { GateRegistry } from './registry.js';
import type { BoundResource, ResourceResolver } from './types.js';

const MAX_REQUEST_BYTES = 16 * 1024;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export interface AuthorizationServiceOptions {
  config: Config;
  pool: Pool;
  resolvers?: Readonly<Record<string, ResourceResolver>>;
  /** Server certificate and key, and the CA whose client certificates (the dispatchers') are accepted. */
  tls: { cert: string; key: string; ca: string | string[] };
  host?: string;
  /** Default 0: any free port. */
  port?: number;
  /** Host name in `url`; default localhost. */
  urlHost?: string;
  /** Where lost audit rows and database failures are logged; default: warnings and errors to stderr. */
  log?: Logger;
  /** Counts lost audit rows (`actionledger_audit_lost_total{action="authorize"}`). */
  metrics?: Pick<Metrics, 'auditLost'>;
}

type OperationRow = {
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
  arguments_json: JsonObject;
  role: string | null;
  approval_kind: 'auto' | 'proposal' | 'approval' | null;
  db_now: Date;
};

/**
 * The parts of the gate a decision reads: the tools and resolvers (never validators), the role, revocation
 * and kill-switch checks, the audit writer, and the failure coding. It never reserves, so it has no ledger.
 */
interface DecisionParts {
  readonly pool: Pool;
  readonly q: Readonly<typeof gateQueries>;
  readonly registry: GateRegistry;
  readonly access: AccessChecks;
  readonly audit: AuditWriter;
  readonly failures: DecisionFailures;
}

export class AuthorizationService extends MtlsJsonServer {
  readonly #parts: DecisionParts;
  readonly #options: AuthorizationServiceOptions;

  /** Throws `config_invalid` when a tool binds resources of a type with no registered resolver. */
  constructor(options: AuthorizationServiceOptions) {
    super(options.tls, options);
    this.#options = options;
    const q = bindQueries(gateQueries, options.config.schemaQuoted);
    const log = gateLogger(options.log);
    this.#parts = {
      pool: options.pool,
      q,
      registry: new GateRegistry(options.config, { resolvers: options.resolvers, withoutValidators: true }),
      access: new AccessChecks(options.config, q),
      audit: new AuditWriter({ config: options.config, pool: options.pool, log, metrics: options.metrics }),
      failures: new DecisionFailures(log),
    };
  }

  get authorizeUrl(): string {
    return `${this.url}${AUTHORIZE_PATH}`;
  }

  /** A decision the database could not make: its code (503 while it may pass), never a stack or a server message. */
  protected override answerFailure(err: unknown, res: ServerResponse): void {
    const coded = this.#parts.failures.failed(err, { action: 'authorize' });
    if (res.headersSent) res.destroy();
    else if (coded.code === 'internal') send(res, 500, { error: 'internal' });
    else send(res, coded.group === 'retryable' ? 503 : 500, { error: coded.code, message: coded.message });
  }

  protected override async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'https://x').pathname;
    if (req.method !== 'POST' || path !== AUTHORIZE_PATH) return send(res, 404, { error: 'not_found' });
    const body = await readBody(req, MAX_REQUEST_BYTES);
    if (body === null) return send(res, 413, { error: 'request_too_large' });
    let request: AuthorizationRequest | null = null;
    try {
      request = parseAuthorizationRequest(parseStrictJson(body, { requireObject: true }) as JsonObject);
    } catch {
      request = null;
    }
    if (request === null) return send(res, 400, { error: 'invalid_request' });
    const verdict = await this.decide(request);
    const entry: AuditEntry = {
      action: 'authorize',
      outcome: verdict.allow ? 'allow' : 'deny',
      context: { tenant_id: request.tenant_id, principal_id: request.principal_id },
      tool: request.tool_name,
      subjectId: request.operation_id,
      detail: { approval_id: request.approval_id, reason: verdict.reason },
    };
    if (verdict.reason === 'kill_switch') {
      // A kill switch is "not now", not "no": the operation waits in the queue (the claim leaves it there while
      // the switch is engaged) and is asked about again once it is lifted. Answered as no decision.
      await this.#parts.audit.after({ ...entry, outcome: 'deferred' });
      return send(res, 503, {
        error: 'tool_disabled',
        message: 'a kill switch covers this operation; ask again once it is lifted',
      });
    }
    if (!verdict.allow) {
      // A deny is answered even unaudited (it cannot be refused harder); auditAfter logs and counts the loss.
      await this.#parts.audit.after(entry);
    } else if ((await this.#parts.audit.tryWrite(entry)) !== null) {
      // Nothing is allowed unaudited: the allow becomes a refusal, itself audited (or logged and counted).
      await this.#parts.audit.after({ ...entry, outcome: 'audit_unavailable' });
      return send(res, 503, {
        error: 'audit_unavailable',
        message: 'the decision could not be written to the audit log, so it is refused',
      });
    }
    const ttlMs = this.#options.config.gate.decisionTtlS * 1000;
    const authorizedAt = verdict.now.getTime();
    const expiresAt = Math.min(authorizedAt + ttlMs, verdict.notAfter?.getTime() ?? Infinity);
    const decision = verdict.allow && expiresAt > authorizedAt ? 'allow' : 'deny';
    send(res, 200, decisionBody(request, decision, authorizedAt, Math.max(expiresAt, authorizedAt + 1)));
  }

  /** The decision for one request, with the reason (for the audit) and the latest instant it may hold until. */
  /** The original of a compensation operation whose original is `compensating` now; '' otherwise. */
  async #compensationOriginal(operationId: string): Promise<string> {
    const schema = this.#options.config.schemaQuoted;
    const { rows } = await this.#parts.pool.query<{ original_operation_id: string }>(
      `SELECT c.original_operation_id FROM ${schema}.compensations c
       JOIN ${schema}.operations o ON o.operation_id = c.original_operation_id
       WHERE c.compensation_operation_id = $1 AND o.status = 'compensating'`,
      [operationId],
    );
    return rows[0]?.original_operation_id ?? '';
  }

  /**
   * Whether every approver still holds the role they voted with: recorded, still one of the tool's approver
   * roles, and not revoked in the tenant. A vote whose role was never recorded (an approval from before roles
   * were) cannot be checked and counts as not held: its operation is denied, and a new approval is needed.
   */
  async #approversHold(
    tool: { approverRoles: ReadonlySet<string> },
    tenant: string,
    approvers: readonly string[],
    roles: readonly (string | null)[],
  ): Promise<boolean> {
    if (approvers.length === 0 || roles.length !== approvers.length) return false;
    for (const [i, approver] of approvers.entries()) {
      const role = roles[i];
      if (role === null || role === undefined || !tool.approverRoles.has(role)) return false;
      if (await this.#parts.access.roleRevoked(this.#parts.pool, tenant, approver, role)) return false;
    }
    return true;
  }

  async decide(request: AuthorizationRequest): Promise<{ allow: boolean; reason: string; now: Date; notAfter?: Date }> {
    const core = this.#parts;
    const now = new Date();
    if (!UUID.test(request.operation_id)) return { allow: false, reason: 'unknown_operation', now };
    const op = (await core.pool.query<OperationRow>(core.q.authorizeSelectOperation, [request.operation_id])).rows[0];
    if (op === undefined) return { allow: false, reason: 'unknown_operation', now };
    const ledgerView: AuthorizationRequest = authorizationRequest(op);
    const mismatched = BINDING_FIELDS.filter((f) => ledgerView[f] !== request[f]);
    if (mismatched.length > 0) return { allow: false, reason: `binding_mismatch:${mismatched.join(',')}`, now };
    if ((await core.access.killSwitch(core.pool, op.tenant_id, op.tool_name)) !== null)
      return { allow: false, reason: 'kill_switch', now };
    if (
      op.approval_kind === null &&
      op.current_approval_id === `compensation:${await this.#compensationOriginal(op.operation_id)}`
    ) {
      // A server-minted compensation (compensator/): allowed while its original is being compensated.
      return { allow: true, reason: 'compensation', now };
    }
    if (op.approval_kind === null || op.role === null) {
      return this.#options.config.gate.directReservations === 'allow'
        ? { allow: true, reason: 'direct_reservation', now }
        : { allow: false, reason: 'not_reserved_through_gate', now };
    }
    if (op.current_policy_version !== this.#options.config.gate.policyVersion)
      return { allow: false, reason: 'policy_version', now };
    const tool = core.registry.tool(op.tool_name);
    if (tool === undefined || !(await core.access.permitted(core.pool, tool, op.tenant_id, op.principal_id, op.role)))
      return { allow: false, reason: 'role_not_held', now };
    if (op.approval_kind === 'proposal') {
      const p = (
        await core.pool.query<{ status: string; operation_id: string | null }>(core.q.authorizeSelectProposal, [
          op.current_approval_id.replace(/^proposal:/, ''),
          op.tenant_id,
        ])
      ).rows[0];
      if (p === undefined || p.status !== 'executed' || p.operation_id !== op.operation_id)
        return { allow: false, reason: 'proposal', now };
      return { allow: true, reason: 'proposal', now };
    }
    if (op.approval_kind === 'approval') {
      if (!UUID.test(op.current_approval_id)) return { allow: false, reason: 'approval_not_found', now };
      type ApprovalRow = {
        status: string;
        operation_id: string | null;
        args_sha256: string;
        resources: BoundResource[];
        expires_at: Date;
        live: boolean;
        plan_version: string;
        current_plan_version: string;
        approvers: string[];
        approver_roles: (string | null)[];
      };
      const a = (
        await core.pool.query<ApprovalRow>(core.q.authorizeSelectApproval, [op.current_approval_id, op.tenant_id])
      ).rows[0];
      if (a === undefined) return { allow: false, reason: 'approval_not_found', now };
      if (!(a.status === 'approved' || (a.status === 'executed' && a.operation_id === op.operation_id)))
        return { allow: false, reason: `approval_${a.status}`, now };
      if (!a.live) return { allow: false, reason: 'approval_expired', now };
      // The plan the approver saw must still be the task's plan: a change after execution (which the gate's
      // invalidation no longer reaches: executed is final) stops dispatch here. The task is the requester's
      // (tenant, requester, task): another principal's plan of the same task id is not this one. No plan row
      // reads as '-', the plan an approval binds when its requester never reported one.
      if (a.plan_version !== a.current_plan_version) return { allow: false, reason: 'plan_version', now };
      if (a.args_sha256 !== op.canonical_args_sha256) return { allow: false, reason: 'approval_arguments', now };
      if (!(await this.#approversHold(tool, op.tenant_id, a.approvers, a.approver_roles)))
        return { allow: false, reason: 'approver_role_not_held', now };
      const current = await core.registry.resolveResources(core.pool, tool, op.tenant_id, op.arguments_json);
      const stale =
        current === null ||
        a.resources.length !== current.length ||
        a.resources.some((r, i) => current[i]?.version !== r.version || current[i]?.id !== r.id);
      if (stale) return { allow: false, reason: 'stale_resource', now };
      return { allow: true, reason: 'approval', now, notAfter: a.expires_at };
    }
    return { allow: true, reason: 'auto', now };
  }
}
