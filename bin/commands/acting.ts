/**
 * Who is acting, for the commands that change something on a person's say-so: approvals, review actions, kill
 * switches, role revocations, principals and tokens. The operator running them holds the database credentials;
 * what they do is recorded under a real identity:
 *
 * - with `ACTIONLEDGER_TOKEN` in the environment, the token is authenticated against the database (expired,
 *   revoked or unknown: `unauthenticated`), and the principal, its tenant and its roles come from it, never
 *   from flags: an `--approver`, `--actor` or `--tenant` that disagrees is refused (`invalid_request`);
 * - without one, the operator names themself with `--break-glass NAME` (refused `unauthenticated` when
 *   absent): the actor is `break-glass:NAME`, and every audit row written through a gate or the principal
 *   store says `break_glass: true`. This is the escape hatch for when the API or the store is unavailable.
 */
import type { ApiCapability } from '../../config/index.js';
import type { Config } from '../../config/index.js';
import type { Queryable } from '../../db/index.js';
import { ActionLedgerError } from '../../core/errors.js';
import { identifierProblem } from '../../core/identifier.js';
import type { Runtime } from '../../runtime/index.js';
import type { AuditEntry, AuditWriter } from '../../gate/index.js';
import { printRefusal, usageError, type Command, type OptionSpec, type Parsed } from '../cli-util.js';
import { load } from './load.js';

/** The environment variable holding the API token the command line acts with. */
export const TOKEN_ENV = 'ACTIONLEDGER_TOKEN';

/** The actor recorded for a break-glass operator: this prefix and the name given. */
export const BREAK_GLASS_PREFIX = 'break-glass:';

export const BREAK_GLASS: OptionSpec = {
  type: 'string',
  value: 'NAME',
  description: `without ${TOKEN_ENV}: act as this named operator (audited as break-glass:NAME, break_glass: true)`,
  default: `none: ${TOKEN_ENV} says who acts`,
};

/** Who acts, known before the database is opened: a token still to authenticate, or a break-glass operator. */
export type ActingRequest = { token: string } | { breakGlass: string };

/** Who acts, established. */
export interface Acting {
  /** What is recorded: the token's principal, or `break-glass:NAME`. */
  actor: string;
  /** The token's tenant; null for break-glass (the flags name the tenant). */
  tenant: string | null;
  /** The roles the token's principal holds in its tenant; none for break-glass. */
  roles: readonly string[];
  breakGlass: boolean;
}

/**
 * Reads who acts from the environment and `--break-glass`, before anything runs. With a token, `--break-glass`
 * is refused (`invalid_request`); without one, `--break-glass` is needed (`unauthenticated`), and so are the
 * options the token would have supplied (`needs`: a usage error naming them). Returns the exit code of the
 * refusal or usage error it printed.
 */
export function actingRequest(
  cmd: Command,
  values: Parsed['values'],
  needs: readonly string[] = [],
): ActingRequest | number {
  const token = process.env[TOKEN_ENV];
  const named = values['break-glass'];
  if (token !== undefined && token !== '') {
    if (named !== undefined)
      return printRefusal(
        new ActionLedgerError(
          'invalid_request',
          `--break-glass is for when there is no token: ${TOKEN_ENV} is set, so the token acts (unset it to break glass)`,
          { details: { field: 'break-glass' } },
        ),
      );
    return { token };
  }
  if (typeof named !== 'string')
    return printRefusal(
      new ActionLedgerError(
        'unauthenticated',
        `say who acts: set ${TOKEN_ENV} to an API token (actionledger token create), or, as the operator holding the database credentials, name yourself with --break-glass NAME (audited as break-glass:NAME)`,
        { details: { reason: 'missing' } },
      ),
    );
  const problem = identifierProblem(named);
  if (problem !== null) return usageError(cmd, `--break-glass ${problem}`);
  const missing = needs.filter((n) => values[n] === undefined || values[n] === '').map((n) => `--${n}`);
  if (missing.length > 0)
    return usageError(cmd, `missing ${missing.join(', ')} (with --break-glass; a token supplies it)`);
  return { breakGlass: named.normalize('NFC') };
}

/** Authenticates the token (`unauthenticated` when it is expired, revoked or unknown), or takes the break-glass name. */
export async function authenticateActing(rt: Runtime, req: ActingRequest): Promise<Acting> {
  if ('breakGlass' in req)
    return { actor: `${BREAK_GLASS_PREFIX}${req.breakGlass}`, tenant: null, roles: [], breakGlass: true };
  const { PrincipalStore } = await load.principals();
  const who = await new PrincipalStore(rt.config, rt.pool).authenticate(req.token);
  return { actor: who.principal_id, tenant: who.tenant_id, roles: who.roles, breakGlass: false };
}

function disagrees(flag: string, given: string, actual: string): ActionLedgerError {
  return new ActionLedgerError(
    'invalid_request',
    `--${flag} ${JSON.stringify(given)} is not who acts: ${JSON.stringify(actual)} (${TOKEN_ENV} or --break-glass says who acts; leave --${flag} out or make it agree)`,
    { details: { field: flag } },
  );
}

/** The actor; a flag (`--approver`, `--actor`) given as a check must name it. Throws `invalid_request`. */
export function actingActor(acting: Acting, flag: string, given: string | undefined): string {
  if (given !== undefined && given !== acting.actor) throw disagrees(flag, given, acting.actor);
  return acting.actor;
}

/**
 * The tenant acted in: the token's (a `--tenant` that differs is refused, `invalid_request`), or for break-glass
 * the one named (checked present by {@link actingRequest}).
 */
export function actingTenant(acting: Acting, given: string | undefined, flag = 'tenant'): string {
  if (acting.tenant === null) return given ?? '';
  if (given !== undefined && given !== acting.tenant)
    throw new ActionLedgerError(
      'invalid_request',
      `--${flag} ${JSON.stringify(given)} is not the token's tenant ${JSON.stringify(acting.tenant)}: a token acts in its own tenant only`,
      { details: { field: flag } },
    );
  return acting.tenant;
}

/**
 * With a token, one of its roles must be granted the capability (`api.permissions`), as for the same action
 * through the API: the command line does not let a token do more. Break-glass is not checked. Throws
 * `permission_denied`.
 */
export function requireCapability(config: Config, acting: Acting, capability: ApiCapability): void {
  if (acting.breakGlass) return;
  const granted = config.api.permissions[capability];
  if (!acting.roles.some((r) => granted.has(r)))
    throw new ActionLedgerError('permission_denied', `none of your roles may ${capability.replaceAll('_', ' ')}`, {
      details: { capability },
    });
}

/**
 * The role an approver decides with. With a token: the one named (it must hold it in the token's tenant:
 * `permission_denied`), or the only one it holds (`invalid_request` when it holds several and named none).
 * Break-glass: the one named, which must be an approver role of a configured tool (`invalid_request`).
 */
export function approverRole(config: Config, acting: Acting, named: string | undefined): string {
  if (acting.breakGlass) {
    const roles = new Set([...config.gate.tools.values()].flatMap((t) => [...t.approverRoles]));
    if (named === undefined || !roles.has(named))
      throw new ActionLedgerError(
        'invalid_request',
        `--role must be an approver role of a configured tool (${[...roles].sort().join(', ') || 'none configured'})`,
        { details: { field: 'role', allowed: [...roles].sort() } },
      );
    return named;
  }
  if (named !== undefined) {
    if (!acting.roles.includes(named))
      throw new ActionLedgerError('permission_denied', `you do not hold the role ${JSON.stringify(named)} here`, {
        details: { role: named },
      });
    return named;
  }
  if (acting.roles.length === 1) return acting.roles[0] as string;
  throw new ActionLedgerError(
    'invalid_request',
    acting.roles.length === 0 ? 'you hold no role in this tenant' : 'you hold several roles here: name one with --role',
    { details: { field: 'role', held: acting.roles } },
  );
}

/** For break-glass, an audit writer that adds `break_glass: true` to every row it writes; otherwise none. */
export async function actingAudit(rt: Runtime, acting: Acting): Promise<AuditWriter | undefined> {
  if (!acting.breakGlass) return undefined;
  const { AuditWriter } = await load.gate();
  class BreakGlassAudit extends AuditWriter {
    override write(db: Queryable, e: AuditEntry): Promise<void> {
      return super.write(db, { ...e, detail: { ...e.detail, break_glass: true } });
    }
  }
  return new BreakGlassAudit({ config: rt.config, pool: rt.pool });
}
