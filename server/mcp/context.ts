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
import { identifier } from '../../core/identifier.js';
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
  conversation_id: 'the conversation (per-conversation caps count here); default: the task',
  turn_id:
    'the user turn the call is made in (a confirmation must come in a later one); default: the request, except when confirming a proposal',
  role: 'the role to act with, one the caller holds (optional when it holds one)',
  user: 'the end user a service acts for (capability act_for_users): principal_id, role, account_id, conversation_id, turn_id',
} as const;

const USER_FIELDS = ['principal_id', 'role', 'account_id', 'conversation_id', 'turn_id'] as const;

/** The `_meta` of a request, as sent (an absent or non-object one is empty). */
export type Meta = Record<string, unknown> | undefined;

function metaValue(meta: Meta, key: keyof typeof META_KEYS): unknown {
  if (meta === undefined || meta === null || typeof meta !== 'object') return undefined;
  return Object.hasOwn(meta, META_PREFIX + key) ? meta[META_PREFIX + key] : undefined;
}

function metaString(meta: Meta, key: keyof typeof META_KEYS, required: boolean): string | undefined {
  const v = metaValue(meta, key);
  if (v === undefined) {
    if (!required) return undefined;
    throw new ActionLedgerError('invalid_context', `the host must set _meta["${META_PREFIX}${key}"] on this request`, {
      details: { field: `_meta.${META_PREFIX}${key}`, problem: 'required' },
    });
  }
  if (typeof v !== 'string')
    throw new ActionLedgerError('invalid_context', `_meta["${META_PREFIX}${key}"] must be a string`, {
      details: { field: `_meta.${META_PREFIX}${key}`, problem: 'type' },
    });
  return identifier(`_meta.${META_PREFIX}${key}`, v);
}

/** The end user named in `_meta`, checked field by field; undefined when absent. */
function metaUser(meta: Meta): Record<(typeof USER_FIELDS)[number], string> | undefined {
  const u = metaValue(meta, 'user');
  if (u === undefined) return undefined;
  const field = `_meta.${META_PREFIX}user`;
  if (u === null || typeof u !== 'object' || Array.isArray(u))
    throw new ActionLedgerError('invalid_context', `${field} must be an object`, { details: { field } });
  const extra = Object.keys(u).filter((k) => !(USER_FIELDS as readonly string[]).includes(k));
  if (extra.length > 0)
    throw new ActionLedgerError('invalid_context', `${field} has unknown fields: ${extra.join(', ')}`, {
      details: { field, problem: 'additionalProperties' },
    });
  const out: Partial<Record<(typeof USER_FIELDS)[number], string>> = {};
  for (const k of USER_FIELDS) {
    const v = (u as Record<string, unknown>)[k];
    if (typeof v !== 'string')
      throw new ActionLedgerError('invalid_context', `${field}.${k} must be a string`, {
        details: { field: `${field}.${k}`, problem: v === undefined ? 'required' : 'type' },
      });
    out[k] = identifier(`${field}.${k}`, v);
  }
  return out as Record<(typeof USER_FIELDS)[number], string>;
}

/** Throws `permission_denied` unless one of the caller's roles is granted `act_for_users`. */
function requireActForUsers(config: Config, caller: Authenticated): void {
  const granted = config.api.permissions.act_for_users;
  if (!caller.roles.some((r) => granted.has(r)))
    throw new ActionLedgerError('permission_denied', 'none of your roles may act for users', {
      details: { capability: 'act_for_users' },
    });
}

/** The role the caller acts with itself: the one named (held here), or its only one. */
function ownRole(caller: Authenticated, named: string | undefined): string {
  if (named !== undefined) {
    if (!caller.roles.includes(named))
      throw new ActionLedgerError('permission_denied', `you do not hold the role ${JSON.stringify(named)} here`, {
        details: { role: named },
      });
    return named;
  }
  if (caller.roles.length === 1) return caller.roles[0] as string;
  if (caller.roles.length === 0)
    throw new ActionLedgerError('permission_denied', 'you hold no role in this tenant', { details: { held: [] } });
  throw new ActionLedgerError(
    'invalid_context',
    `you hold several roles here: the host names one in _meta["${META_PREFIX}role"]`,
    { details: { field: `_meta.${META_PREFIX}role`, held: caller.roles } },
  );
}

/**
 * The roles whose tools a `tools/list` shows: the end user's (with `user` in `_meta`, capability
 * act_for_users), the named one, or every role the caller holds. Throws `permission_denied` / `invalid_context`.
 */
export function listingRoles(config: Config, caller: Authenticated, meta: Meta): string[] {
  const user = metaUser(meta);
  if (user !== undefined) {
    requireActForUsers(config, caller);
    return [user.role];
  }
  const named = metaString(meta, 'role', false);
  return named === undefined ? [...caller.roles] : [ownRole(caller, named)];
}

/**
 * The gate context of a tool call: the tenant is the caller's; with `user` (act_for_users) the principal,
 * role, account, conversation and turn are the user's; otherwise the caller acts as itself (its account is its
 * principal id; the conversation defaults to the task, the turn to `traceId`). With `hostTurn` the turn must
 * come from the host (`turn_id`, or the user's): a confirmation must not default to a turn the model's own
 * request made up. Throws `invalid_context` (missing or malformed metadata), `permission_denied` (a role not
 * held, `user` without act_for_users).
 */
export function callContext(
  config: Config,
  caller: Authenticated,
  meta: Meta,
  traceId: string,
  options: { hostTurn?: boolean } = {},
): GateContext {
  const task = metaString(meta, 'task_id', true) as string;
  const plan = metaString(meta, 'plan_version', false);
  const base = {
    tenant_id: caller.tenant_id,
    trace_id: traceId,
    task_id: task,
    workflow_step_id: metaString(meta, 'workflow_step_id', true) as string,
    ...(plan === undefined ? {} : { plan_version: plan }),
  };
  const user = metaUser(meta);
  if (user !== undefined) {
    requireActForUsers(config, caller);
    return { ...base, ...user };
  }
  return {
    ...base,
    principal_id: caller.principal_id,
    role: ownRole(caller, metaString(meta, 'role', false)),
    account_id: caller.principal_id,
    conversation_id: metaString(meta, 'conversation_id', false) ?? task,
    turn_id: metaString(meta, 'turn_id', options.hostTurn === true) ?? traceId,
  };
}

/** The principal a read acts as: the end user's (with `user`, act_for_users) or the caller's own. */
export function actingPrincipal(config: Config, caller: Authenticated, meta: Meta): string {
  const user = metaUser(meta);
  if (user === undefined) return caller.principal_id;
  requireActForUsers(config, caller);
  return user.principal_id;
}
