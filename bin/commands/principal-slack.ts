/**
 * `principal slack-link|slack-unlink`: which Slack user (of which workspace) is which principal in a tenant.
 * A click on an approval message counts as the linked principal's decision, under the gate's rules for that
 * principal; a click by an unlinked Slack user is refused. Both changes are audited (`principal` rows).
 */
import { ActionLedgerError } from '../../core/errors.js';
import { EXIT, JSON_ALWAYS, parseCommand, printJson, stringValues, usageError, type Command } from '../cli-util.js';
import { load } from './load.js';
import { actingAudit, actingRequest, actingTenant, BREAK_GLASS } from './acting.js';
import { withStore } from './principal-store.js';

const SLACK_ID = /^[A-Z0-9]{2,40}$/;

function slackCommand(action: 'link' | 'unlink'): Command {
  const link = action === 'link';
  return {
    name: `principal slack-${action}`,
    summary: link
      ? "link a Slack user to a principal holding a role in the tenant: their clicks on approval messages count as the principal's (audited)"
      : 'remove a Slack user link: their clicks are refused from now on (audited)',
    args: link ? 'PRINCIPAL_ID SLACK_USER_ID' : 'SLACK_USER_ID',
    options: {
      tenant: {
        type: 'string',
        value: 'T',
        required: true,
        description: "the tenant (with a token, it must be the token's)",
      },
      team: { type: 'string', value: 'SLACK_TEAM_ID', required: true, description: 'the Slack workspace (team) id' },
      'break-glass': BREAK_GLASS,
      json: JSON_ALWAYS,
    },
    examples: link
      ? ['actionledger principal slack-link alice U0123ABCD --tenant tenant-a --team T0123ABCD']
      : ['actionledger principal slack-unlink U0123ABCD --tenant tenant-a --team T0123ABCD'],
    exits: [EXIT.ok, EXIT.refused, EXIT.usage],
    async run(argv) {
      const parsed = parseCommand(this, argv, { positionals: true });
      if (typeof parsed === 'number') return parsed;
      const want = link ? 2 : 1;
      if (parsed.positionals.length !== want) return usageError(this, `expected ${this.args ?? ''}`);
      const principal = link ? (parsed.positionals[0] ?? '') : '';
      const slackUser = parsed.positionals[want - 1] ?? '';
      const v = stringValues(parsed.values);
      const team = v.team ?? '';
      if (!SLACK_ID.test(slackUser)) return usageError(this, 'SLACK_USER_ID looks like U0123ABCD');
      if (!SLACK_ID.test(team)) return usageError(this, '--team looks like T0123ABCD');
      const req = actingRequest(this, parsed.values);
      if (typeof req === 'number') return req;
      return withStore(req, async (store, acting, rt) => {
        const tenant = actingTenant(acting, v.tenant);
        const [{ AuditWriter }, notifier] = await Promise.all([load.gate(), import('../../notifier/index.js')]);
        const audit =
          (await actingAudit(rt, acting)) ?? new AuditWriter({ config: rt.config, pool: rt.pool, log: rt.log });
        const target = { tenant_id: tenant, team_id: team, slack_user_id: slackUser, actor: acting.actor };
        if (!link) {
          const removed = await notifier.unlinkSlackUser(rt.config, rt.pool, audit, target);
          printJson({ ok: true, tenant_id: tenant, slack_team_id: team, slack_user_id: slackUser, removed });
          return EXIT.ok;
        }
        if ((await store.rolesHeld(principal, tenant)).length === 0)
          throw new ActionLedgerError('not_found', `no principal ${principal} holds a role in ${tenant}`);
        await notifier.linkSlackUser(rt.config, rt.pool, audit, { ...target, principal_id: principal });
        printJson({
          ok: true,
          principal_id: principal,
          tenant_id: tenant,
          slack_team_id: team,
          slack_user_id: slackUser,
        });
        return EXIT.ok;
      });
    },
  };
}

export const slackLink = slackCommand('link');
export const slackUnlink = slackCommand('unlink');
