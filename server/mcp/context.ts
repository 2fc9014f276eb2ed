/**
 * The trusted context of an MCP request. It comes from two places the model cannot write: the authenticated
 * caller (tenant, principal, roles: the bearer token of the HTTP request, or `ACTIONLEDGER_TOKEN` for stdio,
 * authenticated again on every request so an expired token or a revoked role stops the next call) and the
 * host's request metadata (`params._meta`, keys under {@link META_PREFIX}), which the host sets from its own
 * session state. A tool's arguments never contribute to it: they are checked against the tool's strict schema,
 * where an identity field is an unknown property (`invalid_arguments`).
 */
import type { Config } from '../../config/index.js';
import { ActionLedgerError } from '../../core/errors.js';
import { identifierProblem } from '../../core/identifier.js';
import type { GateContext } from '../../gate/index.js';
import type { Authenticated } from '../../principals/index.js';

/** The prefix of every metadata key this server reads (`_meta["actionledger/task_id"]`, ...). */
export const META_PREFIX = 'actionledger/';

/** The metadata keys, their meaning, and whether a tool call needs them (for docs and errors). */
export const META_KEYS = {
  task_id: 'the task the step belongs to (required on tools/call)',
  workflow_step_id: 'the step: tenant, principal, task and step are the operation (required on tools/call)',
  plan_version:
    "the current plan version of this principal's task (a new one invalidates its approvals bound to the old)",
  conversation_id: 'without user: the conversation (per-conversation caps count here); default: the task',
  turn_id:
    'without user: the user turn the call is made in (a confirmation must come in a later one); default: the request, except when confirming a proposal',
  role: 'without user: the role to act with, one the caller holds (optional when it holds one)',
  user: 'the end user a service acts for (capability act_for_users): principal_id, role, account_id, conversation_id, turn_id, each required (no defaults inside it)',
} as const;

const USER_FIELDS = ['principal_id', 'role', 'account_id', 'conversation_id', 'turn_id'] as const;

/** The `_meta` of a request, as sent (an absent or non-object one is empty). */
export type Meta = Record<string, unknown> | undefined;

type User = Record<(typeof USER_FIELDS)[number], string>;

/** One thing wrong with the host's metadata: the field (`_meta.actionledger/...`), a short code, the sentence. */
interface MetaProblem {
  field: string;
  problem: string;
  says: string;
}

function metaValue(meta: Meta, key: keyof typeof META_KEYS): unknown {
  if (meta === undefined || meta === null || typeof meta !== 'object') return undefined;
  return Object.hasOwn(meta, META_PREFIX + key) ? meta[META_PREFIX + key] : undefined;
}

/**
 * Reads the host's metadata and collects everything wrong with it, so that a host told of one missing field
 * is told of all of them at once: {@link MetaReader.check} throws one `invalid_context` naming every field.
 */
class MetaReader {
  readonly #meta: Meta;
  readonly #problems: MetaProblem[] = [];

  constructor(meta: Meta) {
    this.#meta = meta;
  }

  #add(field: string, problem: string, says: string): undefined {
    this.#problems.push({ field, problem, says });
    return undefined;
  }

  /** An identifier's NFC form, or undefined (a problem noted) when the value is none. */
  #identifier(field: string, v: unknown): string | undefined {
    if (v === undefined) return this.#add(field, 'required', `${field} is missing`);
    if (typeof v !== 'string') return this.#add(field, 'type', `${field} must be a string`);
    const problem = identifierProblem(v);
    return problem === null ? v.normalize('NFC') : this.#add(field, problem, `${field} ${problem}`);
  }

  /** A top-level key's identifier; undefined when absent (a problem when `required`) or invalid. */
  string(key: keyof typeof META_KEYS, required: boolean): string | undefined {
    const v = metaValue(this.#meta, key);
    if (v === undefined && !required) return undefined;
    return this.#identifier(`_meta.${META_PREFIX}${key}`, v);
  }

  /** The end user, every field required; undefined when absent or (problems noted) invalid. */
  user(): User | undefined {
    const u = metaValue(this.#meta, 'user');
    if (u === undefined) return undefined;
    const field = `_meta.${META_PREFIX}user`;
    if (u === null || typeof u !== 'object' || Array.isArray(u))
      return this.#add(field, 'type', `${field} must be an object`);
    const extra = Object.keys(u).filter((k) => !(USER_FIELDS as readonly string[]).includes(k));
    if (extra.length > 0) this.#add(field, 'additionalProperties', `${field} has unknown fields: ${extra.join(', ')}`);
    const out: Partial<User> = {};
    for (const k of USER_FIELDS) out[k] = this.#identifier(`${field}.${k}`, (u as Record<string, unknown>)[k]);
    return USER_FIELDS.every((k) => out[k] !== undefined) && extra.length === 0 ? (out as User) : undefined;
  }

  /** Notes the role as missing: the caller holds several and the host named none. */
  roleMissing(held: readonly string[]): void {
    const field = `_meta.${META_PREFIX}role`;
    this.#add(field, 'required', `${field} is missing: you hold several roles here (${held.join(', ')})`);
  }

  /**
   * Throws `invalid_context` when anything was wrong: the message lists every problem; `details.fields` every
   * field, `details.problems` each with its code; `details.field` and `details.problem` are the first's.
   */
  check(): void {
    const first = this.#problems[0];
    if (first === undefined) return;
    const all = this.#problems;
    throw new ActionLedgerError(
      'invalid_context',
      `the host's _meta is not a usable trusted context (${all.length} ${all.length === 1 ? 'problem' : 'problems'}): ${all.map((p) => p.says).join('; ')}`,
      {
        details: {
          field: first.field,
          problem: first.problem,
          fields: all.map((p) => p.field),
          problems: all.map(({ field, problem }) => ({ field, problem })),
        },
      },
    );
  }
}

/** Throws `permission_denied` unless one of the caller's roles is granted `act_for_users`. */
function requireActForUsers(config: Config, caller: Authenticated): void {
  const granted = config.api.permissions.act_for_users;
  if (!caller.roles.some((r) => granted.has(r)))
    throw new ActionLedgerError('permission_denied', 'none of your roles may act for users', {
      details: { capability: 'act_for_users' },
    });
}

/**
 * The role the caller acts with itself: the one named (held here), or its only one. The host's metadata is
 * checked already (a missing role where several are held is one of its problems, {@link ownRoleMeta}).
 */
function ownRole(caller: Authenticated, named: string | undefined): string {
  if (named !== undefined) {
    if (!caller.roles.includes(named))
      throw new ActionLedgerError('permission_denied', `you do not hold the role ${JSON.stringify(named)} here`, {
        details: { role: named },
      });
    return named;
  }
  if (caller.roles.length === 0)
    throw new ActionLedgerError('permission_denied', 'you hold no role in this tenant', { details: { held: [] } });
  return caller.roles[0] as string;
}

/** The role named in the metadata, noting it missing when the caller holds several and none is named. */
function ownRoleMeta(reader: MetaReader, caller: Authenticated, meta: Meta): string | undefined {
  if (metaValue(meta, 'role') === undefined && caller.roles.length > 1) reader.roleMissing(caller.roles);
  return reader.string('role', false);
}

/**
 * The roles whose tools a `tools/list` shows: the end user's (with `user` in `_meta`, capability
 * act_for_users), the named one, or every role the caller holds. Throws `permission_denied` / `invalid_context`.
 */
export function listingRoles(config: Config, caller: Authenticated, meta: Meta): string[] {
  const reader = new MetaReader(meta);
  if (metaValue(meta, 'user') !== undefined) {
    const user = reader.user();
    reader.check();
    requireActForUsers(config, caller);
    return [(user as User).role];
  }
  const named = reader.string('role', false);
  reader.check();
  return named === undefined ? [...caller.roles] : [ownRole(caller, named)];
}

/**
 * The gate context of a tool call: the tenant is the caller's; with `user` (act_for_users) the principal,
 * role, account, conversation and turn are the user's, each required; otherwise the caller acts as itself (its
 * account is its principal id; the conversation defaults to the task, the turn to `traceId`). With `hostTurn`
 * the turn must come from the host (`turn_id`, or the user's): a confirmation must not default to a turn the
 * model's own request made up. Throws `invalid_context` naming every missing or malformed metadata field at
 * once, then `permission_denied` (a role not held, `user` without act_for_users).
 */
export function callContext(
  config: Config,
  caller: Authenticated,
  meta: Meta,
  traceId: string,
  options: { hostTurn?: boolean } = {},
): GateContext {
  const reader = new MetaReader(meta);
  const task = reader.string('task_id', true);
  const step = reader.string('workflow_step_id', true);
  const plan = reader.string('plan_version', false);
  if (metaValue(meta, 'user') !== undefined) {
    const user = reader.user();
    reader.check();
    requireActForUsers(config, caller);
    return { ...base(caller, traceId, task, step, plan), ...(user as User) };
  }
  const named = ownRoleMeta(reader, caller, meta);
  const conversation = reader.string('conversation_id', false);
  const turn = reader.string('turn_id', options.hostTurn === true);
  reader.check();
  return {
    ...base(caller, traceId, task, step, plan),
    principal_id: caller.principal_id,
    role: ownRole(caller, named),
    account_id: caller.principal_id,
    conversation_id: conversation ?? (task as string),
    turn_id: turn ?? traceId,
  };
}

/** The part of a gate context every call has (the metadata checked: task and step are set). */
function base(
  caller: Authenticated,
  traceId: string,
  task: string | undefined,
  step: string | undefined,
  plan: string | undefined,
): Pick<GateContext, 'tenant_id' | 'trace_id' | 'task_id' | 'workflow_step_id' | 'plan_version'> {
  return {
    tenant_id: caller.tenant_id,
    trace_id: traceId,
    task_id: task as string,
    workflow_step_id: step as string,
    ...(plan === undefined ? {} : { plan_version: plan }),
  };
}

/** The principal a read acts as: the end user's (with `user`, act_for_users) or the caller's own. */
export function actingPrincipal(config: Config, caller: Authenticated, meta: Meta): string {
  if (metaValue(meta, 'user') === undefined) return caller.principal_id;
  const reader = new MetaReader(meta);
  const user = reader.user();
  reader.check();
  requireActForUsers(config, caller);
  return (user as User).principal_id;
}
